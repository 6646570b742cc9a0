// diffusers AutoencoderKLQwenImage (the Wan 2.1 causal 3-D VAE, fine-tuned for Qwen-Image) run on
// single images.
//
// On one frame every causal 3-D convolution (zero padding of 2 frames in front of a 3-tap
// kernel) meets data only through its last temporal tap, and the temporal resamplers
// (time_conv) are skipped for the first chunk, so the model is an ordinary 2-D network whose
// 3x3 kernels are weight[:, :, -1]. The loader takes diffusers folders (config.json) and the
// original Wan-Video / ComfyUI single files (`Wan2.1_VAE.safetensors`,
// `qwen_image_vae.safetensors`), whose key names it maps and whose configuration it reads from the
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

}  // namespace latent
