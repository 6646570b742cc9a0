// The VAE model interface shared by every autoencoder architecture.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/weights/model_source.h"

namespace latent {

// What a latent means. Two models whose `name`s match produce interchangeable latents.
// normalised = (raw - shift[c]) * scale[c]: what a diffusion model consumes.
struct LatentSpace {
  std::string name;  // "sd", "sdxl", "sd3", "flux1", "flux2", "qwen-image", "latent-default", ...
  int channels = 0;
  int downsample = 8;
  std::vector<float> shift;  // per channel (size `channels`)
  std::vector<float> scale;

  // Per-channel vectors from scalars: SD-style (scaling_factor, shift_factor).
  static LatentSpace from_scalars(std::string name, int channels, int downsample, double scaling,
                                  double shift);
  // Qwen / Wan style: normalised = (raw - mean) / std.
  static LatentSpace from_mean_std(std::string name, int channels, int downsample,
                                   const std::vector<double>& mean, const std::vector<double>& std);

  Result<Tensor> normalize(Backend& b, const Tensor& raw) const;
  Result<Tensor> denormalize(Backend& b, const Tensor& normalised) const;
};

struct PartInfo {
  std::string name;  // "encoder", "decoder"
  int64_t parameters = 0;
};

struct ModelInfo {
  std::string architecture;  // "AutoencoderKL", "AutoencoderKLQwenImage", "AutoencoderTiny"
  std::string variant;       // "sd", "flux1", "taef2 (mid-block group norm)", ...
  ModelSource source;
  std::vector<PartInfo> parts;
  std::map<std::string, int64_t> storage_dtypes;  // checkpoint dtype -> tensor count
  LatentSpace latent_space;
  std::string description;  // one line per config item for `latent-tool inspect`
};

class VaeModel {
 public:
  virtual ~VaeModel() = default;
  virtual const ModelInfo& info() const = 0;
  const LatentSpace& latent_space() const { return info().latent_space; }
  int downsample() const { return info().latent_space.downsample; }
  virtual bool has_encoder() const = 0;
  virtual bool has_decoder() const = 0;
  Backend& backend() const { return *backend_; }

  // sample: [N, 3, H, W] in [-1, 1] on the backend, H and W multiples of downsample().
  // Returns the raw (un-normalised) posterior mean [N, C, H/f, W/f] (TAESD: its latents).
  virtual Result<Tensor> encode(const Tensor& sample) = 0;
  // latent: raw [N, C, h, w] -> sample [N, 3, h*f, w*f], nominally in [-1, 1].
  virtual Result<Tensor> decode(const Tensor& latent) = 0;

 protected:
  std::shared_ptr<Backend> backend_;
};

struct VaeLoadOptions {
  bool encoder = true;  // load the encoder part
  bool decoder = true;  // load the decoder part
};

// Loads any supported autoencoder from a resolved source onto `backend`. Unsupported
// architectures, missing parts and bad weights are errors naming the file and tensor.
Result<std::unique_ptr<VaeModel>> load_vae(const ModelSource& source,
                                           std::shared_ptr<Backend> backend,
                                           const VaeLoadOptions& options = {});
// Convenience: resolve_model_source(path) then load_vae.
Result<std::unique_ptr<VaeModel>> load_vae(const std::string& path,
                                           std::shared_ptr<Backend> backend,
                                           const VaeLoadOptions& options = {});

}  // namespace latent
