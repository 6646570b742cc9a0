// LatentSpace: per-channel normalisation between a VAE's raw latents and what a diffusion model
// consumes, normalised = (raw - shift[c]) * scale[c].
#include <cmath>

#include "engine/models/vae/vae.h"

namespace latent {

LatentSpace LatentSpace::from_scalars(std::string name, int channels, int downsample,
                                      double scaling, double shift) {
  LatentSpace s;
  s.name = std::move(name);
  s.channels = channels;
  s.downsample = downsample;
  s.shift.assign(static_cast<size_t>(channels > 0 ? channels : 0), static_cast<float>(shift));
  s.scale.assign(static_cast<size_t>(channels > 0 ? channels : 0), static_cast<float>(scaling));
  return s;
}

LatentSpace LatentSpace::from_mean_std(std::string name, int channels, int downsample,
                                       const std::vector<double>& mean,
                                       const std::vector<double>& std) {
  LatentSpace s;
  s.name = std::move(name);
  s.channels = channels;
  s.downsample = downsample;
  s.shift.reserve(mean.size());
  for (double m : mean) s.shift.push_back(static_cast<float>(m));
  s.scale.reserve(std.size());
  // A zero std would make the scale infinite; callers validate their configs, keep it finite here.
  for (double d : std) s.scale.push_back(d != 0.0 ? static_cast<float>(1.0 / d) : 0.f);
  return s;
}

const std::vector<std::string>& known_latent_spaces() {
  static const std::vector<std::string> kNames = {"sd",
                                                  "sdxl",
                                                  "sd3",
                                                  "flux1",
                                                  "flux2",
                                                  "qwen-image",
                                                  "wan2.2",
                                                  "hunyuan-video",
                                                  "hunyuan-video-1.5",
                                                  "open-sora-1.3",
                                                  "latent-default"};
  return kNames;
}

bool is_known_latent_space(const std::string& name) {
  for (const auto& n : known_latent_spaces())
    if (n == name) return true;
  return false;
}

namespace {

Status check_latent(const LatentSpace& s, const Tensor& t, const char* what) {
  if (s.shift.size() != static_cast<size_t>(s.channels) ||
      s.scale.size() != static_cast<size_t>(s.channels))
    return Status::errorf("latent space '", s.name, "' has ", s.shift.size(), " shifts and ",
                          s.scale.size(), " scales for ", s.channels, " channels");
  if (!t.defined()) return Status::errorf(what, ": undefined tensor");
  if (t.rank() != 4 || t.dim(1) != s.channels)
    return Status::errorf(what, ": expected a [N, ", s.channels, ", H, W] latent of space '",
                          s.name, "', got ", shape_str(t.shape()));
  return ok_status();
}

}  // namespace

Result<Tensor> LatentSpace::normalize(Backend& b, const Tensor& raw) const {
  LATENT_TRY(check_latent(*this, raw, "normalize"));
  // (raw - shift) * scale = raw * scale + (-shift * scale)
  std::vector<float> add(shift.size());
  for (size_t c = 0; c < shift.size(); ++c) add[c] = -shift[c] * scale[c];
  return b.channel_affine(raw, scale, add);
}

Result<Tensor> LatentSpace::denormalize(Backend& b, const Tensor& normalised) const {
  LATENT_TRY(check_latent(*this, normalised, "denormalize"));
  // raw = normalised / scale + shift
  std::vector<float> mul(scale.size());
  for (size_t c = 0; c < scale.size(); ++c) {
    if (scale[c] == 0.f || !std::isfinite(scale[c]))
      return Status::errorf("latent space '", name, "' has scale ", scale[c], " for channel ", c,
                            "; it cannot be inverted");
    mul[c] = 1.f / scale[c];
  }
  return b.channel_affine(normalised, mul, shift);
}

}  // namespace latent
