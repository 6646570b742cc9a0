// The Qwen-Image denoising loop: text-to-image, img2img and edit, as diffusers' QwenImagePipeline,
// QwenImageImg2ImgPipeline and QwenImageEditPlusPipeline run it (diffusers 0.42.1), on latents
// that are already normalised ((raw - latents_mean) / latents_std, what our vaeencode emits).
//
//   latents = pack(noise)                               (img2img: pack(s0 * noise + (1 - s0) *
//   image)) for t in timesteps[begin:]:
//     v = transformer([latents, references], t / 1000, prompt)[:, :T]
//     with true CFG: u = transformer(..., negative prompt)[:, :T]
//                    comb = u + scale * (v - u);  v = comb * ||v|| / ||comb||   (per token)
//     latents = latents + (sigma_next - sigma) * v       (FlowMatchEulerDiscreteScheduler.step)
//   -> unpack(latents): normalised [1, 16, 1, h, w]
//
// The conditional and unconditional passes run as one batch of two (the shorter prompt padded
// and masked, which leaves every image token's result unchanged) unless asked otherwise.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/models/dit/flow_match_scheduler.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/models/vae/vae.h"

namespace latent {

// QwenImagePipeline._pack_latents: latents [1, C, 1, h, w] (or [1, C, h, w]), h and w even ->
// tokens [1, (h/2)(w/2), 4C], token (y, x) = channels-major 2x2 patch (c, dy, dx). Host tensors.
Result<Tensor> pack_latents(const Tensor& latents);
// _unpack_latents: [1, (h/2)(w/2), 4C] -> [1, C, 1, h, w]. Host tensors.
Result<Tensor> unpack_latents(const Tensor& packed, int64_t height, int64_t width);

// torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed)) in fp32: mt19937 24-bit
// uniforms and torch's 16-wide Box-Muller (normal_fill), so diffusers' randn_tensor on the CPU is
// reproduced (to float rounding of log/sin/cos). Needs at least 16 elements (torch uses another
// algorithm below that).
Result<Tensor> torch_randn(const Shape& shape, uint64_t seed);

struct PromptEmbeds {
  Tensor embeds;            // [1, T, joint_attention_dim] host (any dtype)
  std::vector<float> mask;  // T values (nonzero: valid); empty = all valid
  bool defined() const { return embeds.defined(); }
};

struct DenoiseRequest {
  int64_t height = 0;  // of the target latent (h, w: even); set from init_latents / noise if 0
  int64_t width = 0;
  int steps = 50;
  // < 1: img2img from init_latents (starts at a later step). With references too, the target
  // is noised from init_latents and the references stay attached (no diffusers pipeline does
  // both; each part follows its pipeline).
  double strength = 1.0;
  float true_cfg_scale = 4.0f;  // CFG runs when > 1 and a negative prompt is given
  uint64_t seed = 0;            // initial noise from torch_randn when `noise` is undefined
  Tensor noise;                 // explicit initial noise [1, 16, 1, h, w] host
  Tensor init_latents;          // img2img: normalised [1, 16, 1, h, w] (or [1, 16, h, w]) host
  std::vector<Tensor> reference_latents;  // edit: normalised [1, 16, 1, h_i, w_i] host, in order
  PromptEmbeds prompt;
  PromptEmbeds negative;  // undefined: no CFG
  bool batch_cfg = true;  // run the CFG pair as one batch of two
};

struct DenoiseResult {
  Tensor latents;  // normalised [1, 16, 1, h, w], host fp32
  Tensor noise;    // the initial noise used, [1, 16, 1, h, w]
  FlowMatchSchedule schedule;
};

// Called after each step (1-based `step` of `total`); return false to stop early (an error).
using DenoiseProgress = std::function<bool(int step, int total)>;

// The host form: uploads the inputs, runs qwen_image_denoise_on_backend() and downloads the
// result (latent-tool, tests, the CPU).
Result<DenoiseResult> qwen_image_denoise(QwenImageMmdit& model,
                                         const FlowMatchSchedulerConfig& scheduler,
                                         const DenoiseRequest& request,
                                         const DenoiseProgress& progress = {});

// ---- The loop on the model's backend --------------------------------------------------------
// Everything stays on the backend: packing, noising, both transformer passes, CFG combine and the
// Euler step are backend ops. Nothing is downloaded, and nothing is uploaded after the first
// step: the caller uploads the inputs; the model uploads the timestep projections of the whole
// schedule (before the first step), the rotary tables and text key masks (in the first step's
// passes), each only when it differs from the previous loop's (frame after frame with the same
// settings: none).

// The text side of a loop on the backend, built once per prompt (pair) and reusable for every
// loop with the same model (ditdenoise keeps it while its embedding files stay).
struct DenoisePrompts {
  // [1, T, D]; with batched CFG [2, T, D]: prompt, then negative, the shorter padded with
  // masked zero tokens.
  Tensor cond;
  std::vector<float> cond_mask;  // cond.dim(0) x T values (nonzero: valid); empty = all valid
  Tensor uncond;                 // unbatched CFG: the negative prompt [1, T', D]
  std::vector<float> uncond_mask;
  bool has_negative = false;
  bool batched = false;

  bool defined() const { return cond.defined(); }
};
// `negative` undefined: no CFG. batch_cfg: run the CFG pair as one batch of two.
Result<DenoisePrompts> upload_denoise_prompts(QwenImageMmdit& model, const PromptEmbeds& prompt,
                                              const PromptEmbeds& negative, bool batch_cfg = true);

// A host latent [1, C, 1, h, w] (or [1, C, h, w]) -> backend [1, C, h, w] in the backend's
// image layout (what device_latent_to_tensor() makes of a latent in device memory).
Result<Tensor> upload_latent(Backend& backend, const Tensor& host);

struct DeviceDenoiseRequest {
  int steps = 50;
  double strength = 1.0;        // < 1: img2img from init_latents
  float true_cfg_scale = 4.0f;  // CFG runs when > 1 and the prompts have a negative
  // Backend latents [1, C, h, w] (any layout the backend makes; or row-major [1, C, 1, h, w]).
  Tensor noise;                             // required: the initial noise; sets the target size
  Tensor init_latents;                      // img2img, or undefined
  std::vector<Tensor> reference_latents;    // edit references in order, or none
  const DenoisePrompts* prompts = nullptr;  // required
};

struct DeviceDenoiseResult {
  Tensor latents;  // normalised [1, C, h, w] on the backend, in its image layout
  FlowMatchSchedule schedule;
};

Result<DeviceDenoiseResult> qwen_image_denoise_on_backend(QwenImageMmdit& model,
                                                          const FlowMatchSchedulerConfig& scheduler,
                                                          const DeviceDenoiseRequest& request,
                                                          const DenoiseProgress& progress = {});

// What QwenImagePipeline does after the loop: denormalise with the VAE's latent statistics and
// decode. latents: normalised [1, 16, 1, h, w] (or [1, 16, h, w]) host -> [1, 3, 8h, 8w] host
// fp32 in [-1, 1].
Result<Tensor> decode_latents(VaeModel& vae, const Tensor& latents);

}  // namespace latent
