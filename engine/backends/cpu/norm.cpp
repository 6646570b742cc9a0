// Normalisations over NCHW: group norm (statistics per (n, group)) and the Wan / Qwen-Image
// VAE channel RMS norm (per pixel over channels). Statistics are accumulated in fp32 lanes over
// short runs and summed in double, so a 1024x1024 group does not lose precision.
#include <algorithm>
#include <cmath>

#include "engine/backends/cpu/cpu_ops.h"

namespace latent::cpu {
namespace {

constexpr int64_t kRun = 4096;  // elements summed in fp32 before going to double
constexpr int kLanes = 16;

// Sum of p[0, n) (square = false) or of (p[i] - shift)^2 (square = true).
double accumulate(const float* p, int64_t n, bool square, float shift) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kRun) {
    const int64_t e = std::min(n, b + kRun);
    float acc[kLanes] = {};
    int64_t i = b;
    if (square) {
      for (; i + kLanes <= e; i += kLanes)
        for (int j = 0; j < kLanes; ++j) {
          const float d = p[i + j] - shift;
          acc[j] += d * d;
        }
    } else {
      for (; i + kLanes <= e; i += kLanes)
        for (int j = 0; j < kLanes; ++j) acc[j] += p[i + j];
    }
    double run = 0.0;
    for (; i < e; ++i) {
      const double d = square ? static_cast<double>(p[i]) - shift : p[i];
      run += square ? d * d : d;
    }
    for (int j = 0; j < kLanes; ++j) run += acc[j];
    total += run;
  }
  return total;
}

}  // namespace

Result<Tensor> group_norm(DnnlContext& ctx, const Tensor& x, int groups, const float* gamma,
                          const float* beta, float eps, Activation act) {
  // x: [N, C, H, W]; a group is C/groups consecutive channels, contiguous in memory.
  const int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
  const int64_t cpg = c / groups, len = cpg * hw, items = n * groups;
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
#pragma omp parallel for schedule(dynamic, 1) if (x.numel() > kRun)
  for (int64_t item = 0; item < items; ++item) {
    const float* src = px + item * len;
    float* dst = py + item * len;
    const double mean = len ? accumulate(src, len, false, 0.f) / len : 0.0;
    // Two passes: the deviations are summed about the mean, no E[x^2] - E[x]^2 cancellation.
    const double var = len ? accumulate(src, len, true, static_cast<float>(mean)) / len : 0.0;
    const double rstd = 1.0 / std::sqrt(var + eps);
    const int64_t c0 = (item % groups) * cpg;
    for (int64_t ci = 0; ci < cpg; ++ci) {
      const double g = gamma ? gamma[c0 + ci] : 1.0;
      const float a = static_cast<float>(rstd * g);
      const float b = static_cast<float>((beta ? beta[c0 + ci] : 0.0) - mean * rstd * g);
      const float* s = src + ci * hw;
      float* d = dst + ci * hw;
      for (int64_t i = 0; i < hw; ++i) d[i] = s[i] * a + b;
    }
  }
  LATENT_TRY(activation(ctx, py, py, y.numel(), act).with_context("group_norm"));
  return y;
}

Result<Tensor> rms_norm_channels(DnnlContext& ctx, const Tensor& x, const float* gamma,
                                 const float* beta, Activation act) {
  // x: [N, C, H, W]; per pixel: x / max(sqrt(sum_c x^2), 1e-12) * sqrt(C) * gamma + beta.
  constexpr int64_t kPixels = 256;  // pixels a task handles; keeps the sums in L1
  const int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
  const int64_t tiles = (hw + kPixels - 1) / kPixels, items = n * tiles;
  const double sqrt_c = std::sqrt(static_cast<double>(c));
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kRun)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t ni = item / tiles, p0 = (item % tiles) * kPixels;
    const int64_t np = std::min(kPixels, hw - p0);
    double ss[kPixels] = {};
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* s = px + (ni * c + ch) * hw + p0;
      for (int64_t i = 0; i < np; ++i) ss[i] += static_cast<double>(s[i]) * s[i];
    }
    float scale[kPixels];
    for (int64_t i = 0; i < np; ++i)
      scale[i] = static_cast<float>(sqrt_c / std::max(std::sqrt(ss[i]), 1e-12));
    for (int64_t ch = 0; ch < c; ++ch) {
      const float g = gamma ? gamma[ch] : 1.f, b = beta ? beta[ch] : 0.f;
      const float* s = px + (ni * c + ch) * hw + p0;
      float* d = py + (ni * c + ch) * hw + p0;
      for (int64_t i = 0; i < np; ++i) d[i] = s[i] * scale[i] * g + b;
    }
  }
  LATENT_TRY(activation(ctx, py, py, y.numel(), act).with_context("rms_norm_channels"));
  return y;
}

}  // namespace latent::cpu
