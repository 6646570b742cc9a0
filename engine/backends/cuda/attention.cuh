// Spatial self-attention over the H*W tokens of NHWC activations, flash-style: scores are
// computed one key block at a time with an online softmax, never as a whole T x T matrix.
#pragma once

#include <cstdint>

#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// q, k, v, out: [n][tokens][channels] (NHWC with tokens = H*W), `heads` heads of
// d = channels / heads channels each. out = softmax(q k^T / sqrt(d)) v per image and head.
// bf16/fp16 run on the tensor cores (mma.sync) when d is a multiple of 64 up to 512 and
// `tensor_cores` is set; everything else (fp32, other head sizes up to 512) runs on a tiled
// fp32 kernel.
Status launch_spatial_attention(const void* q, const void* k, const void* v, void* out, int64_t n,
                                int64_t tokens, int64_t channels, int heads, DType dtype,
                                bool tensor_cores, const Launch& l);

}  // namespace latent::cuda
