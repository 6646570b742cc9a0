// The CUDA backend's DiT ops (backend.h, "DiT ops"). cuda_backend.cpp's overrides call the
// dit_* functions below with the lock held and the device current; they check their inputs
// and queue kernels (no host synchronisation):
//   dit_ops.cpp          these checks and the dispatch
//   dit_kernels.cuh      the launchers of the kernels below
//   dit_linear.cpp       linear() on cuBLASLt, bias / GELU(tanh) fused as epilogues
//   dit_norm.cu          layer / RMS norm, modulation and their fusion, one warp a row
//   dit_rope.cu          rotary embedding
//   dit_attention.cu     flash attention with a key padding mask
//   dit_elementwise.cu   gated_add, scaled_add, cfg_combine, activations, latent packing
// Token tensors are contiguous row-major [..., D] (4-D ones too: a reshaped [B, T, H, d] is
// not NHWC); outputs are contiguous. Arithmetic in fp32, storage in the backend's dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/dit_kernels.cuh"
#include "engine/backends/cuda/dit_linear.h"
#include "engine/backends/cuda/launch.h"
#include "engine/backends/cuda/memory.h"

namespace latent::cuda {

// What a DiT op needs of the backend.
struct DitEnv {
  DeviceContext* ctx = nullptr;
  DType dtype = DType::kBF16;
  Launch launch;
  Device device;
  std::string name;  // "cuda:0", for messages
  DitLinear* linear = nullptr;
};

// Ok when `host` is a defined, contiguous host tensor whose storage holds all its bytes (what an
// upload reads); otherwise the fault, naming the tensor.
Status check_host_tensor(const Tensor& host);
Result<Tensor> dit_upload_fp32(DitEnv& env, const Tensor& host);
Result<Tensor> dit_linear(DitEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
                          DitActivation act);
// act(x w^T + residual): cuBLASLt with residual as C (beta 1), GELU in the epilogue.
Result<Tensor> dit_linear_add(DitEnv& env, const Tensor& x, const Tensor& w,
                              const Tensor& residual, DitActivation act);
// Backend::linear_wide / linear_into_columns / layer_norm_modulate_wide (backend.h: runtime
// LoRAs folded into the base GEMM): rows read and written at their pitch by cuBLASLt (ld) and
// the norm kernel; linear_into_columns writes into x in place and returns it.
Result<Tensor> dit_linear_wide(DitEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
                               DitActivation act, int64_t extra);
Result<Tensor> dit_linear_into_columns(DitEnv& env, const Tensor& x, const Tensor& w,
                                       int64_t column);
Result<Tensor> dit_layer_norm_modulate_wide(DitEnv& env, const Tensor& x, const Tensor& shift,
                                            const Tensor& scale,
                                            const std::vector<int64_t>& group_starts, float eps,
                                            int64_t extra);
// Backend::fp8_quantize_rows / linear_fp8 (backend.h, Fp8Matrix): codes in a bf16 tensor
// [rows, K / 2] (K bytes a row), scales fp32 [rows]; K a multiple of 16 (cuBLASLt's FP8).
Result<Fp8Matrix> dit_fp8_quantize_rows(DitEnv& env, const Tensor& x);
Result<Tensor> dit_linear_fp8(DitEnv& env, const Fp8Matrix& x, const Fp8Matrix& w,
                              const Tensor& bias, DitActivation act);
// Backend::linear_fp8_joined for one batch row: one output [1, T_a + T_b, N], each GEMM writing
// its rows in place (no concat pass).
Result<Tensor> dit_linear_fp8_joined(DitEnv& env, const Fp8Matrix& x_a, const Fp8Matrix& w_a,
                                     const Tensor& b_a, const Fp8Matrix& x_b, const Fp8Matrix& w_b,
                                     const Tensor& b_b);
// Backend::linear_fp8_gated_add: the gate folded into the weight's channel scales and the bias,
// the residual read as the GEMM's C (beta = 1): one GEMM, no gated_add pass.
Result<Tensor> dit_linear_fp8_gated_add(DitEnv& env, const Fp8Matrix& x, const Fp8Matrix& w,
                                        const Tensor& bias, const Tensor& gate,
                                        const Tensor& residual);
Result<Tensor> dit_layer_norm(DitEnv& env, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              float eps);
Result<Tensor> dit_rms_norm(DitEnv& env, const Tensor& x, const Tensor& gamma, float eps);
Result<Tensor> dit_modulate(DitEnv& env, const Tensor& x, const Tensor& shift, const Tensor& scale,
                            const std::vector<int64_t>& group_starts, bool normalize, float eps);
// layer_norm_modulate with its output quantised by rows to FP8 (never stored in the dtype).
Result<Fp8Matrix> dit_layer_norm_modulate_fp8(DitEnv& env, const Tensor& x, const Tensor& shift,
                                              const Tensor& scale,
                                              const std::vector<int64_t>& group_starts,
                                              float eps);
Result<Tensor> dit_gated_add(DitEnv& env, const Tensor& residual, const Tensor& x,
                             const Tensor& gate, const std::vector<int64_t>& group_starts);
Result<Tensor> dit_rope(DitEnv& env, const Tensor& x, const Tensor& freqs, int heads);
Result<Tensor> dit_joint_qk(DitEnv& env, const Tensor& img, const Tensor& txt,
                            const Tensor& gamma_img, const Tensor& gamma_txt, const Tensor& freqs,
                            int heads, float eps);
// key_lengths (backend.h: the promise that key_mask is a prefix of valid keys) go to cuDNN's
// padding mask; they cannot be checked against the device mask here, only their count and range.
// extra > 0: Backend::attention_wide (the output [B, T, heads * d + extra], its last `extra`
// columns left to the caller).
Result<Tensor> dit_attention(DitEnv& env, const Tensor& q, const Tensor& k, const Tensor& v,
                             int heads, const Tensor& key_mask,
                             const std::vector<int64_t>& key_lengths, int64_t extra = 0);
// Backend::attention_fp8: q, k and v quantised to e4m3 with a scale each and cuDNN's FP8 SDPA
// (sdpa.h, sdpa_attention_fp8), its e4m3 output returned as an Fp8Matrix whose row scales are
// all the output's one scale. Where that cannot run (a key mask without key lengths, below
// sm_90, no cudnn-frontend, LATENT_FP8_ATTENTION=0, cuDNN refuses the shape): dit_attention in
// the compute dtype, its rows then quantised (dit_fp8_quantize_rows).
Result<Fp8Matrix> dit_attention_fp8(DitEnv& env, const Tensor& q, const Tensor& k, const Tensor& v,
                                    int heads, const Tensor& key_mask,
                                    const std::vector<int64_t>& key_lengths);
// Backend::joint_qk_fp8: joint_qk's values coded in e4m3 as they are written, one scale
// (bound / 448) for the whole tensor (every row scale that value).
Result<Fp8Matrix> dit_joint_qk_fp8(DitEnv& env, const Tensor& img, const Tensor& txt,
                                   const Tensor& gamma_img, const Tensor& gamma_txt,
                                   const Tensor& freqs, int heads, float eps, float bound);
// Backend::attention_fp8 with q and k coded already (joint_qk_fp8): v coded with its own
// amax, cuDNN's FP8 SDPA; where it cannot run, q and k dequantised and dit_attention, its rows
// quantised.
Result<Fp8Matrix> dit_attention_fp8_codes(DitEnv& env, const Fp8Matrix& q, const Fp8Matrix& k,
                                          const Tensor& v, int heads, const Tensor& key_mask,
                                          const std::vector<int64_t>& key_lengths);
Result<Tensor> dit_activation(DitEnv& env, const Tensor& x, DitActivation act);
Result<Tensor> dit_scaled_add(DitEnv& env, const Tensor& a, const Tensor& b, float alpha,
                              float beta);
Result<Tensor> dit_cfg_combine(DitEnv& env, const Tensor& cond, const Tensor& uncond, float scale);
Result<Tensor> dit_concat(DitEnv& env, const std::vector<Tensor>& parts, int dim);
Result<Tensor> dit_slice(DitEnv& env, const Tensor& x, int dim, int64_t start, int64_t count);
// Backend::pack_latents / unpack_latents (backend.h); images in NHWC or row-major.
Result<Tensor> dit_pack_latents(DitEnv& env, const Tensor& latents);
Result<Tensor> dit_unpack_latents(DitEnv& env, const Tensor& tokens, int64_t height, int64_t width);

// The patch permutation's kernel (dit_elementwise.cu): image [b, c, h, w] (NCHW, or NHWC when
// `nhwc`) -> tokens [b, (h/2)(w/2), 4c] when `pack`, else the inverse.
Status launch_dit_patch(const void* in, void* out, int64_t b, int64_t c, int64_t h, int64_t w,
                        bool nhwc, bool pack, DType dtype, const Launch& l);

}  // namespace latent::cuda
