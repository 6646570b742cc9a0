// The CPU backend: contiguous NCHW host tensors (Layout::kContiguous, Device cpu); convolution,
// activations, softmax and matmuls on oneDNN, the other loops threaded with OpenMP.
//
// Storage dtype: fp32 by default. A bf16 or fp16 CPU backend keeps its tensors (weights and
// activations) in that dtype to halve their memory, but every op converts its inputs to fp32,
// computes in fp32 (norm statistics in double) and rounds its output once to the storage dtype.
// Upsample and channel slices move elements unchanged. So bf16/fp16 save memory, not time.
#pragma once

#include <memory>

#include "engine/backends/backend.h"

namespace latent {

namespace cpu {
class DnnlContext;
}

class CpuBackend final : public Backend {
 public:
  // Use create_cpu_backend(); the constructor throws if oneDNN cannot make a CPU engine.
  explicit CpuBackend(DType dtype);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device{}; }
  DType compute_dtype() const override { return dtype_; }
  using Backend::supports;
  bool supports(OpKind op, DType dtype) const override;

  // Frames (cpu/frames.cpp): converted on the host by engine/core/pixels.
  // `into` is not written: the CPU's images are fresh host tensors (plans there run no graph).
  Result<Tensor> frame_to_tensor(const FrameDesc& frame, const FrameGeometry& g,
                                 const Tensor* into = nullptr) override;
  Status tensor_to_frame(const Tensor& image, const FrameGeometry& g,
                         const FrameDesc& frame) override;

  Result<Tensor> upload(const Tensor& host) override;
  Result<Tensor> download(const Tensor& t) override;
  Status synchronize() override { return ok_status(); }

  Result<Tensor> conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                        const Tensor& residual = Tensor(),
                        Activation act = Activation::kNone) override;
  Result<Tensor> group_norm(const Tensor& x, int groups, const Tensor& gamma, const Tensor& beta,
                            float eps, Activation act = Activation::kNone) override;
  Result<Tensor> rms_norm_channels(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   Activation act = Activation::kNone) override;
  Result<Tensor> activation(const Tensor& x, Activation act) override;
  // dst <- src (same shape), both of this backend: rms_norm_channels_into() and the like.
  Status copy_into(const Tensor& src, const Tensor& dst) override;
  Result<Tensor> add(const Tensor& a, const Tensor& b) override;
  Result<Tensor> affine(const Tensor& x, float scale, float shift) override;
  Result<Tensor> channel_affine(const Tensor& x, const std::vector<float>& scale,
                                const std::vector<float>& shift) override;
  Result<Tensor> clamp(const Tensor& x, float lo, float hi) override;
  Result<Tensor> upsample_nearest2x(const Tensor& x) override;
  Result<Tensor> interleave_phases2x(const Tensor& z) override;
  Result<Tensor> slice_channels(const Tensor& x, int64_t start, int64_t count) override;
  Result<Tensor> spatial_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   int heads) override;
  Result<Tensor> clip_to_frames(const Tensor& clip) override;
  Result<Tensor> frames_to_clip(const Tensor& frames) override;
  // conv3d_frames() runs here as one conv2d per temporal tap (the reference of the CUDA op);
  // models only use it when LATENT_CPU_CONV3D=1 was set when the backend was made (tests of
  // the models' fused path), else they compose the taps themselves.
  bool supports_conv3d_frames() const override { return conv3d_; }
  Result<Tensor> conv3d_frames(const Tensor& x, const Tensor& w, int kt, const Tensor& bias,
                               const Conv2dParams& p, const Tensor& residual = Tensor(),
                               Activation act = Activation::kNone) override;
  // conv3d_frames() then rms_norm_channels() into `into` (two passes: the reference of CUDA's
  // fused epilogue), where conv3d_frames() is offered; a debug line says it ran (tests count it).
  Result<Tensor> conv3d_frames_normed(const Tensor& x, const Tensor& w, int kt, const Tensor& bias,
                                      const Conv2dParams& p, const Tensor& gamma, Activation act,
                                      const Tensor& into = Tensor()) override;

  // === DiT ops: defined in dit_ops.cpp (kernels in dit_kernels.cpp, see dit_ops.h) ===========
  bool supports_dit(DitOp op, DType dtype) const override;
  Result<Tensor> upload_fp32(const Tensor& host) override;
  Result<Tensor> linear(const Tensor& x, const Tensor& w, const Tensor& bias,
                        DitActivation act) override;
  Result<Tensor> layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            float eps) override;
  Result<Tensor> rms_norm(const Tensor& x, const Tensor& gamma, float eps) override;
  Result<Tensor> modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                          const std::vector<int64_t>& group_starts) override;
  Result<Tensor> layer_norm_modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                     const std::vector<int64_t>& group_starts,
                                     float eps) override;
  Result<Tensor> gated_add(const Tensor& residual, const Tensor& x, const Tensor& gate,
                           const std::vector<int64_t>& group_starts) override;
  Result<Tensor> rope(const Tensor& x, const Tensor& freqs, int heads) override;
  Result<Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                           const Tensor& key_mask,
                           const std::vector<int64_t>& key_lengths = {}) override;
  Result<Tensor> dit_activation(const Tensor& x, DitActivation act) override;
  Result<Tensor> scaled_add(const Tensor& a, const Tensor& b, float alpha, float beta) override;
  Result<Tensor> cfg_combine(const Tensor& cond, const Tensor& uncond, float scale) override;
  Result<Tensor> concat(const std::vector<Tensor>& parts, int dim) override;
  Result<Tensor> slice(const Tensor& x, int dim, int64_t start, int64_t count) override;
  Result<Tensor> pack_latents(const Tensor& latents) override;
  Result<Tensor> unpack_latents(const Tensor& tokens, int64_t height, int64_t width) override;
  // === end of DiT ops =========================================================================

 private:
  // An fp32 tensor with x's values: x itself on an fp32 backend, else a converted copy.
  Tensor to_f32(const Tensor& x) const;
  // An fp32 op result rounded to the storage dtype.
  Tensor to_storage(Tensor y) const;

  DType dtype_;
  bool conv3d_ = false;
  std::unique_ptr<cpu::DnnlContext> dnnl_;
};

// A new CPU backend storing tensors in `dtype`; fails with a message if oneDNN has no CPU engine.
Result<std::shared_ptr<Backend>> create_cpu_backend(DType dtype);

}  // namespace latent
