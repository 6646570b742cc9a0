// The one flash-attention implementation behind both public entry points: the VAE mid-block's
// spatial_attention (attention.cu: one image's tokens attend to each other, d up to 512) and
// the DiT's joint attention (dit_attention.cu: queries and keys of different lengths, an
// optional key padding mask). Both lay heads side by side in the features:
// q, out: [n][tq][heads * d], k, v: [n][tk][heads * d]. Plain C++ (host side).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

struct AttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* mask = nullptr;  // [n][tk] in the storage dtype, 0 = skip that key; or null
  void* out = nullptr;
  int64_t n = 0;  // batch
  int tq = 0, tk = 0;
  int heads = 1, d = 0;
};

// The args of one call; token counts and d narrowed to int (the caller checks they fit).
inline AttentionArgs attention_args(const void* q, const void* k, const void* v, const void* mask,
                                    void* out, int64_t n, int64_t tq, int64_t tk, int heads,
                                    int64_t d) {
  AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.mask = mask;
  a.out = out;
  a.n = n;
  a.tq = static_cast<int>(tq);
  a.tk = static_cast<int>(tk);
  a.heads = heads;
  a.d = static_cast<int>(d);
  return a;
}

// The kernel variants; LATENT_ATTENTION_KERNEL names one to force it (A/B timing, tests):
//   mma    the default tensor-core configuration (currently mma32)
//   mma16  mma.sync, 8 warps x 16 queries, 64-key tiles double-buffered (d <= 128)
//   mma32  mma.sync, 4 warps x 32 queries, 64-key tiles double-buffered (d <= 128)
//   wgmma  the Hopper kernel (attention_wgmma.cu: sm_90a, d = 128, bf16/fp16, compute
//          capability 9.0); anything else runs the default. Not the default until timed.
//   simple CUDA cores, fp32 arithmetic (any dtype, d <= 512)
//   auto   (or unset) the default: cuDNN's fused attention where it runs, else mma32; any other
//          value is warned about (engine/core/env.h) and runs the default
// A forced variant that cannot run the shape falls back to the next that can (a tensor-core
// variant to the default, the default to simple). d > 128 on the tensor cores always uses the
// channel-split configuration (16-query row groups x d / 128 warps, 32-key tiles).
// kGemm: the VAE's spatial attention unfused (CudaBackend::spatial_attention: q k^T on
// cuBLASLt in fp32, a row softmax, p v), one head only; elsewhere it means the default.
enum class AttentionKernel { kDefault, kMma16, kMma32, kWgmma, kSimple, kGemm };

// The variant LATENT_ATTENTION_KERNEL asks for (read at every call, so tests can switch it).
AttentionKernel attention_kernel_from_env();
const char* attention_kernel_name(AttentionKernel k);

// out = softmax(q k^T / sqrt(d)) v per batch row and head, masked keys skipped; a query row
// without a single key is written as zeros. `op` prefixes error messages. bf16/fp16 run on the
// tensor cores when `tensor_cores` is set, d is 64, 128, 192, 256, 384 or 512 and every pointer
// is 16-byte aligned; everything else (fp32 included) on the CUDA-core kernel, d <= 512.
Status launch_flash_attention(const AttentionArgs& a, DType dtype, bool tensor_cores,
                              AttentionKernel kernel, const char* op, const Launch& l);

}  // namespace latent::cuda
