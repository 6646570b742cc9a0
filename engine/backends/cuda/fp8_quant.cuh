// Row-wise FP8 (e4m3) quantisation for dtype fp8's linear layers (backend.h, Fp8Matrix).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// x [rows, cols] row-major in `dtype` -> codes [rows, cols] (e4m3, one byte each) and scales
// [rows] (fp32): scale = max|x[r, :]| / 448 (1 for a zero row, NaN when the row holds a NaN or
// an infinity), code = e4m3(x / scale) rounded to nearest even with saturation. The same
// arithmetic as engine/weights/fp8.h's fp8_e4m3_quantize_row (IEEE division both), so the
// codes equal the host's.
Status launch_fp8_quantize_rows(const void* x, DType dtype, int64_t rows, int64_t cols,
                                uint8_t* codes, float* scales, const Launch& l);

// The scalars of an FP8 attention call (launch_fp8_attention_inputs, sdpa.h's
// sdpa_attention_fp8), fp32 in one device block: the three inputs' largest magnitudes (as bits),
// the graph's descale / scale inputs and its two amax outputs.
enum Fp8AttentionScalar : int {
  kFp8AmaxQ = 0,     // bits of max |q| (then k, v)
  kFp8DescaleQ = 3,  // max |q| / 448: a code times this is the value (then k, v)
  kFp8DescaleS = 6,  // 1 / 448: the softmax probabilities P in [0, 1] coded as P * 448
  kFp8ScaleS = 7,    // 448
  kFp8ScaleO = 8,    // 1 / kFp8DescaleO: the output's codes are O / descale_o
  kFp8DescaleO = 9,  // descale_v * 9 / 8: |O| <= max |v| (a convex sum), with room for P's rounding
  kFp8AmaxS = 10,    // written by cuDNN (max P, max |O|); not read
  kFp8AmaxO = 11,
  kFp8Scalars = 16,  // the block's size (64 bytes)
};

// Per-tensor e4m3 quantisation of an attention call's q [nq], k and v [nkv] (any layout: they
// are read as flat arrays) for cuDNN's FP8 SDPA: each tensor's largest magnitude, then
// code = e4m3(x / (amax / 448)) (round to nearest even, saturating; amax 0: scale 1, a NaN or an
// infinity: NaN scales), the descales and scales above into `scalars` (kFp8Scalars floats), and
// `o_row_scales` ([o_rows], may be null) all set to descale_o: the output's codes read back as
// an Fp8Matrix with one scale per row (the next layer's FP8 input). Three kernels (the amax
// block zeroed, the amax, the codes); no host synchronisation.
Status launch_fp8_attention_inputs(const void* q, const void* k, const void* v, int64_t nq,
                                   int64_t nkv, DType dtype, uint8_t* q8, uint8_t* k8, uint8_t* v8,
                                   float* scalars, float* o_row_scales, int64_t o_rows,
                                   const Launch& l);

// launch_fp8_attention_inputs for v alone, where q and k were coded already with one scale each
// (Backend::joint_qk_fp8): v's amax and codes, the scalars (descale_q / descale_k copied from the
// device floats given), the output's row scales.
Status launch_fp8_attention_v(const void* v, int64_t nkv, DType dtype, uint8_t* v8,
                              const float* q_descale, const float* k_descale, float* scalars,
                              float* o_row_scales, int64_t o_rows, const Launch& l);

// A gated FP8 layer's epilogue operands (dit_linear_fp8_gated_add): out_scales[j] =
// w_scales[j] * gate[j] (fp32) and, with a bias, out_bias[j] = bias[j] * gate[j] (rounded to
// `dtype`), j < n; gate and bias in `dtype`. So x w^T * gate + bias * gate comes out of the
// GEMM's own per-channel scaling and bias.
Status launch_fp8_gate_scales(const float* w_scales, const void* gate, const void* bias, int64_t n,
                              DType dtype, float* out_scales, void* out_bias, const Launch& l);

// p[0, n) = value.
Status launch_fp8_fill(float* p, int64_t n, float value, const Launch& l);

// y [rows, cols] in `dtype` = e4m3 codes [rows, cols] x scales[row].
Status launch_fp8_dequantize_rows(const uint8_t* codes, const float* scales, int64_t rows,
                                  int64_t cols, DType dtype, void* y, const Launch& l);

}  // namespace latent::cuda
