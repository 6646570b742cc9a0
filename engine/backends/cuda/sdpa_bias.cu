// The key mask of cuDNN's SDPA (sdpa.h) as an additive bias: 0 where a key is attended, -65504
// where it is padding. Finite on purpose (PyTorch's choice for boolean masks with cuDNN): the
// flash kernel's running max then never meets -inf - (-inf).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/sdpa.h"

namespace latent::cuda {
namespace {

template <typename T>
__global__ void sdpa_mask_bias_kernel(const T* __restrict__ mask, T* __restrict__ bias,
                                      int64_t rows, int64_t cols, int64_t bias_stride) {
  const int64_t n = rows * bias_stride;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / bias_stride, c = i - r * bias_stride;
    const bool keep = c < cols && static_cast<float>(mask[r * cols + c]) != 0.f;
    bias[i] = static_cast<T>(keep ? 0.f : -65504.f);
  }
}

}  // namespace

Status launch_sdpa_mask_bias(const void* mask, void* bias, int64_t rows, int64_t cols,
                             int64_t bias_stride, DType dtype, cudaStream_t stream) {
  const int64_t n = rows * bias_stride;
  if (n <= 0 || bias_stride < cols) return Status::error("sdpa mask bias: bad shape");
  const int threads = 256;
  const int64_t want = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 1024 ? want : 1024);
  switch (dtype) {
    case DType::kBF16:
      sdpa_mask_bias_kernel<<<blocks, threads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(mask), static_cast<__nv_bfloat16*>(bias), rows, cols,
          bias_stride);
      break;
    case DType::kF16:
      sdpa_mask_bias_kernel<<<blocks, threads, 0, stream>>>(
          static_cast<const __half*>(mask), static_cast<__half*>(bias), rows, cols, bias_stride);
      break;
    case DType::kF32:
      return Status::error("sdpa mask bias: fp32 is not supported");
  }
  LATENT_CUDA_CHECK_LAUNCH("sdpa_mask_bias_kernel");
  return ok_status();
}

}  // namespace latent::cuda
