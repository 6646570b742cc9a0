// diffusers QwenImageTransformer2DModel: the Qwen-Image MMDiT (also Qwen-Image-Edit 2509, and
// Qwen-Image-Edit-2511 with zero_cond_t), on any backend with the DiT ops of backend.h.
//
// The network, as diffusers 0.42.1 computes it (transformer_qwenimage.py):
//   img = img_in(hidden_states)                              // packed 2x2 latent patches
//   txt = txt_in(txt_norm(encoder_hidden_states))            // RMSNorm, eps 1e-6
//   temb = timestep_embedder(Timesteps(256, flip_sin_to_cos, shift 0, scale 1000)(timestep))
//   per block (dual stream): AdaLN-Zero modulation from silu(temb) (img_mod / txt_mod: shift,
//     scale, gate for attention and MLP), LayerNorm(no affine, eps 1e-6), Q/K/V per stream, RMS
//     QK norm per head, 3-D RoPE (QwenEmbedRope, scale_rope), joint attention over
//     [text, image] with the text padding mask, gated residuals, GELU(tanh) MLPs (4x)
// Two liberties that change no image token (masked keys never contribute; a text token's own
// output never reaches the image stream or the output): right padding of the text is cut to the
// batch's longest prompt before the blocks, and the joint sequence runs as [image, text] (the
// attention is equivariant in query order and invariant in key order), so that what padding
// remains is a tail of every key row (Backend::attention's key_lengths).
//   out = proj_out(AdaLayerNormContinuous(img, temb))        // scale first, then shift
// zero_cond_t: the timestep batch is [t, 0]; the first image's tokens (the target) are modulated
// with t, every later image's (the references) with t = 0; text and norm_out use t.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/models/dit/lora.h"
#include "engine/weights/config.h"
#include "engine/weights/model_source.h"
#include "engine/weights/safetensors.h"

namespace latent {

// transformer/config.json (defaults: Qwen-Image).
struct QwenImageMmditConfig {
  int64_t patch_size = 2;
  int64_t in_channels = 64;
  int64_t out_channels = 16;
  int64_t num_layers = 60;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 3584;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  bool zero_cond_t = false;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  // Features of one output token: patch_size^2 * out_channels.
  int64_t out_features() const { return patch_size * patch_size * out_channels; }
};

// Reads and checks config.json; refuses what diffusers 0.42.1 cannot run or we do not implement
// (guidance_embeds, use_additional_t_cond / use_layer3d_rope of Qwen-Image-Layered), naming the
// file and key.
Result<QwenImageMmditConfig> parse_qwen_image_mmdit_config(const Config& config);

// The prefix of a checkpoint's keys before the diffusers names: "model.diffusion_model." or
// "diffusion_model." (ComfyUI's single files), else "".
std::string qwen_image_mmdit_key_prefix(const WeightStore& store);
// The config of a single-file checkpoint without config.json, from its tensors' shapes: layers
// (transformer_blocks.N), inner and head dims (img_in, attn.norm_q), in / out channels (img_in,
// proj_out, patch 2), joint_attention_dim (txt_in). axes_dims_rope is Qwen-Image's [16, 56, 56],
// so heads must have 128 dims; zero_cond_t (Qwen-Image-Edit-2511) is false: such a model needs
// its config.json beside the file (x.safetensors -> x.json).
Result<QwenImageMmditConfig> infer_qwen_image_mmdit_config(const WeightStore& store,
                                                           const std::string& prefix);

// One image of the token sequence, in patches: diffusers' img_shapes entry (frame, height,
// width). Its tokens are frames x height x width, row-major.
struct ImageShape {
  int64_t frames = 1;
  int64_t height = 0;
  int64_t width = 0;
  int64_t tokens() const { return frames * height * width; }
  bool operator==(const ImageShape& o) const {
    return frames == o.frames && height == o.height && width == o.width;
  }
};

// The rotary table of a [text, image 0, image 1, ...] sequence exactly as QwenEmbedRope
// (scale_rope=True) builds it: image i takes frame positions i.. i+frames-1, centred row and
// column positions -(h - h/2) .. h/2 - 1 (likewise for w); text token j takes position
// max_i(max(h_i/2, w_i/2)) + j on all three axes. Angles pos / theta^(2k/dim) per axis, in fp32
// like torch. -> [text_len + sum tokens, head_dim/2, 2] (cos, sin), fp32 host tensor.
Result<Tensor> qwen_image_rope_table(const std::vector<int64_t>& axes_dims,
                                     const std::vector<ImageShape>& images, int64_t text_len);

// diffusers' get_timestep_embedding(timesteps, 256, flip_sin_to_cos=True,
// downscale_freq_shift=0, scale=1000): [n, 256] = [cos, sin] of t * 1000 * 10000^(-k/128).
Tensor qwen_image_timestep_proj(const std::vector<float>& timesteps);

// How forward() runs a text mask (B x T_txt host values, nonzero = valid; empty = all valid).
struct TextPadding {
  int64_t kept = 0;  // text tokens the blocks run: all of them, or the longest valid prefix
  // Every row is a valid prefix then padding (the pipelines' right padding, or no padding):
  // `lengths` holds each row's valid tokens and the text is cut to `kept` = max(lengths, 1).
  // Otherwise (a hole somewhere) nothing is cut and `lengths` is empty.
  bool prefix = false;
  std::vector<int64_t> lengths;
};
TextPadding qwen_image_text_padding(const std::vector<float>& mask, int64_t batch, int64_t t_txt);

struct MmditInputs {
  Tensor hidden_states;          // [B, T_img, in_channels] on the backend: every image's tokens
  Tensor encoder_hidden_states;  // [B, T_txt, joint_attention_dim] on the backend
  // B x T_txt host values, nonzero = valid token, 0 = padding; empty = every token valid.
  std::vector<float> encoder_hidden_states_mask;
  std::vector<float> timestep;  // B values: diffusers' `timestep` (the pipelines pass t/1000)
  std::vector<ImageShape> img_shapes;  // the images of hidden_states in order (target first)
  // Optional, on the backend: qwen_image_timestep_proj() of `timestep` (with zero_cond_t and
  // reference images, B zeros appended: [2B, 256]), computed ahead so a loop uploads all its
  // steps' projections at once; undefined: forward() computes and uploads it.
  Tensor timestep_proj;
  // false: run every text token with the full mask, as diffusers does (tests compare the two).
  bool trim_text_padding = true;
};

// The LoRAs a transformer loads with (lora.h), in order; they stack.
struct MmditLoras {
  std::vector<LoraSpec> specs;
  LoraMode mode = LoraMode::kMerged;
};

// How the blocks' linear layers hold their weights. kFp8 (ditdenoise / latent-tool dtype fp8):
// each weight quantised at load to FP8 e4m3 with one scale per output channel, and each input
// per token at run time (backend.h, Fp8Matrix), on FP8 tensor cores where the backend has them
// (CUDA on Hopper; the CPU emulates the same arithmetic). The 60 blocks' 14 linear layers each
// (attention projections, MLPs, modulation): ~99.7 % of Qwen-Image's parameters; the top-level
// layers (img_in, txt_in, the timestep MLP, norm_out, proj_out), norms and attention stay in the
// compute dtype. Merged LoRAs are merged before the quantisation; runtime LoRAs' low-rank
// products run in the compute dtype on the layer's input.
enum class LinearFormat : uint8_t { kComputeDtype, kFp8 };

// Holds the weights on its backend; forward() caches the rotary table of the last shapes, so one
// model runs one forward at a time (callers serialise, as the denoising loop does).
class QwenImageMmdit {
 public:
  // `source` as resolve_model_source(path, "transformer") gives it: a transformer/ folder with
  // config.json and (sharded) safetensors, or a pipeline root.
  // `loras`: LoRA files to apply (merged into the weights, or kept for run time); any file that
  // does not load or does not fit this transformer fails the load, naming the file and key.
  // `linears`: kFp8 needs a backend with FP8 linear layers (supports_fp8_linear()) or the CPU
  // (emulated); elsewhere the load fails saying so.
  static Result<std::unique_ptr<QwenImageMmdit>> load(
      const ModelSource& source, std::shared_ptr<Backend> backend, const MmditLoras& loras = {},
      LinearFormat linears = LinearFormat::kComputeDtype);
  static Result<std::unique_ptr<QwenImageMmdit>> load(
      const std::string& path, std::shared_ptr<Backend> backend, const MmditLoras& loras = {},
      LinearFormat linears = LinearFormat::kComputeDtype);
  ~QwenImageMmdit();

  const QwenImageMmditConfig& config() const { return config_; }
  Backend& backend() const { return *backend_; }
  const ModelSource& source() const { return source_; }
  int64_t parameters() const { return parameters_; }
  LinearFormat linear_format() const { return linear_format_; }
  // One line per config item (latent-tool).
  std::string description() const;

  // The LoRAs loaded with the model, with their current strengths, and how they apply.
  const std::vector<LoraSpec>& loras() const { return loras_; }
  LoraMode lora_mode() const { return lora_mode_; }
  // Runtime mode only: new strengths, one per LoRA in load order, used from the next forward()
  // on (a few small backend ops per adapted layer, no file access). All at 0 give the base
  // model's output. A layer whose LoRA is folded into its GEMM (folded_lora_layers()) costs the
  // same at any strength; the others cost nothing at strength 0. Merged mode refuses (reload to
  // change them).
  Status set_lora_strengths(const std::vector<float>& strengths);
  // Runtime mode: how many adapted linear layers have their LoRAs folded into the layer's own
  // GEMM (the input written with the low-rank projections as extra columns, the up factors
  // appended to the weight: one GEMM a layer, the output written once). These are the blocks'
  // q/k/v, attention-output and MLP layers, unless they are held in FP8 or LATENT_LORA_FOLD=0;
  // the rest (the modulations, top-level layers) add their two low-rank GEMMs.
  int64_t folded_lora_layers() const { return folded_lora_layers_; }

  // The transformer's forward: -> sample [B, T_img, patch_size^2 * out_channels] (diffusers'
  // output `sample`, flow velocity for every image token).
  Result<Tensor> forward(const MmditInputs& in);

  // On backends that capture graphs (CUDA), forward() records its device work as a graph the
  // second time it sees the same input shapes (and text mask), and replays it from the third
  // on: one launch a step instead of ~2,000 (the gaps between them were ~6 % of an H100 step).
  // The first two forwards of a shape run plainly (the first chooses every GEMM and attention
  // plan); a capture that fails warns once and that shape runs plainly from then on. A graph
  // keeps its own activation memory (one forward's worth a shape, at most two shapes). On by
  // default; off with LATENT_DIT_GRAPHS=0 or set_forward_graphs(false). Runtime LoRA strength
  // changes drop them.
  void set_forward_graphs(bool on);
  bool forward_graphs() const { return graphs_enabled_; }
  // How many forwards replayed a graph so far (tests, logs).
  int64_t graph_replays() const { return graph_replays_; }

  // Every block's modulation (img_mod / txt_mod: a linear of silu(temb)) depends on the timestep
  // alone, and reads a third of the weights (two [6D, D] matrices a block). Kept for the last
  // kCachedModulations timestep vectors, a denoising loop that runs the same schedule frame after
  // frame (live few-step img2img) computes them once per timestep instead of once per forward;
  // runtime LoRA strength changes drop them. On by default; off with LATENT_DIT_MOD_CACHE=0 or
  // set_modulation_cache(false) (a step benchmark that repeats one timestep measures a full step
  // only without it).
  void set_modulation_cache(bool on);
  bool modulation_cache() const { return mod_cache_enabled_; }
  // Forwards that took their modulation from the cache (tests, logs).
  int64_t modulation_cache_hits() const { return mod_cache_hits_; }

  // qwen_image_timestep_proj(timesteps) uploaded to the backend ([n, 256]), for
  // MmditInputs::timestep_proj. The last one is kept: asked again for the same values (a
  // denoising loop over the same schedule, frame after frame), it uploads nothing.
  Result<Tensor> timestep_projections(const std::vector<float>& timesteps);

  // Implementation details (qwen_image_mmdit.cpp).
  struct Weights;
  struct RuntimeLora;

 private:
  QwenImageMmdit() = default;
  // qwen_image_rope_table's rows in the attention's [image, text] order, on the backend.
  Result<Tensor> rope_table(const std::vector<ImageShape>& images, int64_t text_len);

  QwenImageMmditConfig config_;
  ModelSource source_;
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<Weights> w_;
  int64_t parameters_ = 0;
  std::map<std::string, int64_t> storage_dtypes_;
  LinearFormat linear_format_ = LinearFormat::kComputeDtype;
  int64_t fp8_layers_ = 0;  // linear layers held in FP8
  // kFp8: block i's linear layers quantised (their compute-dtype weights released); all blocks.
  Status quantize_block(size_t i);
  Status quantize_linears();
  // LoRAs (lora.h): what was loaded, and in runtime mode the adapted layers' low-rank factors.
  Status apply_loras(const MmditLoras& loras);
  std::vector<LoraSpec> loras_;
  LoraMode lora_mode_ = LoraMode::kMerged;
  std::vector<std::shared_ptr<RuntimeLora>> runtime_loras_;
  int64_t folded_lora_layers_ = 0;
  // Rebuilds every runtime LoRA's scaled factors for `strengths` (one per LoRA).
  Status set_runtime_strengths(const std::vector<float>& strengths);
  // The rotary tables and joint key masks ([B, T_img + T_txt], the attention's [image, text]
  // order, T_txt as cut) of the last two forwards' inputs
  // on the backend: a denoising loop repeats them every step (with separate CFG passes it
  // alternates two), so they are uploaded once.
  static constexpr size_t kCachedInputs = 2;
  struct CachedRope {
    std::vector<ImageShape> images;
    int64_t text_len = 0;
    Tensor table;
  };
  struct CachedMask {
    Shape shape;
    std::vector<float> values;
    Tensor mask;
  };
  std::vector<CachedRope> ropes_;
  std::vector<CachedMask> key_masks_;
  // The last timestep_projections().
  std::vector<float> proj_timesteps_;
  Tensor proj_;
  // The modulations of the last few timestep vectors (set_modulation_cache): [blocks * (G*B + B),
  // 6D], block i's image rows (G*B) then its text rows (B).
  static constexpr size_t kCachedModulations = 16;
  struct CachedModulation {
    std::vector<float> timesteps;  // as forward() runs them (zero_cond_t's zeros appended)
    int64_t batch = 0;
    Tensor mods;
  };
  std::vector<CachedModulation> mods_;
  bool mod_cache_enabled_ = true;
  // dtype fp8 unless LATENT_FP8_ATTENTION=0 / 1: joint_qk codes q and k with static bounds
  bool fp8_qk_codes_ = false;
  int64_t mod_cache_hits_ = 0;
  // Graphs of forward()'s device work, one per input shape (see set_forward_graphs); declared
  // after w_ so they go first (a graph reads the weights in place).
  struct ForwardKey {
    Shape hs, ehs, proj, mods;
    int64_t t_run = 0;
    std::vector<int64_t> img_groups, key_lengths;
    Tensor rope, key_mask;  // the cached uploads, compared by identity
    bool matches(const ForwardKey& o) const;
  };
  // body(hs, ehs, proj, mods): mods undefined where the body computes the modulations itself.
  using ForwardBody =
      std::function<Result<Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>;
  struct ForwardGraph;
  Result<Tensor> run_graphed(const ForwardKey& key, const ForwardBody& body, const Tensor& hs,
                             const Tensor& ehs, const Tensor& proj, const Tensor& mods);
  Status capture_forward(ForwardGraph& g, const ForwardBody& body, const Tensor& hs,
                         const Tensor& ehs, const Tensor& proj, const Tensor& mods,
                         const Tensor& example_out);
  // Every block's modulation rows for the timestep projections `proj` ([G*B, 256]): the
  // cached one for `timesteps` when there is one (set_modulation_cache), else computed (and
  // kept); undefined when the cache is off.
  Result<Tensor> modulations(const std::vector<float>& timesteps, int64_t batch,
                             const Tensor& proj);
  bool graphs_enabled_ = true;
  int64_t graph_replays_ = 0;
  std::vector<std::unique_ptr<ForwardGraph>> graphs_;
};

}  // namespace latent
