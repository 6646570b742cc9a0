// Launchers of the DiT kernels (dit_norm.cu, dit_rope.cu, dit_attention.cu,
// dit_elementwise.cu). Plain C++: included by dit_ops.cpp and by the kernels.
#pragma once

#include <cstdint>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// Token groups of the per-token conditioning (backend.h): token t of batch row b reads
// conditioning row group(t) * batch + b. At most kMaxDitGroups groups.
constexpr int kMaxDitGroups = 8;
struct DitGroups {
  int count = 1;
  int64_t starts[kMaxDitGroups] = {0};
  int64_t batch = 1, tokens = 1;
};

// Row-wise normalisation of `rows` rows of `d`, then affine and modulation:
//   norm: 0 none, 1 LayerNorm (mean, biased variance), 2 RMSNorm (mean of squares);
//   y = n(x) * gamma + beta           (gamma / beta may be null)
//   y = y * (1 + scale[g]) + shift[g] (shift / scale grouped by `groups`, may be null; rows
//                                      are then [batch][tokens])
// With `codes`, y is not written: each output row is quantised to FP8 e4m3 instead (codes
// [rows][d], one fp32 scale a row in `scales`), as fp8_quantize_rows would quantise y.
// y_pitch: elements from one row of y to the next (0: d).
enum class DitNorm : int { kNone = 0, kLayer = 1, kRms = 2 };
Status launch_dit_norm(const void* x, void* y, int64_t rows, int64_t d, DitNorm norm, float eps,
                       const void* gamma, const void* beta, const void* shift, const void* scale,
                       const DitGroups& groups, DType dtype, const Launch& l,
                       uint8_t* codes = nullptr, float* scales = nullptr, int64_t y_pitch = 0);

// y = residual + gate[g] * x over [batch][tokens][d].
Status launch_dit_gated_add(const void* residual, const void* x, const void* gate, void* y,
                            int64_t d, const DitGroups& groups, DType dtype, const Launch& l);

// Backend::joint_qk: img [batch][t_img][heads * d], txt [batch][t_txt][heads * d] -> y
// [batch][t_img + t_txt][heads * d]: per-head RMS norm (gamma_img / gamma_txt [d], eps) then
// the rotation with freqs [t_img + t_txt][d / 2][2] fp32, one pass.
Status launch_dit_joint_qk(const void* img, const void* txt, const void* gamma_img,
                           const void* gamma_txt, const float* freqs, void* y, int64_t batch,
                           int64_t t_img, int64_t t_txt, int heads, int64_t d, float eps,
                           DType dtype, const Launch& l);

// launch_dit_joint_qk with the output as e4m3 codes (one byte each) of value / descale
// (Backend::joint_qk_fp8; descale > 0: |value| <= 448 descale is coded without saturation).
Status launch_dit_joint_qk_codes(const void* img, const void* txt, const void* gamma_img,
                                 const void* gamma_txt, const float* freqs, uint8_t* codes,
                                 float descale, int64_t batch, int64_t t_img, int64_t t_txt,
                                 int heads, int64_t d, float eps, DType dtype, const Launch& l);

// x, y: [batch * tokens][heads * d]; freqs: [tokens][d / 2][2] fp32.
Status launch_dit_rope(const void* x, const float* freqs, void* y, int64_t rows, int64_t tokens,
                       int heads, int64_t d, DType dtype, const Launch& l);

// q, out: [n][tq][heads * d]; k, v: [n][tk][heads * d]; mask: [n][tk] in `dtype` (nonzero:
// attend) or null. A batch row whose every key is masked gets zeros (the dispatch cannot see
// the mask's values without a host synchronisation).
Status launch_dit_attention(const void* q, const void* k, const void* v, const void* mask,
                            void* out, int64_t n, int64_t tq, int64_t tk, int heads, int64_t d,
                            DType dtype, const Launch& l);

// y = act(x + bias[i % cols]) over n elements (bias [cols] or null). In place allowed.
Status launch_dit_bias_act(const void* x, const void* bias, void* y, int64_t n, int64_t cols,
                           DitActivation act, DType dtype, const Launch& l);
// y = alpha * a + beta * b.
Status launch_dit_scaled_add(const void* a, const void* b, void* y, int64_t n, float alpha,
                             float beta, DType dtype, const Launch& l);
// Per row of `cols`: comb = u + scale (c - u); y = comb * ||c|| / ||comb||.
Status launch_dit_cfg_combine(const void* cond, const void* uncond, void* y, int64_t rows,
                              int64_t cols, float scale, DType dtype, const Launch& l);

}  // namespace latent::cuda
