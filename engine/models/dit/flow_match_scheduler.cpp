// FlowMatchEulerDiscreteScheduler schedules; see flow_match_scheduler.h. Each formula names the
// diffusers line it follows and the precision numpy / torch computes it in.
#include "engine/models/dit/flow_match_scheduler.h"

#include <algorithm>
#include <cmath>

namespace latent {

namespace {

// np.linspace(start, stop, num) in fp64: start + i * step, the last point exactly `stop`.
std::vector<double> linspace(double start, double stop, int num) {
  std::vector<double> y(static_cast<size_t>(num));
  const double step = num > 1 ? (stop - start) / (num - 1) : 0.0;
  for (int i = 0; i < num; ++i) y[i] = i * step + start;
  if (num > 1) y.back() = stop;
  return y;
}

// The sigma pipeline of set_timesteps from "2. Perform timestep shifting" to the fp32 tensor,
// in T = float (given sigmas: numpy fp32 arrays) or T = double (derived from timesteps).
template <typename T>
Result<std::vector<float>> shape_sigmas(const FlowMatchSchedulerConfig& c, std::vector<T> s,
                                        std::optional<double> mu) {
  const size_t n = s.size();
  if (c.use_dynamic_shifting) {
    // time_shift(mu, 1.0, t): (1 / t - 1) ** 1.0 is exact; the Python float becomes T.
    const T m = static_cast<T>(c.linear_time_shift ? *mu : std::exp(*mu));
    for (T& v : s) v = m / (m + (T(1) / v - T(1)));
  } else {
    const T shift = static_cast<T>(c.shift), shift_m1 = static_cast<T>(c.shift - 1);
    for (T& v : s) v = shift * v / (T(1) + shift_m1 * v);
  }
  if (c.shift_terminal != 0.0) {
    // stretch_shift_to_terminal: 1 - (1 - t) / ((1 - t[-1]) / (1 - shift_terminal))
    const T scale = (T(1) - s.back()) / static_cast<T>(1 - c.shift_terminal);
    if (!(scale != T(0)) || !std::isfinite(static_cast<double>(scale)))
      return Status::errorf("scheduler: shift_terminal ", c.shift_terminal,
                            " cannot stretch a "
                            "schedule whose last sigma is ",
                            static_cast<double>(s.back()),
                            " (diffusers divides by zero and gets NaN here; use more steps)");
    for (T& v : s) v = T(1) - (T(1) - v) / scale;
  }
  std::vector<float> out(n);
  if (c.use_karras_sigmas || c.use_exponential_sigmas) {
    // _convert_to_karras / _convert_to_exponential: fp64 from the end points.
    const double lo = static_cast<double>(s.back()), hi = static_cast<double>(s.front());
    const int num = static_cast<int>(n);
    if (c.use_karras_sigmas) {
      const double rho = 7.0, min_inv = std::pow(lo, 1 / rho), max_inv = std::pow(hi, 1 / rho);
      const std::vector<double> ramp = linspace(0, 1, num);
      for (size_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(std::pow(max_inv + ramp[i] * (min_inv - max_inv), rho));
    } else {
      const std::vector<double> l = linspace(std::log(hi), std::log(lo), num);
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(std::exp(l[i]));
    }
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(s[i]);
  }
  for (float v : out)
    if (!std::isfinite(v))
      return Status::errorf("scheduler: the schedule has a non-finite sigma (", v, ")");
  return out;
}

}  // namespace

Result<FlowMatchSchedulerConfig> parse_flow_match_scheduler_config(const Config& config) {
  const std::string& p = config.path();
  const std::string cls = config.class_name();
  if (!cls.empty() && cls != "FlowMatchEulerDiscreteScheduler")
    return Status::errorf(p, ": _class_name is '", cls,
                          "', expected FlowMatchEulerDiscreteScheduler");
  FlowMatchSchedulerConfig c;
  LATENT_ASSIGN_OR_RETURN(c.num_train_timesteps,
                          config.get_int("num_train_timesteps", c.num_train_timesteps));
  LATENT_ASSIGN_OR_RETURN(c.shift, config.get_float("shift", c.shift));
  LATENT_ASSIGN_OR_RETURN(c.use_dynamic_shifting,
                          config.get_bool("use_dynamic_shifting", c.use_dynamic_shifting));
  const auto& j = config.json();
  // base_shift / max_shift / shift_terminal may be null (diffusers' "None").
  auto float_or_null = [&](const char* key, double def) -> Result<double> {
    if (j.contains(key) && j[key].is_null()) return def;
    return config.get_float(key, def);
  };
  LATENT_ASSIGN_OR_RETURN(c.base_shift, float_or_null("base_shift", c.base_shift));
  LATENT_ASSIGN_OR_RETURN(c.max_shift, float_or_null("max_shift", c.max_shift));
  LATENT_ASSIGN_OR_RETURN(c.shift_terminal, float_or_null("shift_terminal", 0.0));
  LATENT_ASSIGN_OR_RETURN(c.base_image_seq_len,
                          config.get_int("base_image_seq_len", c.base_image_seq_len));
  LATENT_ASSIGN_OR_RETURN(c.max_image_seq_len,
                          config.get_int("max_image_seq_len", c.max_image_seq_len));
  LATENT_ASSIGN_OR_RETURN(c.invert_sigmas, config.get_bool("invert_sigmas", false));
  LATENT_ASSIGN_OR_RETURN(c.use_karras_sigmas, config.get_bool("use_karras_sigmas", false));
  LATENT_ASSIGN_OR_RETURN(c.use_exponential_sigmas,
                          config.get_bool("use_exponential_sigmas", false));
  LATENT_ASSIGN_OR_RETURN(bool beta, config.get_bool("use_beta_sigmas", false));
  LATENT_ASSIGN_OR_RETURN(bool stochastic, config.get_bool("stochastic_sampling", false));
  LATENT_ASSIGN_OR_RETURN(std::string shift_type,
                          config.get_string("time_shift_type", "exponential"));
  if (shift_type != "exponential" && shift_type != "linear")
    return Status::errorf(p, ": 'time_shift_type' is '", shift_type,
                          "', expected 'exponential' or 'linear'");
  c.linear_time_shift = shift_type == "linear";
  if (beta) return Status::errorf(p, ": 'use_beta_sigmas' is not supported");
  if (stochastic) return Status::errorf(p, ": 'stochastic_sampling' is not supported");
  if (c.use_karras_sigmas && c.use_exponential_sigmas)
    return Status::errorf(p,
                          ": only one of 'use_karras_sigmas' and 'use_exponential_sigmas' "
                          "can be set");
  if (c.num_train_timesteps < 1)
    return Status::errorf(p, ": 'num_train_timesteps' must be positive");
  if (!std::isfinite(c.shift) || c.shift <= 0)
    return Status::errorf(p, ": 'shift' must be a positive number");
  if (!(c.shift_terminal >= 0 && c.shift_terminal < 1))
    return Status::errorf(p, ": 'shift_terminal' must be in [0, 1)");
  if (c.use_dynamic_shifting && c.max_image_seq_len == c.base_image_seq_len)
    return Status::errorf(p,
                          ": 'max_image_seq_len' equals 'base_image_seq_len' (mu would divide "
                          "by zero)");
  return c;
}

FlowMatchSchedulerConfig qwen_image_scheduler_config() {
  FlowMatchSchedulerConfig c;
  c.use_dynamic_shifting = true;
  c.base_shift = 0.5;
  c.max_shift = 0.9;
  c.base_image_seq_len = 256;
  c.max_image_seq_len = 8192;
  c.shift_terminal = 0.02;
  return c;
}

double calculate_shift(const FlowMatchSchedulerConfig& c, int64_t image_seq_len) {
  const double m = (c.max_shift - c.base_shift) /
                   static_cast<double>(c.max_image_seq_len - c.base_image_seq_len);
  const double b = c.base_shift - m * static_cast<double>(c.base_image_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

Result<FlowMatchSchedule> flow_match_set_timesteps(const FlowMatchSchedulerConfig& c, int steps,
                                                   const std::vector<double>& sigmas,
                                                   std::optional<double> mu) {
  if (c.use_dynamic_shifting && !mu)
    return Status::error("scheduler: use_dynamic_shifting needs mu");
  if (!sigmas.empty()) steps = static_cast<int>(sigmas.size());
  if (steps < 1 || steps > 100000)
    return Status::errorf("scheduler: ", steps, " steps; expected 1 to 100000");
  const auto train = static_cast<float>(c.num_train_timesteps);
  std::vector<float> out;
  if (!sigmas.empty()) {
    // np.array(sigmas).astype(np.float32), then fp32 numpy arithmetic.
    std::vector<float> s(sigmas.begin(), sigmas.end());
    for (float v : s)
      if (!(v > 0.f) || v > 1.f)
        return Status::errorf("scheduler: sigma ", v, " is outside (0, 1]");
    LATENT_ASSIGN_OR_RETURN(out, shape_sigmas<float>(c, std::move(s), mu));
  } else {
    // __init__'s fp32 sigmas: (k / T) for k = T..1, statically shifted unless dynamic.
    auto init_sigma = [&](int64_t k) {
      float v = static_cast<float>(k) / train;
      if (!c.use_dynamic_shifting)
        v = static_cast<float>(c.shift) * v / (1.f + static_cast<float>(c.shift - 1) * v);
      return v;
    };
    const double sigma_max = init_sigma(c.num_train_timesteps), sigma_min = init_sigma(1);
    // timesteps = linspace(sigma_max * T, sigma_min * T, N) in fp64; sigmas = timesteps / T.
    std::vector<double> t =
        linspace(sigma_max * c.num_train_timesteps, sigma_min * c.num_train_timesteps, steps);
    for (double& v : t) v /= static_cast<double>(c.num_train_timesteps);
    LATENT_ASSIGN_OR_RETURN(out, shape_sigmas<double>(c, std::move(t), mu));
  }
  FlowMatchSchedule s;
  if (c.invert_sigmas)
    for (float& v : out) v = 1.f - v;
  s.sigmas = out;
  for (float v : out) s.timesteps.push_back(v * train);
  s.sigmas.push_back(c.invert_sigmas ? 1.f : 0.f);
  return s;
}

Result<FlowMatchSchedule> qwen_image_schedule(const FlowMatchSchedulerConfig& config, int steps,
                                              int64_t image_seq_len, double strength) {
  if (steps < 1) return Status::errorf("scheduler: ", steps, " steps; at least 1 is needed");
  if (!(strength > 0.0 && strength <= 1.0))
    return Status::errorf("scheduler: strength ", strength, " is outside (0, 1]");
  LATENT_ASSIGN_OR_RETURN(FlowMatchSchedule s,
                          flow_match_set_timesteps(config, steps, linspace(1.0, 1.0 / steps, steps),
                                                   calculate_shift(config, image_seq_len)));
  // get_timesteps: init_timestep = min(N * strength, N); t_start = int(max(N - init, 0))
  const double init = std::min(steps * strength, static_cast<double>(steps));
  s.begin_index = static_cast<int>(std::max(steps - init, 0.0));
  if (s.steps_to_run() < 1)
    return Status::errorf("scheduler: strength ", strength, " of ", steps,
                          " steps leaves no step to run");
  return s;
}

}  // namespace latent
