// diffusers FlowMatchEulerDiscreteScheduler's schedules, as the Qwen-Image pipelines drive it.
//
// set_timesteps(N, sigmas, mu) (diffusers 0.42.1):
//   sigmas = given sigmas (fp32), or linspace(t_max, t_min, N) / num_train_timesteps (fp64)
//   dynamic shifting: sigmas = exp(mu) / (exp(mu) + (1/sigmas - 1))   ("exponential")
//                          or mu / (mu + (1/sigmas - 1))               ("linear")
//   else static:     sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
//   shift_terminal:  stretched so the last sigma is shift_terminal
//   karras / exponential sigmas optionally; timesteps = sigmas * num_train_timesteps;
//   sigmas get a terminal 0 (1 with invert_sigmas).
// The arithmetic follows numpy's precision in each path (fp32 for given sigmas, fp64 otherwise),
// so the values match diffusers' to the last bit or so.
// QwenImagePipeline: sigmas = np.linspace(1, 1/N, N) and mu = calculate_shift(image tokens);
// img2img starts at step int(N - min(N * strength, N)) (get_timesteps).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/weights/config.h"

namespace latent {

// scheduler/scheduler_config.json (defaults: diffusers' FlowMatchEulerDiscreteScheduler).
struct FlowMatchSchedulerConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  bool invert_sigmas = false;
  double shift_terminal = 0.0;  // 0 (or null in the JSON): none
  bool use_karras_sigmas = false;
  bool use_exponential_sigmas = false;
  bool linear_time_shift = false;  // time_shift_type "linear" (default "exponential")
};

// Reads and checks a scheduler config; refuses what is not implemented (use_beta_sigmas,
// stochastic_sampling) or inconsistent, naming the file and key.
Result<FlowMatchSchedulerConfig> parse_flow_match_scheduler_config(const Config& config);
// The published Qwen-Image scheduler config (what the Qwen-Image pipelines ship).
FlowMatchSchedulerConfig qwen_image_scheduler_config();

// diffusers calculate_shift(image_seq_len, base_image_seq_len, max_image_seq_len, base_shift,
// max_shift) with the config's values: mu, linear in the image token count.
double calculate_shift(const FlowMatchSchedulerConfig& config, int64_t image_seq_len);

struct FlowMatchSchedule {
  std::vector<float> timesteps;  // N, in [0, num_train_timesteps]
  std::vector<float> sigmas;     // N + 1, the last one terminal
  int begin_index = 0;           // first step to run (img2img strength), < N

  int steps_to_run() const { return static_cast<int>(timesteps.size()) - begin_index; }
};

// set_timesteps(num_inference_steps = steps, sigmas = sigmas (may be empty), mu = mu).
Result<FlowMatchSchedule> flow_match_set_timesteps(const FlowMatchSchedulerConfig& config,
                                                   int steps, const std::vector<double>& sigmas,
                                                   std::optional<double> mu);

// The Qwen-Image pipelines' schedule: sigmas np.linspace(1, 1/steps, steps), mu from the
// image token count, and for strength < 1 the img2img start (QwenImageImg2ImgPipeline
// .get_timesteps); an error if that leaves no step, like the pipeline.
Result<FlowMatchSchedule> qwen_image_schedule(const FlowMatchSchedulerConfig& config, int steps,
                                              int64_t image_seq_len, double strength = 1.0);

}  // namespace latent
