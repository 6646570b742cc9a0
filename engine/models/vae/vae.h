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

// The latent spaces the engine names itself, in a fixed order: the loaders give these names to
// the models they recognise (by config, checkpoint or file name). Any other name is a custom
// VAE's: generated from its normalisation (`autoencoder-kl-4ch-s0.5-t0`, `qwen-image-vae-custom`,
// `taehv-24ch`) or given by its config's `latent_space`. The elements' pad templates list these
// (elements/gstlatentcaps.h, kept equal by a test).
const std::vector<std::string>& known_latent_spaces();
bool is_known_latent_space(const std::string& name);

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

// ---- Video mode (causal video VAEs: Wan 2.1 / Qwen-Image, Wan 2.2, TAEW) ----------------------
//
// A causal video VAE maps a clip of T = 1 + F*k frames to 1 + k latent frames (F = temporal
// factor, 4 for the Wan family): latent frame 0 covers frame 0 alone, every later latent frame
// covers the next F frames. Its convolutions only look back in time, so a clip can be fed in
// chunks while each layer keeps the last frames it has seen (the causal cache): memory stays
// constant whatever the clip's length. Video tensors are [N, C, T, H, W] (diffusers' order).
//
// Frames [start, start + count) of `frames` ([T, C, H, W] in the backend's image layout, frames
// outermost in NCHW and NHWC alike), sharing its storage: [count, C, H, W].
Tensor frame_view(const Tensor& frames, int64_t start, int64_t count = 1);
//
// A VaeStream is one clip in progress through one part (encoder or decoder) of one model. It is
// not thread-safe; several streams of one model may exist (each has its own caches) but they
// share the model's backend, so callers serialise engine calls on it as for encode()/decode().
class VaeStream {
 public:
  virtual ~VaeStream() = default;

  // Encoder: frames [N, 3, T, H, W] in [-1, 1] (any T >= 1; H, W multiples of downsample()).
  //   Frames are buffered until a chunk is complete (1 frame for the first chunk, then F); every
  //   completed chunk is encoded, and the raw posterior means of those latent frames are returned
  //   as [N, C, t, h, w] (t may be 0: an undefined Tensor is returned then).
  // Decoder: raw latents [N, C, t, h, w] (any t >= 1) -> frames [N, 3, T', H, W] in [-1, 1],
  //   T' = 1 + F*(t-1) for the clip's first push, F*t afterwards (nothing is buffered).
  // Every push after the first must have the first push's N, H and W.
  virtual Result<Tensor> push(const Tensor& x) = 0;

  // Ends the clip. Encoder: a partial chunk still buffered is completed by repeating its last
  // frame (as diffusers would encode the clip padded that way), encoded, and returned
  // ([N, C, 1, h, w]); *padded_frames (when not null) gets the number of repeated frames, which a
  // decoder's output drops again. Nothing buffered: an undefined Tensor and 0. Decoder: returns
  // an undefined Tensor. Afterwards the stream is reset (ready for a new clip).
  virtual Result<Tensor> finish(int* padded_frames = nullptr) = 0;

  // Drops the causal caches and buffered frames: the next push starts a new clip.
  virtual void reset() = 0;

  // Input frames held back waiting for a complete chunk (encoder; 0 for a decoder).
  virtual int frames_buffered() const = 0;
  // Input frames (encoder) or latent frames (decoder) pushed since the clip began.
  virtual int64_t frames_seen() const = 0;
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

  // Video mode. temporal_factor() is F above (1: an image model with no video mode). A video
  // model's encode()/decode() above still take single frames [N, C, H, W] (each frame a clip of
  // one frame), so image mode keeps working for every model.
  virtual int temporal_factor() const { return 1; }
  bool supports_video() const { return temporal_factor() > 1; }
  // Opens a stream over the encoder (`encoder` true) or the decoder; an image model, or a
  // part that was not loaded, is an error naming the model.
  virtual Result<std::unique_ptr<VaeStream>> open_stream(bool encoder);
  // Whole clips through one stream (for latent-tool run and the model tests):
  // sample [N, 3, 1 + F*k, H, W] -> raw latent means [N, C, 1 + k, h, w]. A T that is not
  // 1 + F*k is padded by repeating the last frame (see VaeStream::finish).
  Result<Tensor> encode_video(const Tensor& sample);
  // latent [N, C, t, h, w] -> sample [N, 3, 1 + F*(t-1), H, W].
  Result<Tensor> decode_video(const Tensor& latent);

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
