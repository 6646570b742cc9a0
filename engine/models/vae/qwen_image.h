// diffusers AutoencoderKLQwenImage / AutoencoderKLWan (the Wan 2.1 causal 3-D VAE; Qwen-Image
// fine-tuned it): images and video.
//
// Video mode (qwen_image.cpp): every causal 3-D convolution runs over the frames of a chunk
// ([T, C, H, W], frames along the batch axis) with the last two input frames of the previous
// chunk in front (the per-layer cache; zeros at the start of a clip, as diffusers' causal
// padding): as one Backend::conv3d_frames() where the backend has it (CUDA: cuDNN), else as
// three 2-D convolutions, one per temporal tap, accumulated through conv2d's residual input. The
// temporal resamplers' time_conv runs from the second chunk on, as in diffusers. Chunks are
// diffusers': encode frame 0 alone, then 4 frames per latent frame; decode one latent frame at a
// time (1 frame, then 4).
//
// Image mode (encode()/decode() on [N, C, H, W]): each image is a one-frame clip, so every
// causal convolution meets data only through its last temporal tap and no time_conv runs.
//
// The loader (qwen_image_loader.cpp) takes diffusers folders (config.json) and the original
// Wan-Video / ComfyUI single files (`Wan2.1_VAE.safetensors`, `qwen_image_vae.safetensors`), whose
// key names it maps and whose configuration it reads from the weight shapes.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/weights/config.h"
#include "engine/weights/safetensors.h"

namespace latent {

// The diffusers config of AutoencoderKLQwenImage (defaults: Qwen-Image / Wan 2.1).
struct QwenImageVaeConfig {
  int64_t base_dim = 96;
  int64_t decoder_base_dim = 0;  // AutoencoderKLWan's decoder width; 0: base_dim
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  // Down levels (scale 1, 1/2, ...) with attention blocks; diffusers cannot run a model where
  // one matches, so parse/infer refuse those.
  std::vector<double> attn_scales;
  std::vector<bool> temperal_downsample = {false, true, true};
  int64_t input_channels = 3;
  std::vector<double> latents_mean;  // z_dim entries
  std::vector<double> latents_std;

  // Spatial reduction: 2 ^ (len(dim_mult) - 1).
  int downsample() const { return 1 << (dim_mult.size() - 1); }
  int64_t decoder_dim() const { return decoder_base_dim > 0 ? decoder_base_dim : base_dim; }
  // Frames per latent frame: 2 ^ (temporal resamplers among the len(dim_mult) - 1 levels).
  int temporal_factor() const {
    int f = 1;
    for (size_t i = 0; i + 1 < dim_mult.size() && i < temperal_downsample.size(); ++i)
      if (temperal_downsample[i]) f *= 2;
    return f;
  }
};

// The published Qwen-Image (= Wan 2.1) latent statistics, 16 channels each.
const std::vector<double>& qwen_image_latents_mean();
const std::vector<double>& qwen_image_latents_std();

// Reads and checks config.json (AutoencoderKLQwenImage, or AutoencoderKLWan without the Wan 2.2
// residual blocks / patching). Errors name the file and key.
Result<QwenImageVaeConfig> parse_qwen_image_vae_config(const Config& config);

// "qwen-image" for the published statistics (Qwen-Image and Wan 2.1 share them), else
// "qwen-image-vae-custom".
std::string qwen_image_latent_space_name(const std::vector<double>& mean,
                                         const std::vector<double>& std);

// How a checkpoint names its tensors.
struct QwenImageVaeLayout {
  bool original = false;  // Wan-Video / ComfyUI names (encoder.downsamples.0.residual.0.gamma)
  std::string prefix;     // common prefix of the VAE keys ("" or e.g. "first_stage_model.")
};

// Detects the layout from the key names; an error names what was looked for, and rejects the
// Wan 2.2 VAE (residual down/up blocks), which is a different network.
Result<QwenImageVaeLayout> detect_qwen_image_vae_layout(const WeightStore& weights);

// The stored name of the diffusers parameter `name` in the original layout
// ("decoder.up_blocks.1.resnets.0.norm1.gamma" -> "decoder.upsamples.4.residual.0.gamma" for
// num_res_blocks 2). Names it does not know are returned unchanged.
std::string qwen_image_vae_original_name(const std::string& name, int64_t num_res_blocks);

// Reads the architecture of a checkpoint without config.json from its weight shapes (from the
// encoder when present, else from the decoder); the latent statistics are the published ones
// for z_dim 16, else identity.
Result<QwenImageVaeConfig> infer_qwen_image_vae_config(const WeightStore& weights,
                                                       const QwenImageVaeLayout& layout);

// `latent-tool inspect`'s description of a loaded model (one config item a line).
std::string describe_qwen_image_vae(const QwenImageVaeConfig& config,
                                    const QwenImageVaeLayout& layout,
                                    const std::string& config_path);

}  // namespace latent
