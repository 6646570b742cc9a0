// diffusers AutoencoderKLQwenImage / AutoencoderKLWan (the Wan 2.1 causal 3-D VAE; Qwen-Image
// fine-tuned it) and the Wan 2.2 VAE (AutoencoderKLWan with is_residual and patch_size 2):
// images and video.
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
// Wan 2.2: frames are cut into patch_size x patch_size patches (pixels as channels) before the
// encoder and put back after the decoder; each down/up level is one residual block whose
// shortcut is diffusers' AvgDown3D / DupUp3D (a fixed averaging / repeating of channels across
// 2x2 pixels and, where the level resamples in time, 2 frames), run as small convolutions.
//
// The loader (qwen_image_loader.cpp) takes diffusers folders (config.json) and the original
// Wan-Video / ComfyUI single files (`Wan2.1_VAE.safetensors`, `qwen_image_vae.safetensors`,
// `Wan2.2_VAE.safetensors`), whose key names it maps and whose configuration it reads from the
// weight shapes.
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
  // Channels of the first / last convolution (AutoencoderKLWan's in_channels = out_channels):
  // 3, or 3 * patch_size^2 for the Wan 2.2 VAE, whose frames are patchified first.
  int64_t input_channels = 3;
  // Wan 2.2: residual down/up blocks (WanResidualDownBlock / WanResidualUpBlock, with their
  // AvgDown3D / DupUp3D shortcuts) and 2x2 patches of pixels as channels.
  bool is_residual = false;
  int64_t patch_size = 1;
  std::vector<double> latents_mean;  // z_dim entries
  std::vector<double> latents_std;

  // Spatial reduction: 2 ^ (len(dim_mult) - 1) * patch_size.
  int downsample() const {
    return static_cast<int>((int64_t{1} << (dim_mult.size() - 1)) * patch_size);
  }
  // Channels of the frames a user passes (3).
  int64_t image_channels() const { return input_channels / (patch_size * patch_size); }
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

// The published Wan 2.2 latent statistics, 48 channels each.
const std::vector<double>& wan22_latents_mean();
const std::vector<double>& wan22_latents_std();

// Reads and checks config.json (AutoencoderKLQwenImage, or AutoencoderKLWan in the Wan 2.1
// layout or the Wan 2.2 one: is_residual, patch_size). Errors name the file and key.
Result<QwenImageVaeConfig> parse_qwen_image_vae_config(const Config& config);

// Wan 2.1 layout: "qwen-image" for the published 16-channel statistics (Qwen-Image and Wan 2.1
// share them), else "qwen-image-vae-custom". Wan 2.2 (`residual`): "wan2.2" for its published
// 48-channel statistics (the name TAEW2.2 uses for the same latents), else "wan2.2-vae-custom".
std::string qwen_image_latent_space_name(const std::vector<double>& mean,
                                         const std::vector<double>& std, bool residual = false);

// How a checkpoint names its tensors.
struct QwenImageVaeLayout {
  bool original = false;  // Wan-Video / ComfyUI names (encoder.downsamples.0.residual.0.gamma)
  std::string prefix;     // common prefix of the VAE keys ("" or e.g. "first_stage_model.")
  // The Wan 2.2 VAE: residual down/up blocks (encoder.down_blocks.0.resnets.0 /
  // encoder.downsamples.0.downsamples.0 in the original names).
  bool residual = false;
};

// Detects the layout from the key names; an error names what was looked for.
Result<QwenImageVaeLayout> detect_qwen_image_vae_layout(const WeightStore& weights);

// The stored name of the diffusers parameter `name` in the original layout
// ("decoder.up_blocks.1.resnets.0.norm1.gamma" -> "decoder.upsamples.4.residual.0.gamma" for
// num_res_blocks 2). `residual`: the Wan 2.2 names ("encoder.down_blocks.1.resnets.0.conv1.weight"
// -> "encoder.downsamples.1.downsamples.0.residual.2.weight", "decoder.up_blocks.0.upsampler.X"
// -> "decoder.upsamples.0.upsamples.<num_res_blocks + 1>.X"). Names it does not know are
// returned unchanged.
std::string qwen_image_vae_original_name(const std::string& name, int64_t num_res_blocks,
                                         bool residual = false);

// Reads the architecture of a checkpoint without config.json from its weight shapes (from the
// encoder when present, else from the decoder); the latent statistics are the published ones
// for z_dim 16 (Wan 2.1) and 48 (Wan 2.2), else identity.
Result<QwenImageVaeConfig> infer_qwen_image_vae_config(const WeightStore& weights,
                                                       const QwenImageVaeLayout& layout);

// `latent-tool inspect`'s description of a loaded model (one config item a line).
std::string describe_qwen_image_vae(const QwenImageVaeConfig& config,
                                    const QwenImageVaeLayout& layout,
                                    const std::string& config_path);

}  // namespace latent
