// The VAE mid-block's spatial attention: every token of an image attends to every other, one
// head of d = channels or several side by side. The kernels are attention_flash.cu's.
#include "engine/backends/cuda/attention.cuh"
#include "engine/backends/cuda/attention_flash.cuh"

namespace latent::cuda {

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
