// What a Qwen-Image denoising loop reads besides the transformer, found and checked the same way
// for ditdenoise (elements/gstditdenoise.cpp) and latent-tool denoise (tools/dit_commands.cpp):
// the scheduler config of a model path, and prompt embeddings from a safetensors file.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/status.h"
#include "engine/models/dit/denoise.h"
#include "engine/models/dit/flow_match_scheduler.h"
#include "engine/weights/safetensors.h"

namespace latent {

struct ResolvedScheduler {
  FlowMatchSchedulerConfig config;
  // The scheduler_config.json read, or empty when Qwen-Image's published config was used.
  std::string path;
};

// The scheduler of `model` (what ditdenoise's `model` and latent-tool denoise's --model take):
//  - `explicit_path` when given (a scheduler_config.json; it must exist);
//  - <model>/scheduler/scheduler_config.json: a pipeline root, with or without model_index.json
//    (a partial download);
//  - <parent>/scheduler/scheduler_config.json for a transformer/ folder or a .safetensors file
//    in a pipeline root;
//  - else Qwen-Image's published scheduler config (path empty; callers say so).
// A config that is found but unreadable or invalid is an error, never replaced by the default.
Result<ResolvedScheduler> resolve_flow_match_scheduler(const std::string& model,
                                                       const std::string& explicit_path = "");

// Prompt embeddings `name` [1, T, D] and optional `name`_mask [1, T] (float 1/0: valid/padding)
// of `file`, checked: rank, a T of at least 1, D == joint_dim (0: not checked), the mask's
// length and dtype, a mask that keeps at least one token. Values are copied (fp32), so the file
// need not stay open. `optional`: an absent `name` gives undefined embeddings, not an error.
Result<PromptEmbeds> read_prompt_embeds(const SafetensorsFile& file, const std::string& name,
                                        int64_t joint_dim, bool optional = false);

// The prompt of an embedding file as tools/compute_prompt_embeds.py writes it: `prompt_embeds`
// (+ `_mask`). For a negative prompt file (`negative`), `negative_prompt_embeds` is taken when
// the file has no `prompt_embeds`.
Result<PromptEmbeds> load_prompt_embeds(const std::string& path, bool negative, int64_t joint_dim);

}  // namespace latent
