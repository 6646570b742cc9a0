// CPU backend ops against plain double-precision references written here (naive loops), at
// small shapes that hit edge cases and at VAE-sized shapes, for each storage dtype; plus bad
// inputs, which must come back as errors naming the op, and the backend registry.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/backends/registry.h"
#include "engine/models/vae/upsample_conv.h"
#include "tests/util/backend_test_util.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

using test::Arg;
using test::cpu;
using test::make_arg;
using test::must;
using test::rel_l2;
using test::tolerance;

// Checks a result against a reference: shape, then relative L2 error within the dtype's bound.
void expect_close(Backend& be, const Result<Tensor>& got, const Shape& shape,
                  const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.ok()) << what << ": " << got.status().message();
  EXPECT_EQ(got->dtype(), be.compute_dtype()) << what;
  ASSERT_EQ(got->shape(), shape) << what;
  std::vector<float> g = must(be.download(*got), "download").to_floats();
  for (float f : g) ASSERT_TRUE(std::isfinite(f)) << what << ": non-finite output";
  const double err = rel_l2(g, want);
  EXPECT_LE(err, tol) << what << " (" << dtype_name(be.compute_dtype()) << ")";
}

double act_ref(double x, Activation act) {
  switch (act) {
    case Activation::kNone:
      return x;
    case Activation::kSiLU:
      return x / (1.0 + std::exp(-x));
    case Activation::kReLU:
      return x > 0 ? x : 0.0;
    case Activation::kGELU:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::kTanh:
      return std::tanh(x);
  }
  return NAN;
}

const Activation kAllActs[] = {Activation::kNone, Activation::kSiLU, Activation::kReLU,
                               Activation::kGELU, Activation::kTanh};

// ---------------------------------------------------------------------------------------------
// References

std::vector<double> conv_ref(const std::vector<float>& x, const Shape& xs,
                             const std::vector<float>& w, const Shape& ws, const float* bias,
                             const Conv2dParams& p, const float* residual, Activation act,
                             Shape* out_shape) {
  const int64_t n = xs[0], ci = xs[1], h = xs[2], wd = xs[3], co = ws[0], kh = ws[2], kw = ws[3];
  const int64_t ho = (h + p.pad_top + p.pad_bottom - kh) / p.stride + 1;
  const int64_t wo = (wd + p.pad_left + p.pad_right - kw) / p.stride + 1;
  *out_shape = {n, co, ho, wo};
  std::vector<double> y(static_cast<size_t>(n * co * ho * wo));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < co; ++o)
      for (int64_t oy = 0; oy < ho; ++oy)
        for (int64_t ox = 0; ox < wo; ++ox) {
          double acc = bias ? bias[o] : 0.0;
          for (int64_t c = 0; c < ci; ++c)
            for (int64_t ky = 0; ky < kh; ++ky) {
              const int64_t iy = oy * p.stride - p.pad_top + ky;
              if (iy < 0 || iy >= h) continue;
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t ix = ox * p.stride - p.pad_left + kx;
                if (ix < 0 || ix >= wd) continue;
                acc += static_cast<double>(x[((b * ci + c) * h + iy) * wd + ix]) *
                       w[((o * ci + c) * kh + ky) * kw + kx];
              }
            }
          const size_t i = static_cast<size_t>(((b * co + o) * ho + oy) * wo + ox);
          if (residual) acc += residual[i];
          y[i] = act_ref(acc, act);
        }
  return y;
}

std::vector<double> group_norm_ref(const std::vector<float>& x, const Shape& s, int groups,
                                   const float* gamma, const float* beta, double eps,
                                   Activation act) {
  const int64_t n = s[0], c = s[1], hw = s[2] * s[3], cpg = c / groups, len = cpg * hw;
  std::vector<double> y(x.size());
  for (int64_t g = 0; g < n * groups; ++g) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < len; ++i) mean += x[g * len + i];
    mean /= len;
    for (int64_t i = 0; i < len; ++i) var += (x[g * len + i] - mean) * (x[g * len + i] - mean);
    var /= len;
    for (int64_t i = 0; i < len; ++i) {
      const int64_t ch = (g % groups) * cpg + i / hw;
      double v = (x[g * len + i] - mean) / std::sqrt(var + eps);
      if (gamma) v = v * gamma[ch] + beta[ch];
      y[g * len + i] = act_ref(v, act);
    }
  }
  return y;
}

std::vector<double> rms_ref(const std::vector<float>& x, const Shape& s, const float* gamma,
                            const float* beta, Activation act) {
  const int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < n; ++b)
    for (int64_t p = 0; p < hw; ++p) {
      double ss = 0;
      for (int64_t ch = 0; ch < c; ++ch)
        ss += static_cast<double>(x[(b * c + ch) * hw + p]) * x[(b * c + ch) * hw + p];
      const double norm = std::max(std::sqrt(ss), 1e-12);
      for (int64_t ch = 0; ch < c; ++ch) {
        const size_t i = static_cast<size_t>((b * c + ch) * hw + p);
        double v = x[i] / norm * std::sqrt(static_cast<double>(c)) * (gamma ? gamma[ch] : 1.0);
        if (beta) v += beta[ch];
        y[i] = act_ref(v, act);
      }
    }
  return y;
}

std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const Shape& s, int heads) {
  const int64_t n = s[0], c = s[1], t = s[2] * s[3], d = c / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> out(q.size()), sc(static_cast<size_t>(t));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t off = (b * c + h * d) * t;
      for (int64_t i = 0; i < t; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < t; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d; ++e)
            acc += static_cast<double>(q[off + e * t + i]) * k[off + e * t + j];
          sc[j] = acc * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < t; ++j) sum += sc[j] = std::exp(sc[j] - mx);
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < t; ++j) acc += sc[j] * v[off + e * t + j];
          out[off + e * t + i] = acc / sum;
        }
      }
    }
  return out;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ---------------------------------------------------------------------------------------------
// Op tests, once per storage dtype.

class CpuOps : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { be_ = cpu(GetParam()); }
  double tol() const { return tolerance(GetParam()); }
  Backend& be() { return *be_; }
  std::shared_ptr<Backend> be_;
};

struct ConvCase {
  Shape x, w;
  Conv2dParams p;
  bool bias, residual;
  Activation act;
};

void run_conv_case(Backend& be, const ConvCase& c, uint64_t seed, double tol) {
  Arg x = make_arg(be, c.x, seed);
  Arg w = make_arg(be, c.w, seed + 1, -0.3f, 0.3f);
  Arg b = make_arg(be, {c.w[0]}, seed + 2);
  Shape out;
  conv_ref(x.v, c.x, w.v, c.w, nullptr, c.p, nullptr, Activation::kNone, &out);
  Arg r = make_arg(be, out, seed + 3);
  std::vector<double> want = conv_ref(x.v, c.x, w.v, c.w, c.bias ? b.p() : nullptr, c.p,
                                      c.residual ? r.p() : nullptr, c.act, &out);
  Result<Tensor> got =
      be.conv2d(x.dev, w.dev, c.bias ? b.dev : Tensor(), c.p, c.residual ? r.dev : Tensor(), c.act);
  expect_close(
      be, got, out, want, tol,
      str_cat("conv2d x", shape_str(c.x), " w", shape_str(c.w), " stride ", c.p.stride, " pad ",
              c.p.pad_top, ',', c.p.pad_bottom, ',', c.p.pad_left, ',', c.p.pad_right, " bias ",
              c.bias, " residual ", c.residual, " act ", static_cast<int>(c.act)));
}

TEST_P(CpuOps, Conv2dSmall) {
  Conv2dParams asym;  // the SD VAE downsampler: pad right/bottom by one, stride 2
  asym.stride = 2;
  asym.pad_bottom = asym.pad_right = 1;
  Conv2dParams wide;
  wide.pad_top = 2;
  wide.pad_left = 1;
  const std::vector<ConvCase> cases = {
      {{1, 3, 8, 8}, {4, 3, 3, 3}, Conv2dParams::same(3), true, false, Activation::kNone},
      {{2, 5, 9, 7}, {6, 5, 3, 3}, Conv2dParams::same(3), true, true, Activation::kNone},
      {{2, 5, 9, 7}, {6, 5, 3, 3}, Conv2dParams::same(3), false, true, Activation::kSiLU},
      {{1, 8, 10, 12}, {16, 8, 1, 1}, Conv2dParams(), true, true, Activation::kReLU},
      {{1, 16, 9, 11}, {8, 16, 3, 3}, asym, true, false, Activation::kGELU},
      {{1, 16, 8, 8}, {16, 16, 3, 3}, Conv2dParams::same(3, 2), true, true, Activation::kTanh},
      {{2, 4, 6, 7}, {3, 4, 3, 3}, wide, false, false, Activation::kSiLU},
      {{1, 32, 16, 16}, {32, 32, 3, 3}, Conv2dParams::same(3), true, true, Activation::kSiLU},
  };
  uint64_t seed = 100;
  for (const ConvCase& c : cases) run_conv_case(be(), c, seed += 10, tol());
}

TEST_P(CpuOps, Conv2dVaeSized) {
  // A VAE resnet conv (128 channels at 64x64) with the residual and activation fused, and the
  // first encoder conv (3 input channels).
  run_conv_case(
      be(),
      {{1, 128, 64, 64}, {128, 128, 3, 3}, Conv2dParams::same(3), true, true, Activation::kSiLU}, 7,
      tol());
  run_conv_case(
      be(), {{1, 3, 64, 64}, {128, 3, 3, 3}, Conv2dParams::same(3), true, false, Activation::kNone},
      8, tol());
}

TEST_P(CpuOps, Conv2dRepeatedCallsReuseThePlan) {
  // Same shapes, different data: the cached primitive must not keep the first call's pointers.
  for (uint64_t seed : {1, 2, 3})
    run_conv_case(
        be(), {{1, 8, 6, 6}, {8, 8, 3, 3}, Conv2dParams::same(3), true, true, Activation::kSiLU},
        seed * 31, tol());
}

TEST_P(CpuOps, GroupNorm) {
  struct Case {
    Shape s;
    int groups;
    bool affine;
    Activation act;
    float offset;
  };
  const std::vector<Case> cases = {
      {{2, 6, 5, 3}, 3, true, Activation::kNone, 0.f},
      {{1, 8, 4, 4}, 8, false, Activation::kSiLU, 0.f},
      {{2, 4, 3, 3}, 1, true, Activation::kGELU, 0.f},
      {{1, 32, 7, 9}, 4, true, Activation::kSiLU, 50.f},  // a large mean must not cost precision
      {{1, 256, 32, 32}, 32, true, Activation::kSiLU, 0.f},
      {{1, 512, 16, 16}, 32, true, Activation::kNone, 0.f},
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    Arg x = make_arg(be(), c.s, ++seed, -1.f + c.offset, 1.f + c.offset);
    Arg g = make_arg(be(), {c.s[1]}, ++seed, 0.5f, 1.5f);
    Arg b = make_arg(be(), {c.s[1]}, ++seed);
    const float eps = 1e-6f;
    std::vector<double> want = group_norm_ref(x.v, c.s, c.groups, c.affine ? g.p() : nullptr,
                                              c.affine ? b.p() : nullptr, eps, c.act);
    expect_close(be(),
                 be().group_norm(x.dev, c.groups, c.affine ? g.dev : Tensor(),
                                 c.affine ? b.dev : Tensor(), eps, c.act),
                 c.s, want, tol(), str_cat("group_norm ", shape_str(c.s), " groups ", c.groups));
  }
}

TEST_P(CpuOps, RmsNormChannels) {
  struct Case {
    Shape s;
    bool gamma, beta;
    Activation act;
  };
  const std::vector<Case> cases = {
      {{2, 8, 5, 5}, true, true, Activation::kNone},
      {{1, 12, 7, 3}, true, false, Activation::kSiLU},
      {{1, 5, 3, 4}, false, false, Activation::kNone},
      {{1, 96, 33, 17}, true, false, Activation::kSiLU},  // pixel tiles with a remainder
      {{1, 384, 32, 32}, true, false, Activation::kNone},
  };
  uint64_t seed = 900;
  for (const Case& c : cases) {
    Arg x = make_arg(be(), c.s, ++seed);
    Arg g = make_arg(be(), {c.s[1]}, ++seed, 0.5f, 1.5f);
    Arg b = make_arg(be(), {c.s[1]}, ++seed);
    std::vector<double> want =
        rms_ref(x.v, c.s, c.gamma ? g.p() : nullptr, c.beta ? b.p() : nullptr, c.act);
    expect_close(
        be(),
        be().rms_norm_channels(x.dev, c.gamma ? g.dev : Tensor(), c.beta ? b.dev : Tensor(), c.act),
        c.s, want, tol(), str_cat("rms_norm_channels ", shape_str(c.s)));
  }
}

TEST_P(CpuOps, RmsNormOfAZeroPixelIsBeta) {
  // ||x|| = 0 at every pixel: the 1e-12 floor keeps 0/0 away and the output is beta.
  const Shape s = {1, 4, 2, 2};
  Tensor x = must(be().upload(Tensor::zeros(s, DType::kF32)), "upload");
  Arg g = make_arg(be(), {4}, 1);
  Arg b = make_arg(be(), {4}, 2);
  std::vector<double> want(16);
  for (int i = 0; i < 16; ++i) want[i] = b.v[i / 4];
  expect_close(be(), be().rms_norm_channels(x, g.dev, b.dev), s, want, tol(), "rms_norm zero");
}

TEST_P(CpuOps, Activations) {
  for (const Shape& s : {Shape{3, 1000}, Shape{1, 64, 32, 32}}) {
    Arg x = make_arg(be(), s, 77, -6.f, 6.f);
    for (Activation act : kAllActs) {
      std::vector<double> want(x.v.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = act_ref(x.v[i], act);
      expect_close(be(), be().activation(x.dev, act), s, want, tol(),
                   str_cat("activation ", static_cast<int>(act), ' ', shape_str(s)));
    }
    // The input is left alone.
    EXPECT_EQ(must(be().download(x.dev), "download").to_floats(), x.v);
  }
}

TEST_P(CpuOps, AddAffineClamp) {
  const Shape s = {2, 3, 17, 19};
  Arg a = make_arg(be(), s, 11, -3.f, 3.f);
  Arg b = make_arg(be(), s, 12, -3.f, 3.f);
  std::vector<double> sum(a.v.size()), aff(a.v.size()), cl(a.v.size());
  for (size_t i = 0; i < sum.size(); ++i) {
    sum[i] = static_cast<double>(a.v[i]) + b.v[i];
    aff[i] = a.v[i] * 0.18215 + 0.5;
    cl[i] = std::min(std::max<double>(a.v[i], -1.0), 1.5);
  }
  expect_close(be(), be().add(a.dev, b.dev), s, sum, tol(), "add");
  expect_close(be(), be().affine(a.dev, 0.18215f, 0.5f), s, aff, tol(), "affine");
  expect_close(be(), be().clamp(a.dev, -1.f, 1.5f), s, cl, tol(), "clamp");
}

TEST_P(CpuOps, ChannelAffine) {
  const Shape s = {2, 16, 5, 7};
  Arg x = make_arg(be(), s, 21);
  std::vector<float> scale(16), shift(16);
  for (int c = 0; c < 16; ++c) {
    scale[c] = 0.5f + 0.1f * c;
    shift[c] = -0.3f * c;
  }
  std::vector<double> want(x.v.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const int c = static_cast<int>((i / 35) % 16);
    want[i] = x.v[i] * static_cast<double>(scale[c]) + shift[c];
  }
  expect_close(be(), be().channel_affine(x.dev, scale, shift), s, want, tol(), "channel_affine");
}

TEST_P(CpuOps, UpsampleAndSliceAreExact) {
  const Shape s = {2, 5, 3, 4};
  Arg x = make_arg(be(), s, 31);
  std::vector<double> up(static_cast<size_t>(2 * 5 * 6 * 8));
  for (int64_t p = 0; p < 10; ++p)
    for (int64_t y = 0; y < 6; ++y)
      for (int64_t xx = 0; xx < 8; ++xx)
        up[(p * 6 + y) * 8 + xx] = x.v[(p * 3 + y / 2) * 4 + xx / 2];
  expect_close(be(), be().upsample_nearest2x(x.dev), {2, 5, 6, 8}, up, 0.0, "upsample_nearest2x");

  std::vector<double> sl;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 1; c < 4; ++c)
      for (int64_t i = 0; i < 12; ++i) sl.push_back(x.v[(b * 5 + c) * 12 + i]);
  expect_close(be(), be().slice_channels(x.dev, 1, 3), {2, 3, 3, 4}, sl, 0.0, "slice_channels");

  // interleave_phases2x: y[n, c, 2i + a, 2j + b] = z[n, (2a + b) C + c, i + a, j + b], exact.
  const Shape zs = {2, 12, 4, 5};  // C = 3, H = 3, W = 4
  Arg z = make_arg(be(), zs, 32);
  std::vector<double> il(static_cast<size_t>(2 * 3 * 6 * 8));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 6; ++y)
        for (int64_t xx = 0; xx < 8; ++xx) {
          const int64_t a = y % 2, q = xx % 2, zc = b * 12 + (2 * a + q) * 3 + c;
          il[((b * 3 + c) * 6 + y) * 8 + xx] = z.v[(zc * 4 + y / 2 + a) * 5 + xx / 2 + q];
        }
  expect_close(be(), be().interleave_phases2x(z.dev), {2, 3, 6, 8}, il, 0.0, "interleave_phases2x");
  expect_close(be(), be().slice_channels(x.dev, 0, 5), s, to_double(x.v), 0.0, "slice all");
}

// An upsampling convolution run as phases (upsample_conv.h) against the upsample and the 3x3
// convolution it stands for (the reference: conv_ref of the upsampled input), with and without
// bias and activation, square and odd sizes, one and several images.
TEST_P(CpuOps, UpsampleConvAsPhasesMatchesUpsampleThenConv) {
  struct Case {
    Shape x;
    int64_t cout;
    bool bias;
    Activation act;
  };
  const Case cases[] = {{{1, 4, 3, 3}, 5, true, Activation::kNone},
                        {{2, 3, 5, 2}, 2, false, Activation::kReLU},
                        {{1, 8, 1, 1}, 8, true, Activation::kSiLU},
                        {{1, 16, 7, 9}, 24, true, Activation::kNone}};
  uint64_t seed = 40;
  for (const Case& c : cases) {
    const int64_t cin = c.x[1];
    Arg x = make_arg(be(), c.x, ++seed);
    Tensor w = test::random_tensor({c.cout, cin, 3, 3}, ++seed, -0.5f, 0.5f);
    Tensor b = c.bias ? test::random_tensor({c.cout}, ++seed) : Tensor();
    // The reference sees the weights as the backend holds them (rounded to its dtype).
    const std::vector<float> wv =
        must(be().download(must(be().upload(w), "upload")), "w").to_floats();
    std::vector<float> bv;
    if (c.bias) bv = must(be().download(must(be().upload(b), "upload")), "b").to_floats();
    std::vector<float> up(static_cast<size_t>(c.x[0] * cin * 4 * c.x[2] * c.x[3]));
    const int64_t h = c.x[2], wd = c.x[3];
    for (int64_t p = 0; p < c.x[0] * cin; ++p)
      for (int64_t y = 0; y < 2 * h; ++y)
        for (int64_t xx = 0; xx < 2 * wd; ++xx)
          up[(p * 2 * h + y) * 2 * wd + xx] = x.v[(p * h + y / 2) * wd + xx / 2];
    Shape out;
    const std::vector<double> want =
        conv_ref(up, {c.x[0], cin, 2 * h, 2 * wd}, wv, {c.cout, cin, 3, 3},
                 c.bias ? bv.data() : nullptr, Conv2dParams::same(3), nullptr, c.act, &out);
    Result<UpsampleConv> conv = make_upsample_conv(be(), w, b);
    ASSERT_TRUE(conv.ok()) << conv.status().message();
    EXPECT_TRUE(conv->phases) << "the CPU backend runs upsampling convolutions as phases";
    Result<UpsampleConv> written = make_upsample_conv(be(), w, b, UpsampleConvWay::kUpsample);
    ASSERT_TRUE(written.ok()) << written.status().message();
    EXPECT_FALSE(written->phases);
    expect_close(be(), (*written)(be(), x.dev, c.act), out, want, 3 * tol(),
                 str_cat("upsampling conv ", shape_str(c.x), " -> ", c.cout, " upsampled"));
    EXPECT_EQ(conv->w.shape(), (Shape{4 * c.cout, cin, 2, 2}));
    // bf16 / fp16: the summed taps are rounded once, the reference's taps each: a little more
    // than one op's rounding.
    expect_close(be(), (*conv)(be(), x.dev, c.act), out, want, 3 * tol(),
                 str_cat("upsampling conv ", shape_str(c.x), " -> ", c.cout));
  }
}

TEST(UpsampleConvPhases, WeightsAreTheSumsOfTheTapsEachPhaseReads) {
  // One input and output channel, taps 1, 2, 4, ..., 256 (row-major): every sum is distinct.
  std::vector<float> taps(9);
  for (int i = 0; i < 9; ++i) taps[i] = static_cast<float>(1 << i);
  const Tensor p = upsample_conv_phase_weights(Tensor::from_floats({1, 1, 3, 3}, taps));
  ASSERT_EQ(p.shape(), (Shape{4, 1, 2, 2}));
  const std::vector<float> got = p.to_floats();
  // Phase (a, b): rows {0}, {1, 2} for a = 0 and {0, 1}, {2} for a = 1; columns likewise.
  auto sum = [&](std::initializer_list<int> rows, std::initializer_list<int> cols) {
    float s = 0;
    for (int r : rows)
      for (int c : cols) s += taps[r * 3 + c];
    return s;
  };
  const std::vector<float> want = {
      sum({0}, {0}),       sum({0}, {1, 2}),    sum({1, 2}, {0}),    sum({1, 2}, {1, 2}),  // (0, 0)
      sum({0}, {0, 1}),    sum({0}, {2}),       sum({1, 2}, {0, 1}), sum({1, 2}, {2}),     // (0, 1)
      sum({0, 1}, {0}),    sum({0, 1}, {1, 2}), sum({2}, {0}),       sum({2}, {1, 2}),     // (1, 0)
      sum({0, 1}, {0, 1}), sum({0, 1}, {2}),    sum({2}, {0, 1}),    sum({2}, {2})};       // (1, 1)
  EXPECT_EQ(got, want);
}

TEST_P(CpuOps, SpatialAttention) {
  struct Case {
    Shape s;
    int heads;
  };
  const std::vector<Case> cases = {
      {{2, 8, 3, 5}, 2},     // T = 15, less than one query block
      {{1, 16, 20, 15}, 2},  // T = 300: a full block and a partial one
      {{1, 64, 32, 32}, 1},  // VAE mid-block style, T = 1024: four blocks
      {{1, 64, 16, 16}, 4},
  };
  uint64_t seed = 1300;
  for (const Case& c : cases) {
    Arg q = make_arg(be(), c.s, ++seed, -2.f, 2.f);
    Arg k = make_arg(be(), c.s, ++seed, -2.f, 2.f);
    Arg v = make_arg(be(), c.s, ++seed);
    expect_close(be(), be().spatial_attention(q.dev, k.dev, v.dev, c.heads), c.s,
                 attention_ref(q.v, k.v, v.v, c.s, c.heads), tol(),
                 str_cat("spatial_attention ", shape_str(c.s), " heads ", c.heads));
  }
}

TEST_P(CpuOps, SupportsItsOwnDtypeOnly) {
  for (int op = 0; op <= static_cast<int>(OpKind::kInterleavePhases2x); ++op)
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      EXPECT_EQ(be().supports(static_cast<OpKind>(op), dt), dt == GetParam())
          << op_name(static_cast<OpKind>(op)) << ' ' << dtype_name(dt);
}

// supports() with the input's shape: [N, C, H, W] of positive sizes, in the backend's dtype.
TEST_P(CpuOps, SupportsKnowsTheShape) {
  const Backend& b = be();
  EXPECT_TRUE(b.supports(OpKind::kConv2d, GetParam(), Shape{1, 3, 8, 8}));
  EXPECT_FALSE(b.supports(OpKind::kConv2d, GetParam(), Shape{1, 3, 0, 8}));
  EXPECT_FALSE(b.supports(OpKind::kGroupNorm, GetParam(), Shape{3, 8, 8}));
  const DType other = GetParam() == DType::kF32 ? DType::kBF16 : DType::kF32;
  EXPECT_FALSE(b.supports(OpKind::kConv2d, other, Shape{1, 3, 8, 8}));
}

TEST_P(CpuOps, UploadDownloadRoundTrip) {
  Tensor host = test::random_tensor({2, 3, 4, 5}, 41);
  Tensor dev = must(be().upload(host), "upload");
  EXPECT_EQ(dev.dtype(), GetParam());
  EXPECT_TRUE(dev.device().is_cpu());
  EXPECT_NE(dev.data(), host.data());  // a copy, never the caller's buffer
  Tensor back = must(be().download(dev), "download");
  EXPECT_EQ(back.dtype(), DType::kF32);
  EXPECT_LE(relative_l2(back, host), GetParam() == DType::kF32 ? 0.0 : tol());
  // A bf16 host tensor is converted on upload too.
  Tensor dev2 = must(be().upload(host.to_dtype(DType::kBF16)), "upload bf16");
  EXPECT_EQ(dev2.dtype(), GetParam());
  EXPECT_LE(relative_l2(must(be().download(dev2), "download"), host), 1e-2);
}

TEST(CpuOpsDtypes, Bf16ConversionMatchesCore) {
  // The backend's vectorised bf16 conversion must round exactly like engine/core/dtype.cpp,
  // including ties, infinities, NaN and subnormals; long enough to span several chunks.
  const float specials[] = {0.f,         -0.f,         1.f,           1.00390625f,
                            1.01171875f, -1.00390625f, 3.4028235e38f, -3.4028235e38f,
                            1e-40f,      -1e-45f,      INFINITY,      -INFINITY,
                            NAN,         -NAN,         65504.f,       0.1f};
  Tensor host = test::random_tensor({3, 70000}, 9, -1e3f, 1e3f);
  for (size_t i = 0; i < sizeof(specials) / sizeof(float); ++i)
    host.data_as<float>()[i * 997] = specials[i];
  auto be = cpu(DType::kBF16);
  Tensor dev = must(be->upload(host), "upload");
  ASSERT_EQ(dev.dtype(), DType::kBF16);
  const float* src = host.data_as<float>();
  const uint16_t* got = dev.data_as<uint16_t>();
  int mismatches = 0;
  for (int64_t i = 0; i < host.numel(); ++i) mismatches += got[i] != f32_to_bf16(src[i]);
  EXPECT_EQ(mismatches, 0);
  std::vector<float> back = must(be->download(dev), "download").to_floats();
  mismatches = 0;
  for (int64_t i = 0; i < host.numel(); ++i) {
    const float want = bf16_to_f32(got[i]);
    mismatches += !(back[i] == want || (std::isnan(back[i]) && std::isnan(want)));
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuOps, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// Bad inputs: an error that names the op and the offending shape, never a crash.

void expect_error(const Result<Tensor>& r, const std::vector<std::string>& needles) {
  ASSERT_FALSE(r.ok()) << "expected an error containing '" << needles.front() << "'";
  for (const std::string& n : needles)
    EXPECT_NE(r.status().message().find(n), std::string::npos)
        << "'" << r.status().message() << "' lacks '" << n << "'";
}

TEST(CpuOpsErrors, Conv2d) {
  auto be = cpu(DType::kF32);
  Tensor x = test::random_tensor({1, 4, 8, 8}, 1);
  Tensor w = test::random_tensor({8, 4, 3, 3}, 2);
  Tensor b = test::random_tensor({8}, 3);
  auto same = Conv2dParams::same(3);
  ASSERT_TRUE(be->conv2d(x, w, b, same).ok());
  expect_error(be->conv2d(x, test::random_tensor({8, 5, 3, 3}, 2), b, same),
               {"conv2d", "[8, 5, 3, 3]", "[1, 4, 8, 8]"});
  expect_error(be->conv2d(test::random_tensor({4, 8, 8}, 1), w, b, same),
               {"conv2d", "4-D", "[4, 8, 8]"});
  expect_error(be->conv2d(x, test::random_tensor({8, 4, 9}, 2), b, same), {"conv2d", "weight"});
  expect_error(be->conv2d(x, w, test::random_tensor({7}, 3), same), {"conv2d", "bias", "[7]"});
  expect_error(be->conv2d(x, w, b, same, test::random_tensor({1, 8, 4, 4}, 4)),
               {"conv2d", "residual", "[1, 8, 4, 4]", "[1, 8, 8, 8]"});
  expect_error(be->conv2d(test::random_tensor({1, 4, 2, 2}, 1), w, b, Conv2dParams()),
               {"conv2d", "kernel"});
  Conv2dParams bad;
  bad.stride = 0;
  expect_error(be->conv2d(x, w, b, bad), {"conv2d", "stride"});
  expect_error(be->conv2d(Tensor(), w, b, same), {"conv2d", "undefined"});
  expect_error(be->conv2d(x.to_dtype(DType::kBF16), w, b, same), {"conv2d", "bf16", "fp32"});
  expect_error(be->conv2d(x, w, b, same, Tensor(), static_cast<Activation>(42)),
               {"conv2d", "activation"});
  // A view whose storage is too small for its shape.
  Tensor small = Tensor::from_storage(Storage::allocate_host(16), 0, {1, 4, 8, 8}, DType::kF32);
  expect_error(be->conv2d(small, w, b, same), {"conv2d", "storage"});
}

TEST(CpuOpsErrors, Norms) {
  auto be = cpu(DType::kF32);
  Tensor x = test::random_tensor({1, 6, 4, 4}, 1);
  Tensor g6 = test::random_tensor({6}, 2), g5 = test::random_tensor({5}, 2);
  expect_error(be->group_norm(x, 4, g6, g6, 1e-5f), {"group_norm", "4 groups", "[1, 6, 4, 4]"});
  expect_error(be->group_norm(x, 0, g6, g6, 1e-5f), {"group_norm", "0 groups"});
  expect_error(be->group_norm(x, 3, g5, g5, 1e-5f), {"group_norm", "gamma", "[5]"});
  expect_error(be->group_norm(x, 3, g6, Tensor(), 1e-5f), {"group_norm", "beta"});
  expect_error(be->group_norm(test::random_tensor({6, 16}, 1), 3, g6, g6, 1e-5f),
               {"group_norm", "4-D"});
  expect_error(be->group_norm(x, 3, g6, g6, -1.f), {"group_norm", "eps"});
  expect_error(be->rms_norm_channels(x, g5, Tensor()), {"rms_norm_channels", "gamma", "[5]"});
  expect_error(be->rms_norm_channels(x, g6, g5), {"rms_norm_channels", "beta"});
  expect_error(be->rms_norm_channels(test::random_tensor({6}, 1), g6, Tensor()),
               {"rms_norm_channels", "4-D"});
}

TEST(CpuOpsErrors, ElementwiseAndAttention) {
  auto be = cpu(DType::kF32);
  Tensor x = test::random_tensor({1, 4, 3, 3}, 1);
  expect_error(be->add(x, test::random_tensor({1, 4, 3, 4}, 2)),
               {"add", "[1, 4, 3, 3]", "[1, 4, 3, 4]"});
  expect_error(be->channel_affine(x, {1, 2, 3}, {1, 2, 3, 4}),
               {"channel_affine", "3 scales", "[1, 4, 3, 3]"});
  expect_error(be->channel_affine(test::random_tensor({4, 9}, 1), {1, 2, 3, 4}, {1, 2, 3, 4}),
               {"channel_affine", "4-D"});
  expect_error(be->clamp(x, 1.f, -1.f), {"clamp"});
  expect_error(be->activation(Tensor(), Activation::kSiLU), {"activation", "undefined"});
  expect_error(be->upsample_nearest2x(test::random_tensor({4, 3, 3}, 1)),
               {"upsample_nearest2x", "4-D"});
  expect_error(be->interleave_phases2x(test::random_tensor({1, 6, 3, 3}, 1)),
               {"interleave_phases2x", "[1, 6, 3, 3]", "4 phases"});
  expect_error(be->interleave_phases2x(test::random_tensor({1, 8, 1, 3}, 1)),
               {"interleave_phases2x", "[1, 8, 1, 3]"});
  Result<UpsampleConv> one_by_one =
      make_upsample_conv(*be, test::random_tensor({2, 4, 1, 1}, 1), Tensor());
  ASSERT_FALSE(one_by_one.ok());
  EXPECT_NE(one_by_one.status().message().find("[Cout, Cin, 3, 3]"), std::string::npos)
      << one_by_one.status().message();
  expect_error(be->slice_channels(x, 2, 3), {"slice_channels", "[2, 5)", "[1, 4, 3, 3]"});
  expect_error(be->slice_channels(x, -1, 2), {"slice_channels"});
  expect_error(be->slice_channels(x, 0, 0), {"slice_channels"});
  expect_error(be->spatial_attention(x, x, x, 3), {"spatial_attention", "3 heads"});
  expect_error(be->spatial_attention(x, x, x, 0), {"spatial_attention", "0 heads"});
  expect_error(be->spatial_attention(x, test::random_tensor({1, 4, 3, 2}, 1), x, 1),
               {"spatial_attention", "[1, 4, 3, 2]"});
  expect_error(be->spatial_attention(test::random_tensor({4, 9}, 1), x, x, 1),
               {"spatial_attention", "4-D"});
  expect_error(be->upload(Tensor()), {"upload"});
  expect_error(be->download(Tensor()), {"download"});
}

// ---------------------------------------------------------------------------------------------
// Concurrency: one shared backend used by several threads (two pipeline elements at once).

TEST(CpuOpsThreads, ConcurrentConvAndAttention) {
  auto be = cpu(DType::kF32);
  const Shape xs = {1, 16, 12, 12}, ws = {16, 16, 3, 3};
  Tensor x = test::random_tensor(xs, 5), w = test::random_tensor(ws, 6, -0.3f, 0.3f);
  Shape out;
  std::vector<double> want = conv_ref(x.to_floats(), xs, w.to_floats(), ws, nullptr,
                                      Conv2dParams::same(3), nullptr, Activation::kSiLU, &out);
  std::vector<double> want_att = attention_ref(x.to_floats(), x.to_floats(), x.to_floats(), xs, 2);
  std::vector<double> errs(8, INFINITY);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      double worst = 0;
      for (int r = 0; r < 10; ++r) {
        Result<Tensor> y =
            i % 2 ? be->conv2d(x, w, Tensor(), Conv2dParams::same(3), Tensor(), Activation::kSiLU)
                  : be->spatial_attention(x, x, x, 2);
        if (!y.ok()) return;
        worst = std::max(worst, rel_l2(y->to_floats(), i % 2 ? want : want_att));
      }
      errs[i] = worst;
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) EXPECT_LE(errs[i], 1e-5) << "thread " << i;
}

// ---------------------------------------------------------------------------------------------
// Registry

TEST(BackendRegistry, CpuInstancesAreSharedPerDtype) {
  auto a = must(get_backend({"cpu", ""}), "cpu");
  auto b = must(get_backend({"cpu", "fp32"}), "cpu fp32");
  auto c = must(get_backend({"cpu", "bf16"}), "cpu bf16");
  auto d = must(get_backend({"cpu", "bfloat16"}), "cpu bfloat16");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(c.get(), d.get());
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(a->compute_dtype(), DType::kF32);
  EXPECT_EQ(c->compute_dtype(), DType::kBF16);
  EXPECT_EQ(a->name(), "cpu");
  EXPECT_TRUE(a->device().is_cpu());
}

TEST(BackendRegistry, ConcurrentGetReturnsOneInstance) {
  std::vector<Backend*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      auto r = get_backend({"cpu", "fp16"});
      if (r.ok()) seen[i] = r->get();
    });
  for (auto& t : threads) t.join();
  for (Backend* p : seen) {
    EXPECT_NE(p, nullptr);
    EXPECT_EQ(p, seen[0]);
  }
}

TEST(BackendRegistry, AutoAndCuda) {
  auto autob = get_backend({"auto", ""});
  ASSERT_TRUE(autob.ok()) << autob.status().message();
  if (cuda_device_count() == 0) {
    EXPECT_TRUE((*autob)->device().is_cpu());
    EXPECT_EQ((*autob)->compute_dtype(), DType::kF32);
    EXPECT_EQ(autob->get(), must(get_backend({"cpu", ""}), "cpu").get());
  }
  if (!cuda_backend_built()) {
    EXPECT_EQ(cuda_device_count(), 0);
    for (const char* dev : {"cuda", "cuda:0", "cuda:3", "gpu"}) {
      auto r = get_backend({dev, ""});
      ASSERT_FALSE(r.ok()) << dev;
      EXPECT_NE(
          r.status().message().find(
              "this build of gst-latent has no CUDA backend (built without CUDA toolkit/cuDNN)"),
          std::string::npos)
          << r.status().message();
    }
  } else if (cuda_device_count() == 0) {
    auto r = get_backend({"cuda:1", ""});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("no CUDA device available (cuda:1 requested, 0 found)"),
              std::string::npos)
        << r.status().message();
  }
}

TEST(BackendRegistry, BadNames) {
  auto r = get_backend({"tpu", ""});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tpu"), std::string::npos);
  auto s = get_backend({"cpu", "int8"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("int8"), std::string::npos);
}

TEST(BackendRegistry, OpNames) {
  EXPECT_STREQ(op_name(OpKind::kConv2d), "conv2d");
  EXPECT_STREQ(op_name(OpKind::kSpatialAttention), "spatial_attention");
  EXPECT_STREQ(op_name(OpKind::kInterleavePhases2x), "interleave_phases2x");
  for (int op = 0; op <= static_cast<int>(OpKind::kInterleavePhases2x); ++op)
    EXPECT_STRNE(op_name(static_cast<OpKind>(op)), "unknown");
}

}  // namespace
}  // namespace latent
