// Pieces the diffusers-style VAE models (autoencoder_kl.cpp, tiny.cpp) share: name helpers for
// reading checkpoints, the convolution parameter, and the checks on encode/decode inputs.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/weights/binder.h"

namespace latent {
namespace vae_common {

inline bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

// Whether any name in the sorted list starts with `prefix`.
inline bool has_prefix(const std::vector<std::string>& sorted, const std::string& prefix) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), prefix);
  return it != sorted.end() && starts_with(*it, prefix);
}

// printf's "%g": the shortest plain form of a factor in a latent-space name.
inline std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

struct Conv {
  Tensor w, b;
  Conv2dParams p;
  // x: [N, Cin, H, W] -> [N, Cout, H', W']
  Result<Tensor> operator()(Backend& be, const Tensor& x, const Tensor& residual = Tensor(),
                            Activation act = Activation::kNone) const {
    return be.conv2d(x, w, b, p, residual, act);
  }
};

// A k x k convolution `name` (weight [cout, cin, k, k], optional bias [cout]) from the binder.
inline Conv load_conv(WeightBinder& binder, const std::string& name, int64_t cout, int64_t cin,
                      int k, bool bias, Conv2dParams p) {
  Conv c;
  c.w = binder.take(name + ".weight", {cout, cin, k, k});
  if (bias) c.b = binder.take(name + ".bias", {cout});
  c.p = p;
  return c;
}

// sample: [N, in_channels, H, W] with H and W multiples of the downsampling factor `f`.
inline Status check_encode_sample(const Backend& backend, const Tensor& sample, int64_t in_channels,
                                  int f) {
  if (!sample.defined() || sample.rank() != 4 || sample.dim(1) != in_channels ||
      sample.dim(2) <= 0 || sample.dim(3) <= 0)
    return Status::errorf("encode: expected a [N, ", in_channels, ", H, W] sample, got ",
                          sample.defined() ? shape_str(sample.shape()) : "an undefined tensor");
  if (sample.dim(2) % f != 0 || sample.dim(3) % f != 0)
    return Status::errorf("encode: image size ", sample.dim(3), "x", sample.dim(2),
                          " is not a multiple of ", f, " (the VAE's downsampling factor)");
  if (sample.device() != backend.device())
    return Status::errorf("encode: sample is on ", sample.device().to_string(), ", the model on ",
                          backend.name());
  return ok_status();
}

// latent: [N, latent_channels, h, w]
inline Status check_decode_latent(const Backend& backend, const Tensor& latent,
                                  int64_t latent_channels) {
  if (!latent.defined() || latent.rank() != 4 || latent.dim(1) != latent_channels ||
      latent.dim(2) <= 0 || latent.dim(3) <= 0)
    return Status::errorf("decode: expected a [N, ", latent_channels, ", h, w] latent, got ",
                          latent.defined() ? shape_str(latent.shape()) : "an undefined tensor");
  if (latent.device() != backend.device())
    return Status::errorf("decode: latent is on ", latent.device().to_string(), ", the model on ",
                          backend.name());
  return ok_status();
}

}  // namespace vae_common
}  // namespace latent
