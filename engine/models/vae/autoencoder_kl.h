// diffusers AutoencoderKL (SD 1.x/2.x, SDXL, SD3, FLUX.1 VAEs), from a diffusers folder or from
// an original LDM / SD single file ("encoder.down.0.block.0.norm1.weight", optionally under
// "first_stage_model." or "vae.").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/models/vae/vae.h"
#include "engine/weights/config.h"
#include "engine/weights/safetensors.h"

namespace latent {

struct AutoencoderKLConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels{64};
  int64_t layers_per_block = 1;
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  double scaling_factor = 0.18215;
  double shift_factor = 0.0;
  // Optional per-channel statistics (Playground-style configs): normalised =
  // (raw - mean) * scaling_factor / std.
  std::vector<double> latents_mean;
  std::vector<double> latents_std;
  // Our own config key: names the latent space explicitly.
  std::string latent_space;

  int downsample() const { return 1 << (block_out_channels.size() - 1); }
  // Reads a diffusers config.json, checking every value it uses.
  static Result<AutoencoderKLConfig> from_config(const Config& config);
  // The same keys as config.json (a single file's inferred configuration, to merge the keys of
  // an "x.json" beside "x.safetensors" over).
  nlohmann::json to_json() const;
};

// How the checkpoint names its tensors.
struct AutoencoderKLLayout {
  bool ldm = false;    // original LDM names ("encoder.down.0.block.0...") vs diffusers names
  std::string prefix;  // "", "first_stage_model.", "vae."
};

// Finds the AutoencoderKL tensors in a store; false when there are none.
bool detect_autoencoder_kl_layout(const WeightStore& weights, AutoencoderKLLayout* layout);
// The store name of a diffusers parameter name under `layout` (levels = len(block_out_channels)).
std::string autoencoder_kl_store_name(const std::string& diffusers_name,
                                      const AutoencoderKLLayout& layout, int levels);
// Infers the architecture of a checkpoint without config.json from its tensor shapes
// (norm_num_groups, which no tensor records, stays 32; the result is not validated).
Result<AutoencoderKLConfig> infer_autoencoder_kl_config(const WeightStore& weights,
                                                        const AutoencoderKLLayout& layout);

// The latent space name for known (channels, scaling, shift) combinations: "sd", "sdxl",
// "sd3", "flux1"; else "autoencoder-kl-<C>ch-s<scale>-t<shift>".
std::string autoencoder_kl_latent_space_name(int64_t channels, double scaling, double shift);
// A latent space named by a file or folder name ("taesdxl" -> "sdxl", "ae.safetensors" ->
// "flux1"); empty when the name says nothing. Checked in order: taesdxl, taesd3, taesd, taef1,
// taef2, sdxl, sd3, flux.
std::string latent_space_from_name(const std::string& path);

// ---- Between the loader (autoencoder_kl_loader.cpp) and the network (autoencoder_kl.cpp) -----
class WeightBinder;
// The checks from_config() runs, for a configuration inferred from a single file.
Status validate_autoencoder_kl_config(const AutoencoderKLConfig& cfg, const std::string& what);
// Builds the network of `cfg` and takes its parameters (diffusers names, `rename`d to the
// store's) from `binder`: the encoder (and quant_conv) and/or the decoder (and post_quant_conv).
// `info` is completed (parameters per part, storage dtypes) and becomes the model's.
Result<std::unique_ptr<VaeModel>> bind_autoencoder_kl(
    std::shared_ptr<Backend> backend, const AutoencoderKLConfig& cfg, const WeightStore& weights,
    WeightBinder& binder, const std::function<std::string(const std::string&)>& rename,
    bool encoder, bool decoder, ModelInfo info);

}  // namespace latent
