#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/convert.cuh"

namespace latent::cuda {
namespace {

template <typename TI, typename TO>
__global__ void convert_kernel(const TI* __restrict__ src, TO* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = from_f32<TO>(to_f32(src[i]));
}

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

// One 32 x 32 tile per block through shared memory, so both the read and the write are
// coalesced. Tiles are numbered along x (rows * cols can exceed the 65535 limit of grid y).
template <typename TI, typename TO>
__global__ void transpose_kernel(const TI* __restrict__ src, TO* __restrict__ dst, int64_t rows,
                                 int64_t cols, int64_t col_tiles) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t b = blockIdx.y;
  const int64_t r0 = (blockIdx.x / col_tiles) * kTile;
  const int64_t c0 = (blockIdx.x % col_tiles) * kTile;
  const TI* s = src + b * rows * cols;
  TO* d = dst + b * rows * cols;
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = to_f32(s[r * cols + c]);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) d[c * rows + r] = from_f32<TO>(tile[threadIdx.x][i]);
  }
}

// A transpose with one short side (<= kShort: the 3 channels of RGB frames between a clip's
// planes and channels-last frames): one thread per element of the long side, looping over the
// short one, so the long side's reads or writes stay coalesced (the 32 x 32 tiles above would
// leave all but a few lanes idle: 0.25 ms for 4 frames of 720p RGB).
constexpr int64_t kShort = 8;

template <typename TI, typename TO>
__global__ void transpose_short_kernel(const TI* __restrict__ src, TO* __restrict__ dst,
                                       int64_t batch, int64_t rows, int64_t cols) {
  const bool short_cols = cols <= kShort;
  const int64_t longer = short_cols ? rows : cols, shorter = short_cols ? cols : rows;
  const int64_t n = batch * longer;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / longer, l = i % longer;
    const TI* s = src + b * rows * cols;
    TO* d = dst + b * rows * cols;
    for (int64_t k = 0; k < shorter; ++k) {
      // element (r, c) of s goes to (c, r) of d
      const int64_t r = short_cols ? l : k, c = short_cols ? k : l;
      d[c * rows + r] = from_f32<TO>(to_f32(s[r * cols + c]));
    }
  }
}

template <typename TI, typename TO>
Status convert_typed(const void* src, void* dst, int64_t n, const Launch& l) {
  if (n <= 0) return ok_status();
  convert_kernel<TI, TO><<<grid_for(n, 256, l), 256, 0, l.stream>>>(static_cast<const TI*>(src),
                                                                    static_cast<TO*>(dst), n);
  LATENT_CUDA_CHECK_LAUNCH("convert_kernel");
  return ok_status();
}

template <typename TI, typename TO>
Status transpose_typed(const void* src, void* dst, int64_t batch, int64_t rows, int64_t cols,
                       const Launch& l) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return ok_status();
  if (cols <= kShort || rows <= kShort) {
    const int64_t longer = cols <= kShort ? rows : cols;
    transpose_short_kernel<TI, TO><<<grid_for(batch * longer, 256, l), 256, 0, l.stream>>>(
        static_cast<const TI*>(src), static_cast<TO*>(dst), batch, rows, cols);
    LATENT_CUDA_CHECK_LAUNCH("transpose_short_kernel");
    return ok_status();
  }
  if (batch > 65535) return Status::errorf("transpose: batch ", batch, " is over 65535");
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  if (row_tiles * col_tiles > 0x7fffffff)
    return Status::errorf("transpose: ", rows, " x ", cols, " is too large");
  dim3 grid(static_cast<unsigned>(row_tiles * col_tiles), static_cast<unsigned>(batch));
  transpose_kernel<TI, TO><<<grid, dim3(kTile, kRowsPerPass), 0, l.stream>>>(
      static_cast<const TI*>(src), static_cast<TO*>(dst), rows, cols, col_tiles);
  LATENT_CUDA_CHECK_LAUNCH("transpose_kernel");
  return ok_status();
}

}  // namespace

Status launch_convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n,
                      const Launch& l) {
  return LATENT_DISPATCH_DTYPE(src_type, TI, [&] {
    return LATENT_DISPATCH_DTYPE(dst_type, TO,
                                 [&] { return convert_typed<TI, TO>(src, dst, n, l); });
  });
}

Status launch_transpose(const void* src, DType src_type, void* dst, DType dst_type, int64_t batch,
                        int64_t rows, int64_t cols, const Launch& l) {
  return LATENT_DISPATCH_DTYPE(src_type, TI, [&] {
    return LATENT_DISPATCH_DTYPE(
        dst_type, TO, [&] { return transpose_typed<TI, TO>(src, dst, batch, rows, cols, l); });
  });
}

Status check_kernel_image() {
  cudaFuncAttributes attr;
  LATENT_CUDA_CHECK(cudaFuncGetAttributes(&attr, convert_kernel<float, float>));
  return ok_status();
}

}  // namespace latent::cuda
