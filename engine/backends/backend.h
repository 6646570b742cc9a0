// The backend interface: the one abstract class every device implements.
//
// Tensors passed to and returned by a backend live on its device, in its compute dtype and in a
// physical layout of its choosing; models only see logical shapes ([N, C, H, W] for images).
// Every op returns a Result: a backend that cannot run an op at a shape or dtype says so in the
// message instead of aborting, and `supports()` answers the same question ahead of time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace latent {

enum class Activation : uint8_t { kNone, kSiLU, kReLU, kGELU, kTanh };

struct Conv2dParams {
  int stride = 1;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  // The usual symmetric "same" padding of a k x k kernel: pad k/2 on each side.
  static Conv2dParams same(int kernel, int stride = 1) {
    Conv2dParams p;
    p.stride = stride;
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = kernel / 2;
    return p;
  }
};

enum class OpKind : uint8_t {
  kConv2d,
  kGroupNorm,
  kRmsNormChannels,
  kActivation,
  kAdd,
  kAffine,
  kChannelAffine,
  kClamp,
  kUpsampleNearest2x,
  kSliceChannels,
  kSpatialAttention,
};
const char* op_name(OpKind op);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  virtual Device device() const = 0;
  // The dtype activations and weights are held in on this backend.
  virtual DType compute_dtype() const = 0;
  // Whether `op` runs on this backend for `dtype` (shape limits are reported by the op itself).
  virtual bool supports(OpKind op, DType dtype) const = 0;

  // Host tensor (any dtype, contiguous) -> backend tensor in the compute dtype. Weights and
  // activations use the same entry point; a backend may re-layout 4-D tensors.
  virtual Result<Tensor> upload(const Tensor& host) = 0;
  // Backend tensor -> contiguous host tensor in fp32.
  virtual Result<Tensor> download(const Tensor& t) = 0;
  // Waits for all queued work (a no-op on the CPU).
  virtual Status synchronize() = 0;

  // y = act(conv(x, w) + bias + residual).
  // x: [N, Cin, H, W]; w: [Cout, Cin, kh, kw]; bias: [Cout] or undefined;
  // residual: [N, Cout, Ho, Wo] or undefined.
  virtual Result<Tensor> conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Conv2dParams& p, const Tensor& residual = Tensor(),
                                Activation act = Activation::kNone) = 0;

  // Group normalisation over [N, C, H, W] with C/groups channels a group, then optional act.
  // gamma/beta: [C] (both defined or both undefined).
  virtual Result<Tensor> group_norm(const Tensor& x, int groups, const Tensor& gamma,
                                    const Tensor& beta, float eps,
                                    Activation act = Activation::kNone) = 0;

  // The Wan / Qwen-Image VAE channel RMS norm: x / max(||x||_C, 1e-12) * sqrt(C) * gamma
  // (+ beta when defined), per pixel over channels, then optional act. gamma: [C].
  virtual Result<Tensor> rms_norm_channels(const Tensor& x, const Tensor& gamma,
                                           const Tensor& beta,
                                           Activation act = Activation::kNone) = 0;

  virtual Result<Tensor> activation(const Tensor& x, Activation act) = 0;
  // a + b, same shapes.
  virtual Result<Tensor> add(const Tensor& a, const Tensor& b) = 0;
  // x * scale + shift.
  virtual Result<Tensor> affine(const Tensor& x, float scale, float shift) = 0;
  // x[:, c] * scale[c] + shift[c] for [N, C, H, W]; scale and shift have C entries.
  virtual Result<Tensor> channel_affine(const Tensor& x, const std::vector<float>& scale,
                                        const std::vector<float>& shift) = 0;
  virtual Result<Tensor> clamp(const Tensor& x, float lo, float hi) = 0;
  // [N, C, H, W] -> [N, C, 2H, 2W], nearest neighbour.
  virtual Result<Tensor> upsample_nearest2x(const Tensor& x) = 0;
  // Channels [start, start + count) of [N, C, H, W].
  virtual Result<Tensor> slice_channels(const Tensor& x, int64_t start, int64_t count) = 0;
  // softmax(q k^T / sqrt(d)) v over the H*W spatial tokens of each image, `heads` heads of
  // d = C / heads channels. q, k, v: [N, C, H, W] -> [N, C, H, W]. Never holds the whole
  // (H*W) x (H*W) score matrix at once.
  virtual Result<Tensor> spatial_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           int heads) = 0;
};

}  // namespace latent
