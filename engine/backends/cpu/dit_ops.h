// Internal kernels of the CPU backend's DiT ops (backend.h, "DiT ops"):
//   dit_ops.cpp      CpuBackend's DiT dispatch: checks shapes, converts to fp32, rounds back
//   dit_kernels.cpp  these kernels: linear on oneDNN matmul, attention on oneDNN sgemm + softmax,
//                    the row-wise norms, modulation, rope and elementwise loops on OpenMP
// Kernels take contiguous fp32 host tensors whose shapes the dispatch has checked and return
// fp32 tensors (concat and slice move elements of any size unchanged).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/cpu/cpu_ops.h"

namespace latent::cpu {

// x: [M, K] (leading dims flattened), w: [N, K], bias: [N] or undefined -> [M, N] with the
// leading dims of x.
Result<Tensor> linear(DnnlContext& ctx, const Tensor& x, const Tensor& w, const Tensor& bias,
                      DitActivation act);

// Row norms over the last dim; gamma / beta: D floats or nullptr.
Tensor layer_norm(const Tensor& x, const float* gamma, const float* beta, float eps);
Tensor rms_norm(const Tensor& x, const float* gamma, float eps);

// x: [B, T, D]; shift, scale, gate: G*B rows of D; starts: G group starts (checked).
// normalize: LayerNorm (no affine, eps) before the modulation.
Tensor modulate(const Tensor& x, const float* shift, const float* scale,
                const std::vector<int64_t>& starts, bool normalize, float eps);
Tensor gated_add(const Tensor& residual, const Tensor& x, const float* gate,
                 const std::vector<int64_t>& starts);

// x: [B, T, heads * d]; freqs: [T, d/2, 2] fp32.
Tensor rope(const Tensor& x, const Tensor& freqs, int heads);

// q: [B, T, heads * d]; k, v: [B, S, heads * d]; key_mask: B*S floats (nonzero: keep) or
// nullptr. Every batch row keeps at least one key (checked by the dispatch).
Result<Tensor> attention(DnnlContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                         int heads, const float* key_mask);

Result<Tensor> dit_activation(DnnlContext& ctx, const Tensor& x, DitActivation act);
Tensor scaled_add(const Tensor& a, const Tensor& b, float alpha, float beta);
Tensor cfg_combine(const Tensor& cond, const Tensor& uncond, float scale);

// Any element type. parts share every dim but `dim`.
Tensor concat(const std::vector<Tensor>& parts, int dim);
// Any element type; a view (no copy) when the slice is one contiguous block.
Tensor slice(const Tensor& x, int dim, int64_t start, int64_t count);

}  // namespace latent::cpu
