// DiT attention: softmax(q k^T / sqrt(d)) v with queries and keys of different lengths, heads
// side by side in the features ([n][tokens][heads * d]) and an optional key padding mask
// ([n][tk], 0 = skip). The kernels are attention_flash.cu's; a query row whose keys are all
// masked is written as zeros.
#include "engine/backends/cuda/attention_flash.cuh"
#include "engine/backends/cuda/dit_kernels.cuh"

namespace latent::cuda {

Status launch_dit_attention(const void* q, const void* k, const void* v, const void* mask,
                            void* out, int64_t n, int64_t tq, int64_t tk, int heads, int64_t d,
                            DType dtype, const Launch& l) {
  if (n <= 0 || tq <= 0 || tk <= 0) return ok_status();
  if (n > 65535 || heads < 1 || heads > 65535 || d < 1 || tq > (1 << 30) || tk > (1 << 30) ||
      heads * d > (1 << 20))
    return Status::errorf("attention: batch ", n, ", ", tq, " queries, ", tk, " keys, ", heads,
                          " heads of ", d, " is too large");
  const AttentionArgs a = attention_args(q, k, v, mask, out, n, tq, tk, heads, d);
  return launch_flash_attention(a, dtype, /*tensor_cores=*/true, attention_kernel_from_env(),
                                "attention", l);
}

}  // namespace latent::cuda
