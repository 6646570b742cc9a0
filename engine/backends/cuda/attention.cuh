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

// The unfused attention's two passes besides its GEMMs (CudaBackend::spatial_attention with
// LATENT_ATTENTION_KERNEL=gemm): p[r, :] = softmax(scale * s[r, :]) for `rows` rows of `cols`
// fp32 logits, written in `dtype` (bf16 / fp16); and x [rows, cols] -> y [cols, rows] in a 2-byte
// dtype (v transposed for the p v GEMM).
Status launch_softmax_rows(const float* s, void* p, int64_t rows, int64_t cols, float scale,
                           DType dtype, const Launch& l);
Status launch_transpose_2d(const void* x, void* y, int64_t rows, int64_t cols, DType dtype,
                           const Launch& l);

}  // namespace latent::cuda
