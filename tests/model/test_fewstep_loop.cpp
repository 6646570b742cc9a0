// Few-step schedules of distilled Qwen-Image models (Qwen-Image-Lightning's scheduler config, a
// fixed shift, a base/max shift variant) at 4 and 8 steps, with guidance off (true_cfg_scale 1
// with a negative prompt given: one pass per step), against diffusers' FlowMatchEulerDiscrete-
// Scheduler and QwenImagePipeline (tests/fixtures/dit_lora, scripts/make_dit_lora_fixtures.py),
// one loop with the Lightning-layout LoRA loaded.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/models/dit/denoise.h"
#include "engine/models/dit/flow_match_scheduler.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/config.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

std::string fixture(const std::string& name) { return test::fixtures_dir() + "/" + name; }

nlohmann::json cases() {
  std::ifstream in(fixture("dit_lora/cases.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

FlowMatchSchedulerConfig config_of(const nlohmann::json& all, const std::string& name) {
  auto c = parse_flow_match_scheduler_config(
      Config(all["schedules"]["configs"][name], name + "/scheduler_config.json"));
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : FlowMatchSchedulerConfig{};
}

TEST(FewStepSchedules, MatchDiffusersAtFourAndEightSteps) {
  const nlohmann::json all = cases();
  const auto& list = all["schedules"]["cases"];
  ASSERT_EQ(list.size(), 18u);
  for (const auto& c : list) {
    const std::string name = c["config"].get<std::string>();
    const int steps = c["steps"].get<int>();
    const int64_t seq = c["image_seq_len"].get<int64_t>();
    SCOPED_TRACE(name + " steps " + std::to_string(steps) + " tokens " + std::to_string(seq));
    auto s = qwen_image_schedule(config_of(all, name), steps, seq);
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_EQ(s->timesteps.size(), c["timesteps"].size());
    ASSERT_EQ(s->sigmas.size(), c["sigmas"].size());
    for (size_t i = 0; i < s->timesteps.size(); ++i)
      EXPECT_NEAR(s->timesteps[i], c["timesteps"][i].get<double>(), 1e-4) << i;
    for (size_t i = 0; i < s->sigmas.size(); ++i)
      EXPECT_NEAR(s->sigmas[i], c["sigmas"][i].get<double>(), 1e-7) << i;
  }
  // Lightning's config ignores the image size (base_shift == max_shift): 4 steps at 24 and 16384
  // tokens are the same schedule.
  auto a = qwen_image_schedule(config_of(all, "lightning"), 4, 24);
  auto b = qwen_image_schedule(config_of(all, "lightning"), 4, 16384);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->sigmas, b->sigmas);
}

void run_loop(const std::string& name, const nlohmann::json& c, const nlohmann::json& all,
              LoraMode mode) {
  SCOPED_TRACE(name + " " + lora_mode_name(mode));
  MmditLoras loras;
  loras.mode = mode;
  for (const auto& l : c["loras"])
    loras.specs.push_back(
        {fixture("dit_lora/" + l[0].get<std::string>() + ".safetensors"), l[1].get<float>()});
  auto model = QwenImageMmdit::load(fixture("dit_qwen_image_tiny"), test::cpu_backend(), loras);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(fixture("dit_lora/io_fewstep.safetensors"));
  ASSERT_TRUE(io.ok()) << io.status().message();
  auto get = [&](const std::string& k) { return *(*io)->tensor(k); };
  DenoiseRequest req;
  req.steps = c["steps"].get<int>();
  req.true_cfg_scale = c["true_cfg_scale"].get<float>();
  req.noise = get("noise");
  req.prompt = {get("prompt_embeds"), get("prompt_embeds_mask").to_floats()};
  // Given, but guidance is off at true_cfg_scale <= 1.
  req.negative = {get("negative_prompt_embeds"), get("negative_prompt_embeds_mask").to_floats()};
  int steps_run = 0;
  auto out = qwen_image_denoise(**model, config_of(all, c["scheduler"].get<std::string>()), req,
                                [&](int, int) {
                                  ++steps_run;
                                  return true;
                                });
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(steps_run, req.steps);
  const Tensor ref = get(name + ".latents");
  ASSERT_EQ(out->latents.shape(), ref.shape());
  const double err = relative_l2(out->latents, ref);
  EXPECT_LT(err, 1e-3) << "relative L2 " << err;
  std::printf("%s (%s): relative L2 %.2e\n", name.c_str(), lora_mode_name(mode), err);
}

TEST(FewStepLoops, MatchQwenImagePipelineWithGuidanceOff) {
  const nlohmann::json all = cases();
  ASSERT_GE(all["loops"].size(), 5u);
  for (const auto& [name, c] : all["loops"].items()) {
    EXPECT_EQ(c["passes"].get<int>(), c["steps"].get<int>()) << "diffusers ran CFG in " << name;
    run_loop(name, c, all, LoraMode::kMerged);
    if (!c["loras"].empty()) run_loop(name, c, all, LoraMode::kRuntime);
  }
}

}  // namespace
}  // namespace latent
