// FlowMatchEulerDiscreteScheduler schedules against diffusers (tests/fixtures/dit_scheduler,
// made by scripts/make_dit_fixtures.py): several configs (Qwen-Image's, a static shift, linear
// time shift, Karras, exponential, inverted), step counts, image sizes and strengths.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "engine/models/dit/flow_match_scheduler.h"
#include "engine/weights/config.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

nlohmann::json read_schedules() {
  std::ifstream in(test::fixtures_dir() + "/dit_scheduler/schedules.json");
  EXPECT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

FlowMatchSchedulerConfig config_of(const nlohmann::json& all, const std::string& name) {
  auto c = parse_flow_match_scheduler_config(Config(all["configs"][name], name + ".json"));
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.status().message());
  return c.ok() ? *c : FlowMatchSchedulerConfig{};
}

// Values agree to a few fp32 ulps (the arithmetic follows numpy's precision step by step).
void expect_close(const std::vector<float>& got, const nlohmann::json& want, double scale,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    EXPECT_NEAR(got[i], w, 2e-7 * std::max(scale, std::abs(w))) << what << " [" << i << "]";
  }
}

TEST(FlowMatchScheduler, SchedulesMatchDiffusers) {
  nlohmann::json all = read_schedules();
  ASSERT_GT(all["cases"].size(), 100u);
  int checked = 0, refused = 0;
  for (const auto& c : all["cases"]) {
    const std::string what = str_cat(
        c["config"].get<std::string>(), " steps ", c["steps"].get<int>(), " seq ",
        c["image_seq_len"].get<int64_t>(), c["qwen_sigmas"].get<bool>() ? " qwen" : " plain");
    SCOPED_TRACE(what);
    FlowMatchSchedulerConfig cfg = config_of(all, c["config"].get<std::string>());
    const int steps = c["steps"].get<int>();
    const int64_t seq = c["image_seq_len"].get<int64_t>();
    EXPECT_DOUBLE_EQ(calculate_shift(cfg, seq), c["mu"].get<double>());
    if (c.value("nan", false)) {
      // diffusers produces NaN sigmas here (shift_terminal with one step); we refuse.
      auto s = qwen_image_schedule(cfg, steps, seq);
      EXPECT_FALSE(s.ok());
      if (!s.ok()) {
        EXPECT_NE(s.status().message().find("shift_terminal"), std::string::npos);
      }
      ++refused;
      continue;
    }
    if (c["qwen_sigmas"].get<bool>()) {
      for (const auto& [strength, begin] : c["begin_index"].items()) {
        auto s = qwen_image_schedule(cfg, steps, seq, std::stod(strength));
        ASSERT_TRUE(s.ok()) << s.status().message();
        EXPECT_EQ(s->begin_index, begin.get<int>()) << "strength " << strength;
        expect_close(s->timesteps, c["timesteps"], 1000.0, "timesteps");
        expect_close(s->sigmas, c["sigmas"], 1.0, "sigmas");
      }
    } else {
      std::optional<double> mu;
      if (cfg.use_dynamic_shifting) mu = calculate_shift(cfg, seq);
      auto s = flow_match_set_timesteps(cfg, steps, {}, mu);
      ASSERT_TRUE(s.ok()) << s.status().message();
      expect_close(s->timesteps, c["timesteps"], 1000.0, "timesteps");
      expect_close(s->sigmas, c["sigmas"], 1.0, "sigmas");
    }
    ++checked;
  }
  EXPECT_GT(checked, 120);
  EXPECT_GT(refused, 0);
}

TEST(FlowMatchScheduler, QwenImageConfigIsThePublishedOne) {
  nlohmann::json all = read_schedules();
  FlowMatchSchedulerConfig a = qwen_image_scheduler_config();
  FlowMatchSchedulerConfig b = config_of(all, "qwen_image");
  EXPECT_EQ(a.use_dynamic_shifting, b.use_dynamic_shifting);
  EXPECT_EQ(a.base_image_seq_len, b.base_image_seq_len);
  EXPECT_EQ(a.max_image_seq_len, b.max_image_seq_len);
  EXPECT_DOUBLE_EQ(a.base_shift, b.base_shift);
  EXPECT_DOUBLE_EQ(a.max_shift, b.max_shift);
  EXPECT_DOUBLE_EQ(a.shift_terminal, b.shift_terminal);
  EXPECT_EQ(a.linear_time_shift, b.linear_time_shift);
}

TEST(FlowMatchScheduler, StrengthAndStepErrors) {
  FlowMatchSchedulerConfig cfg = qwen_image_scheduler_config();
  EXPECT_FALSE(qwen_image_schedule(cfg, 0, 1024).ok());
  EXPECT_FALSE(qwen_image_schedule(cfg, 10, 1024, 0.0).ok());
  EXPECT_FALSE(qwen_image_schedule(cfg, 10, 1024, 1.5).ok());
  auto s = qwen_image_schedule(cfg, 10, 1024, 0.3);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->begin_index, 7);
  EXPECT_EQ(s->steps_to_run(), 3);
  EXPECT_EQ(s->sigmas.back(), 0.f);
  EXPECT_NEAR(s->sigmas[9], 0.02f, 1e-7);                                 // shift_terminal
  EXPECT_FALSE(flow_match_set_timesteps(cfg, 4, {}, std::nullopt).ok());  // dynamic needs mu
}

TEST(FlowMatchScheduler, ConfigErrorsNameTheKey) {
  auto bad = [](const nlohmann::json& j, const std::string& words) {
    auto c = parse_flow_match_scheduler_config(Config(j, "scheduler_config.json"));
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find(words), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("scheduler_config.json"), std::string::npos);
  };
  bad({{"use_beta_sigmas", true}}, "use_beta_sigmas");
  bad({{"stochastic_sampling", true}}, "stochastic_sampling");
  bad({{"time_shift_type", "cosine"}}, "time_shift_type");
  bad({{"use_karras_sigmas", true}, {"use_exponential_sigmas", true}}, "only one");
  bad({{"_class_name", "EulerDiscreteScheduler"}}, "FlowMatchEulerDiscreteScheduler");
  bad({{"shift", "3"}}, "shift");
  auto ok = parse_flow_match_scheduler_config(
      Config({{"shift_terminal", nullptr}, {"base_shift", nullptr}}, "s.json"));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->shift_terminal, 0.0);
}

}  // namespace
}  // namespace latent
