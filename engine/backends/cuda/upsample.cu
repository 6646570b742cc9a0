// Nearest 2x upsampling (each thread reads one unit, up to 16 bytes, of an input pixel once and
// writes it to the four output pixels it covers) and the interleaving of an upsampling
// convolution's four output phases (engine/models/vae/upsample_conv.h).
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
    const NhwcIndex in = nhwc_index(i, h, w, units);
    const U v = x[i];
    U* o = y + ((in.b * 2 * h + 2 * in.y) * 2 * w + 2 * in.x) * units + in.u;
    o[0] = v;
    o[units] = v;
    o[row] = v;
    o[row + units] = v;
  }
}

// One thread a unit (up to 16 bytes) of an output pixel's c channels: the writes of a warp are
// consecutive, its reads consecutive within each output pixel's phase.
template <typename U>
__global__ void interleave_phases2x_kernel(const U* __restrict__ z, U* __restrict__ y, int64_t n,
                                           int64_t h, int64_t w, int64_t units) {
  const int64_t wo = 2 * w, total = n * 2 * h * wo * units;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const NhwcIndex o = nhwc_index(i, 2 * h, wo, units);
    const int64_t a = o.y & 1, q = o.x & 1;
    const int64_t zy = (o.y >> 1) + a, zx = (o.x >> 1) + q;
    y[i] = z[((o.b * (h + 1) + zy) * (w + 1) + zx) * 4 * units + (2 * a + q) * units + o.u];
  }
}

}  // namespace

Status launch_interleave_phases2x(const void* z, void* y, int64_t n, int64_t h, int64_t w,
                                  int64_t c, size_t elem_size, const Launch& l) {
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0) return ok_status();
  const int64_t bpp = c * static_cast<int64_t>(elem_size);  // one phase of one pixel
  const size_t width = access_width(
      {static_cast<uint64_t>(bpp), reinterpret_cast<uint64_t>(z), reinterpret_cast<uint64_t>(y)});
  return with_unit(width, [&](auto unit) -> Status {
    using U = decltype(unit);
    const int64_t units = bpp / static_cast<int64_t>(sizeof(U));
    interleave_phases2x_kernel<U><<<grid_for(n * 4 * h * w * units, 256, l), 256, 0, l.stream>>>(
        static_cast<const U*>(z), static_cast<U*>(y), n, h, w, units);
    LATENT_CUDA_CHECK_LAUNCH("interleave_phases2x");
    return ok_status();
  });
}

Status launch_upsample_nearest2x(const void* x, void* y, int64_t n, int64_t h, int64_t w, int64_t c,
                                 size_t elem_size, const Launch& l) {
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0) return ok_status();
  const int64_t bpp = c * static_cast<int64_t>(elem_size);
  const size_t width = access_width(
      {static_cast<uint64_t>(bpp), reinterpret_cast<uint64_t>(x), reinterpret_cast<uint64_t>(y)});
  return with_unit(width, [&](auto unit) -> Status {
    using U = decltype(unit);
    const int64_t units = bpp / static_cast<int64_t>(sizeof(U));
    upsample2x_kernel<U><<<grid_for(n * h * w * units, 256, l), 256, 0, l.stream>>>(
        static_cast<const U*>(x), static_cast<U*>(y), n, h, w, units);
    LATENT_CUDA_CHECK_LAUNCH("upsample_nearest2x");
    return ok_status();
  });
}

}  // namespace latent::cuda
