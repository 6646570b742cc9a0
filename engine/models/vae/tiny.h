// diffusers AutoencoderTiny: the TAESD family (taesd, taesdxl, taesd3, taef1, and taef2 with its
// mid-block group-norm "pool"), from a diffusers folder or from madebyollin's published files.
//
// Stored layouts of the layer lists (diffusers' `layers` Sequential indices; taesd.py's decoder
// Sequential starts with a Clamp, so its indices are one higher):
//   diffusers            encoder.layers.N.*      decoder.layers.N.*
//   taesd.py module      encoder.N.*             decoder.(N+1).*
//   ComfyUI              taesd_encoder.N.*       taesd_decoder.(N+1).*
//   separate files       N.*  (taesd_encoder)    (N+1).*  (taesd_decoder)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/config.h"
#include "engine/weights/safetensors.h"

namespace latent {

struct AutoencoderTinyConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<int64_t> encoder_block_out_channels{64, 64, 64, 64};
  std::vector<int64_t> decoder_block_out_channels{64, 64, 64, 64};
  std::vector<int64_t> num_encoder_blocks{1, 3, 3, 3};
  std::vector<int64_t> num_decoder_blocks{3, 3, 3, 1};
  int64_t latent_channels = 4;
  std::string act_fn = "relu";
  double latent_magnitude = 3.0;  // scale_latents()/unscale_latents() only; not used here
  double latent_shift = 0.5;
  double scaling_factor = 1.0;
  double shift_factor = 0.0;
  std::string latent_space;  // our own config key
  // FLUX.2 (taef2): Block.pool = 1x1 conv C->4C, GroupNorm(4), ReLU, 1x1 conv 4C->C added to the
  // block input, in the blocks of the encoder's last stage and the decoder's first stage.
  bool encoder_pool = false;
  bool decoder_pool = false;

  int encoder_downsample() const { return 1 << (num_encoder_blocks.size() - 1); }
  int decoder_upsample() const { return 1 << (num_decoder_blocks.size() - 1); }
  Activation activation() const;
  static Result<AutoencoderTinyConfig> from_config(const Config& config);
  nlohmann::json to_json() const;  // config.json keys (not the pool flags, read from weights)
};

// Where one part's layer list lives.
struct TinyPartLayout {
  bool present = false;
  std::string prefix;  // store name of layer N is prefix + (N + offset)
  int offset = 0;
};
struct AutoencoderTinyLayout {
  TinyPartLayout encoder, decoder;
  std::string form;  // "diffusers", "taesd.py module", "ComfyUI", "taesd_encoder file", ...
};

// Finds the TAESD layer lists in a store; false when there are none.
bool detect_autoencoder_tiny_layout(const WeightStore& weights, AutoencoderTinyLayout* layout);

// Reads the stages of one part from the weight shapes (single files have no config.json);
// fills that part's fields of `cfg` (and latent / in / out channels, pool).
Status infer_autoencoder_tiny_encoder(const WeightStore& weights, const TinyPartLayout& part,
                                      AutoencoderTinyConfig* cfg);
Status infer_autoencoder_tiny_decoder(const WeightStore& weights, const TinyPartLayout& part,
                                      AutoencoderTinyConfig* cfg);

// ---- Between the loader (tiny_loader.cpp) and the network (tiny.cpp) ------------------------
class WeightBinder;
// The checks from_config() runs, for a configuration read off single files.
Status validate_autoencoder_tiny_config(const AutoencoderTinyConfig& cfg, const std::string& what);
// Whether a part holds taef2's mid-block group norm ("pool") tensors.
bool autoencoder_tiny_part_has_pool(const WeightStore& weights, const TinyPartLayout& part);
// Builds the network of `cfg` and takes the encoder's parameters from `encoder` and the
// decoder's from `decoder` (either may be null: that part is not loaded; both may be the same
// binder), then checks each binder for missing and unexpected tensors. `info` is completed
// (parameters per part, storage dtypes) and becomes the model's.
Result<std::unique_ptr<VaeModel>> bind_autoencoder_tiny(std::shared_ptr<Backend> backend,
                                                        const AutoencoderTinyConfig& cfg,
                                                        WeightBinder* encoder,
                                                        WeightBinder* decoder, ModelInfo info);

}  // namespace latent
