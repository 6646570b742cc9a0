// Each thread reads one unit (up to 16 bytes) of an input pixel once and writes it to the four
// output pixels it covers.
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/elementwise.cuh"
#include "engine/backends/cuda/upsample.cuh"

namespace latent::cuda {
namespace {

template <typename U>
__global__ void upsample2x_kernel(const U* __restrict__ x, U* __restrict__ y, int64_t n, int64_t h,
                                  int64_t w, int64_t units) {
  const int64_t total = n * h * w * units;
  const int64_t row = 2 * w * units;  // one output row
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i / units;
    const int64_t u = i - rest * units;
    const int64_t ix = rest % w;
    rest /= w;
    const int64_t iy = rest % h;
    const int64_t b = rest / h;
    const U v = x[i];
    U* o = y + ((b * 2 * h + 2 * iy) * 2 * w + 2 * ix) * units + u;
    o[0] = v;
    o[units] = v;
    o[row] = v;
    o[row + units] = v;
  }
}

template <typename U>
Status run(const void* x, void* y, int64_t n, int64_t h, int64_t w, int64_t bytes_per_pixel,
           const Launch& l) {
  const int64_t units = bytes_per_pixel / static_cast<int64_t>(sizeof(U));
  upsample2x_kernel<U><<<grid_for(n * h * w * units, 256, l), 256, 0, l.stream>>>(
      static_cast<const U*>(x), static_cast<U*>(y), n, h, w, units);
  LATENT_CUDA_CHECK_LAUNCH("upsample_nearest2x");
  return ok_status();
}

}  // namespace

Status launch_upsample_nearest2x(const void* x, void* y, int64_t n, int64_t h, int64_t w, int64_t c,
                                 size_t elem_size, const Launch& l) {
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0) return ok_status();
  const int64_t bpp = c * static_cast<int64_t>(elem_size);
  switch (access_width(
      {static_cast<uint64_t>(bpp), reinterpret_cast<uint64_t>(x), reinterpret_cast<uint64_t>(y)})) {
    case 16:
      return run<uint4>(x, y, n, h, w, bpp, l);
    case 8:
      return run<uint2>(x, y, n, h, w, bpp, l);
    case 4:
      return run<uint32_t>(x, y, n, h, w, bpp, l);
    case 2:
      return run<uint16_t>(x, y, n, h, w, bpp, l);
    default:
      return run<uint8_t>(x, y, n, h, w, bpp, l);
  }
}

}  // namespace latent::cuda
