// LoRA files for the Qwen-Image transformer (QwenImageTransformer2DModel), in the layouts users
// download, read into one form: per linear layer (by its diffusers module name, e.g.
// "transformer_blocks.3.attn.to_q"), down [rank, in], up [out, rank] and alpha. Applied as
//   W' = W + strength * (alpha / rank) * up @ down
// either merged into the weights at load, or at run time (QwenImageMmdit, LoraMode).
//
// Layouts (the key of one module's tensors; <m> is the diffusers module name):
//   diffusers / PEFT  transformer.<m>.lora_A.weight, .lora_B.weight (also without "transformer.",
//                     and PEFT's ".lora_A.default.weight"); alpha from a "<m>.alpha" tensor, else
//                     from the file's adapter metadata (__metadata__ "lora_adapter_metadata":
//                     lora_alpha / alpha_pattern, bare or under "transformer."), else alpha = rank
//   ComfyUI           diffusion_model.<m>.lora_down.weight, .lora_up.weight, .alpha
//                     (ComfyUI also reads diffusion_model.<m>.lora_A/.lora_B: accepted)
//   kohya             lora_unet_<m with '.' as '_'>.lora_down.weight, .lora_up.weight, .alpha
//   bare              <m>.lora_down.weight, .lora_up.weight, .alpha (Qwen-Image-Lightning V1)
// Qwen-Image-Lightning's later files are the ComfyUI layout. A missing .alpha means alpha = rank
// (scale 1), as diffusers and ComfyUI read it.
//
// GStreamer-free; the file is read on the host (any of F32/BF16/F16) and kept in fp32.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace latent {

struct QwenImageMmditConfig;

enum class LoraLayout : uint8_t { kDiffusers, kComfyUI, kKohya, kBare };
const char* lora_layout_name(LoraLayout layout);  // "diffusers/PEFT", "ComfyUI", ...

// One adapted linear layer.
struct LoraModule {
  std::string module;    // diffusers module name: "transformer_blocks.0.attn.to_q", "img_in"
  std::string down_key;  // the file's key of down (for messages)
  std::string up_key;
  Tensor down;  // [rank, in] host fp32
  Tensor up;    // [out, rank] host fp32
  float alpha = 0.f;
  int64_t rank() const { return down.dim(0); }
  int64_t in_features() const { return down.dim(1); }
  int64_t out_features() const { return up.dim(0); }
  float scale() const { return alpha / static_cast<float>(rank()); }  // alpha / rank
};

struct LoraFile {
  std::string path;
  LoraLayout layout = LoraLayout::kDiffusers;
  // Where alpha came from: ".alpha tensors", "adapter metadata", "none (alpha = rank)", or a mix.
  std::string alpha_source;
  std::vector<LoraModule> modules;  // sorted by module name

  // The rank(s) and alpha(s) seen, for descriptions ("16", "16-64").
  std::string rank_summary() const;
  std::string alpha_summary() const;
  // The inner dim of the transformer it was made for (in_features of the block attention
  // projections; 3072 for Qwen-Image 20B) and the number of blocks it touches (max index + 1);
  // -1 when it adapts none of them.
  int64_t inner_dim() const;
  int64_t blocks_touched() const;
};

// The linear layers of a Qwen-Image transformer a LoRA may adapt: diffusers module name ->
// weight shape {out, in}, for `config`.
std::map<std::string, std::pair<int64_t, int64_t>> qwen_image_lora_targets(
    const QwenImageMmditConfig& config);

// Reads a LoRA file, recognises its layout and maps every key to a Qwen-Image module. Errors
// name the file and key: a key of no known form, a module the Qwen-Image transformer does not
// have, a down without its up (or the reverse), ranks that disagree, a non-2-D or non-finite
// tensor. A file whose keys are for another model (FLUX, Wan, SD/SDXL UNets, text encoders) is
// refused with a sentence saying which model it looks like.
Result<LoraFile> load_lora_file(const std::string& path);

// Checks a loaded LoRA against a transformer's config: each module exists at this depth and its
// down / up match the weight's shape (a LoRA for Qwen-Image 20B on a smaller model is refused in
// one sentence).
Status check_lora_fits(const LoraFile& lora, const QwenImageMmditConfig& config);

// Whether a safetensors file's keys look like a LoRA (lora_A / lora_down / .alpha keys), for
// `latent-tool inspect`.
bool looks_like_lora_keys(const std::vector<std::string>& keys);

// Several lines for latent-tool inspect: layout, modules, rank, alpha, the base model it fits.
std::string describe_lora(const LoraFile& lora);

// "FILE[:STRENGTH]" (strength 1 when absent; a Windows-style or colon-containing path keeps
// its colons unless the text after the last colon is a number).
struct LoraSpec {
  std::string path;
  float strength = 1.f;
};
Result<LoraSpec> parse_lora_spec(const std::string& text);
// A comma-separated list of specs ("style.safetensors:0.8,lightning.safetensors:1.0"); empty
// text gives an empty list.
Result<std::vector<LoraSpec>> parse_lora_list(const std::string& text);
// The list as text again (the element's property getter).
std::string format_lora_list(const std::vector<LoraSpec>& specs);

// How a transformer applies its LoRAs.
enum class LoraMode : uint8_t {
  kMerged,   // added into the weights at load: no cost per step; strengths fixed
  kRuntime,  // x @ down^T @ up^T * scale added to each adapted linear's output: strengths can
             // change between forwards (set_lora_strengths), at a cost per step
};
const char* lora_mode_name(LoraMode mode);
Result<LoraMode> parse_lora_mode(const std::string& text);  // "merged" | "runtime"

}  // namespace latent
