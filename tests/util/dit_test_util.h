// Helpers shared by the DiT loop tests on the CPU (tests/model/test_denoise_loop.cpp) and on the
// GPU (tests/gpu/test_cuda_dit_model.cpp): the denoising-loop cases of a fixture root
// (io_denoise.safetensors of scripts/make_dit_fixtures.py) as requests to the loop.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/backends/backend.h"
#include "engine/models/dit/denoise.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/safetensors.h"

namespace latent::test {

// A tensor of a fixture file; missing, an undefined tensor (a test failure unless `optional`).
Tensor fixture_tensor(const SafetensorsFile& f, const std::string& name, bool optional = false);

// One case of a transformer fixture file (io_transformer.safetensors of
// scripts/make_dit_fixtures.py at `path`, e.g. case "masked_batch": B = 2, padded text): its inputs
// on `backend`, and diffusers' output (`<case>.sample`).
MmditInputs transformer_case_inputs(Backend& backend, const std::string& path,
                                    const std::string& case_name);
Tensor transformer_case_sample(const std::string& path, const std::string& case_name);

// A DiT fixture root (tests/fixtures/<name>) opened for its loop cases: the transformer on
// `backend`, the scheduler config and io_denoise.safetensors. What fails to load is a test
// failure and stays empty.
struct DenoiseFixture {
  std::shared_ptr<Backend> backend;
  std::shared_ptr<SafetensorsFile> io;
  nlohmann::json cases;  // per case: steps, true_cfg_scale, strength, seed
  std::unique_ptr<QwenImageMmdit> model;
  FlowMatchSchedulerConfig scheduler;
};
DenoiseFixture open_denoise_fixture(const std::string& name, std::shared_ptr<Backend> backend);

// Case `c`'s prompt embeddings: `prefix` "" for the prompt, "negative_" for the negative one
// (undefined when the case has none).
PromptEmbeds case_embeds(const DenoiseFixture& f, const std::string& c, const std::string& prefix);
// Case `c` as diffusers ran it: steps, CFG scale, strength, noise, image and reference latents,
// prompts.
DenoiseRequest case_request(const DenoiseFixture& f, const std::string& c);

// Latent packing on `device`'s backend in fp32 and bf16 against the host packing (pack_latents()
// of what the backend holds): a random latent [1, 16, 1, 6, 8] uploaded as upload_latent() makes
// it ([1, 16, 6, 8]; in NHWC where `nhwc`) and row-major is packed, and unpacked again. Then
// `more(backend, packed)` with the packed [1, 12, 64] on the backend.
void check_backend_packing(const char* device, bool nhwc,
                           const std::function<void(Backend&, const Tensor&)>& more);

}  // namespace latent::test
