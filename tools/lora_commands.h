// latent-tool's LoRA options and `inspect` of LoRA files (engine/models/dit/lora.h).
//   run --part transformer ... --lora FILE[:STRENGTH] (repeatable) [--lora-mode merged|runtime]
//   denoise ...                --lora FILE[:STRENGTH] (repeatable) [--lora-mode merged|runtime]
//   inspect FILE.safetensors   says what a LoRA file is: layout, modules, rank, alpha, base model
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/models/dit/qwen_image_mmdit.h"

// The --lora values (one FILE[:STRENGTH] each, in order; they stack) and --lora-mode ("" =
// merged) as the transformer loads them. A bad strength or mode is an error naming it.
latent::Result<latent::MmditLoras> lora_options(const std::vector<std::string>& specs,
                                                const std::string& mode);

// `latent-tool inspect PATH` when PATH is a safetensors file whose keys look like a LoRA: prints
// what it is and returns the exit status (1 when it does not load or is for another model, with
// the reason); -1 when PATH is not a LoRA file (inspect it as a model).
int inspect_lora(const std::string& path);

// The usage lines of the LoRA options.
const char* lora_usage();
