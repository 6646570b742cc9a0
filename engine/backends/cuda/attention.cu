// The VAE mid-block's spatial attention: every token of an image attends to every other, one
// head of d = channels or several side by side. The kernels are attention_flash.cu's.
#include "engine/backends/cuda/attention.cuh"
#include "engine/backends/cuda/attention_flash.cuh"
#include "engine/backends/cuda/common.cuh"

namespace latent::cuda {
namespace {

constexpr int kSoftmaxThreads = 256;

// One block a row: the row's maximum and the sum of its exponentials in one pass (each thread
// rescales its running sum when its maximum grows, the block combines the pairs), then the
// probabilities in a second: two reads of the fp32 row and one write in T.
template <typename T>
__global__ void softmax_rows_kernel(const float* __restrict__ s, T* __restrict__ p, int64_t cols,
                                    float scale) {
  __shared__ float part_m[kSoftmaxThreads / 32], part_s[kSoftmaxThreads / 32];
  const float* row = s + static_cast<int64_t>(blockIdx.x) * cols;
  T* out = p + static_cast<int64_t>(blockIdx.x) * cols;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float m = -INFINITY, sum = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += kSoftmaxThreads) {
    const float x = row[j] * scale;
    if (x > m) {
      sum = sum * __expf(m - x) + 1.f;  // exp(-inf) = 0 on the first element
      m = x;
    } else {
      sum += __expf(x - m);
    }
  }
  // (m, sum) pairs combined: the warp's, then the block's.
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, sum, o);
    const float nm = fmaxf(m, om);
    sum = (m == -INFINITY ? 0.f : sum * __expf(m - nm)) +
          (om == -INFINITY ? 0.f : os * __expf(om - nm));
    m = nm;
  }
  if (lane == 0) {
    part_m[warp] = m;
    part_s[warp] = sum;
  }
  __syncthreads();
  float bm = part_m[0];
  for (int i = 1; i < kSoftmaxThreads / 32; ++i) bm = fmaxf(bm, part_m[i]);
  float bs = 0.f;
  for (int i = 0; i < kSoftmaxThreads / 32; ++i)
    if (part_m[i] != -INFINITY) bs += part_s[i] * __expf(part_m[i] - bm);
  const float inv = 1.f / bs;
  for (int64_t j = threadIdx.x; j < cols; j += kSoftmaxThreads)
    out[j] = from_f32<T>(__expf(row[j] * scale - bm) * inv);
}

// 32 x 32 tiles through shared memory (a column of padding against bank conflicts).
template <typename T>
__global__ void transpose_2d_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                    int64_t cols) {
  __shared__ T tile[32][33];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32,
                c0 = static_cast<int64_t>(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = x[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;  // y [cols, rows]: row c, column r
    if (c < cols && r < rows) y[c * rows + r] = tile[threadIdx.x][i];
  }
}

}  // namespace

Status launch_softmax_rows(const float* s, void* p, int64_t rows, int64_t cols, float scale,
                           DType dtype, const Launch& l) {
  if (rows <= 0 || cols <= 0) return ok_status();
  if (rows > 0x7fffffff) return Status::errorf("softmax_rows: ", rows, " rows is too many");
  const unsigned grid = static_cast<unsigned>(rows);
  if (dtype == DType::kBF16) {
    softmax_rows_kernel<bf16>
        <<<grid, kSoftmaxThreads, 0, l.stream>>>(s, static_cast<bf16*>(p), cols, scale);
  } else if (dtype == DType::kF16) {
    softmax_rows_kernel<f16>
        <<<grid, kSoftmaxThreads, 0, l.stream>>>(s, static_cast<f16*>(p), cols, scale);
  } else {
    return Status::error("softmax_rows: bf16 / fp16 output only");
  }
  LATENT_CUDA_CHECK(cudaGetLastError());
  return ok_status();
}

Status launch_transpose_2d(const void* x, void* y, int64_t rows, int64_t cols, DType dtype,
                           const Launch& l) {
  if (rows <= 0 || cols <= 0) return ok_status();
  if (dtype == DType::kF32) return Status::error("transpose_2d: 2-byte dtypes only");
  const int64_t gx = (cols + 31) / 32, gy = (rows + 31) / 32;
  if (gx > 0x7fffffff || gy > 65535)
    return Status::errorf("transpose_2d: [", rows, ", ", cols, "] is too large");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), block(32, 8);
  // bf16 and fp16 move as the same 2-byte words
  transpose_2d_kernel<uint16_t><<<grid, block, 0, l.stream>>>(
      static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), rows, cols);
  LATENT_CUDA_CHECK(cudaGetLastError());
  return ok_status();
}

Status launch_spatial_attention(const void* q, const void* k, const void* v, void* out, int64_t n,
                                int64_t tokens, int64_t channels, int heads, DType dtype,
                                bool tensor_cores, const Launch& l) {
  if (n <= 0 || tokens <= 0) return ok_status();
  if (heads < 1 || channels % heads != 0)
    return Status::errorf("spatial_attention: ", channels, " channels cannot be split into ", heads,
                          " heads");
  if (n > 65535 || heads > 65535 || tokens > (1 << 30) || channels > (1 << 20))
    return Status::errorf("spatial_attention: shape n ", n, ", tokens ", tokens, ", channels ",
                          channels, " is too large");
  const AttentionArgs a =
      attention_args(q, k, v, nullptr, out, n, tokens, tokens, heads, channels / heads);
  return launch_flash_attention(a, dtype, tensor_cores, attention_kernel_from_env(),
                                "spatial_attention", l);
}

}  // namespace latent::cuda
