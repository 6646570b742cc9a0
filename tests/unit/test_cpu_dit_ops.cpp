// The CPU backend's DiT ops (backend.h, "DiT ops") against plain double-precision references
// written here as naive loops, at small shapes with edge cases and at DiT-like shapes, for each
// storage dtype; plus bad inputs, which must come back as errors naming the op.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/registry.h"
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

void expect_matches(Backend& be, const Result<Tensor>& got, const Shape& shape,
                    const std::vector<double>& want, DType dtype, const char* what) {
  ASSERT_TRUE(got.ok()) << what << ": " << got.status().message();
  ASSERT_EQ(got->shape(), shape) << what;
  const double err = rel_l2(must(be.download(*got), "download").to_floats(), want);
  EXPECT_LT(err, tolerance(dtype)) << what << " (" << dtype_name(dtype) << ")";
}

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double silu(double x) { return x / (1 + std::exp(-x)); }

const DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// ---------------------------------------------------------------------------------------------
// Ops

void check_linear(DType dt, int64_t b, int64_t t, int64_t k, int64_t n, bool bias,
                  DitActivation act) {
  auto be = cpu(dt);
  Arg x = make_arg(*be, {b, t, k}, 1), w = make_arg(*be, {n, k}, 2, -0.2f, 0.2f);
  Arg bb = make_arg(*be, {n}, 3);
  std::vector<double> want(static_cast<size_t>(b * t * n));
  for (int64_t r = 0; r < b * t; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias ? bb.v[j] : 0.0;
      for (int64_t i = 0; i < k; ++i) s += static_cast<double>(x.v[r * k + i]) * w.v[j * k + i];
      if (act == DitActivation::kSiLU) s = silu(s);
      if (act == DitActivation::kGELUTanh) s = gelu_tanh(s);
      want[r * n + j] = s;
    }
  expect_matches(*be, be->linear(x.dev, w.dev, bias ? bb.dev : Tensor(), act), {b, t, n}, want, dt,
                 "linear");
}

TEST(CpuDitOps, Linear) {
  for (DType dt : kDtypes) {
    check_linear(dt, 2, 7, 5, 3, true, DitActivation::kNone);
    check_linear(dt, 1, 33, 48, 72, false, DitActivation::kSiLU);
    check_linear(dt, 1, 33, 48, 72, true, DitActivation::kGELUTanh);
  }
  check_linear(DType::kF32, 1, 300, 256, 1024, true, DitActivation::kGELUTanh);  // DiT-like
}

void check_norms(DType dt, int64_t rows, int64_t d) {
  auto be = cpu(dt);
  Arg x = make_arg(*be, {rows, d}, 4, -2.f, 3.f), g = make_arg(*be, {d}, 5),
      bta = make_arg(*be, {d}, 6);
  std::vector<double> ln(static_cast<size_t>(rows * d)), ln_plain(ln.size()), rms(ln.size()),
      rms_plain(ln.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0, sq = 0;
    for (int64_t i = 0; i < d; ++i) mean += x.v[r * d + i] / static_cast<double>(d);
    for (int64_t i = 0; i < d; ++i) {
      const double c = x.v[r * d + i] - mean;
      var += c * c / d;
      sq += static_cast<double>(x.v[r * d + i]) * x.v[r * d + i] / d;
    }
    for (int64_t i = 0; i < d; ++i) {
      const double n = (x.v[r * d + i] - mean) / std::sqrt(var + 1e-6);
      ln_plain[r * d + i] = n;
      ln[r * d + i] = n * g.v[i] + bta.v[i];
      rms_plain[r * d + i] = x.v[r * d + i] / std::sqrt(sq + 1e-6);
      rms[r * d + i] = rms_plain[r * d + i] * g.v[i];
    }
  }
  expect_matches(*be, be->layer_norm(x.dev, g.dev, bta.dev, 1e-6f), {rows, d}, ln, dt,
                 "layer_norm");
  expect_matches(*be, be->layer_norm(x.dev, Tensor(), Tensor(), 1e-6f), {rows, d}, ln_plain, dt,
                 "layer_norm (no affine)");
  expect_matches(*be, be->rms_norm(x.dev, g.dev, 1e-6f), {rows, d}, rms, dt, "rms_norm");
  expect_matches(*be, be->rms_norm(x.dev, Tensor(), 1e-6f), {rows, d}, rms_plain, dt,
                 "rms_norm (no gamma)");
}

TEST(CpuDitOps, LayerNormAndRmsNorm) {
  for (DType dt : kDtypes) check_norms(dt, 13, 40);
  check_norms(DType::kF32, 4096, 128);  // per-head QK norm of a DiT
}

// modulate, layer_norm_modulate and gated_add with two token groups and a batch of two.
TEST(CpuDitOps, ModulationWithTokenGroups) {
  for (DType dt : kDtypes) {
    auto be = cpu(dt);
    const int64_t b = 2, t = 11, d = 24;
    const std::vector<int64_t> groups = {0, 7};
    Arg x = make_arg(*be, {b, t, d}, 7, -2.f, 2.f), res = make_arg(*be, {b, t, d}, 8);
    Arg shift = make_arg(*be, {2, b, d}, 9), scale = make_arg(*be, {2 * b, d}, 10),
        gate = make_arg(*be, {2, b, d}, 11);
    std::vector<double> mod(static_cast<size_t>(b * t * d)), lnmod(mod.size()), gated(mod.size());
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t ti = 0; ti < t; ++ti) {
        const int64_t row = ((ti >= 7) * b + bi) * d, o = (bi * t + ti) * d;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; ++i) mean += x.v[o + i] / static_cast<double>(d);
        for (int64_t i = 0; i < d; ++i) var += (x.v[o + i] - mean) * (x.v[o + i] - mean) / d;
        for (int64_t i = 0; i < d; ++i) {
          mod[o + i] = x.v[o + i] * (1.0 + scale.v[row + i]) + shift.v[row + i];
          lnmod[o + i] = (x.v[o + i] - mean) / std::sqrt(var + 1e-6) * (1.0 + scale.v[row + i]) +
                         shift.v[row + i];
          gated[o + i] = res.v[o + i] + static_cast<double>(gate.v[row + i]) * x.v[o + i];
        }
      }
    expect_matches(*be, be->modulate(x.dev, shift.dev, scale.dev, groups), {b, t, d}, mod, dt,
                   "modulate");
    expect_matches(*be, be->layer_norm_modulate(x.dev, shift.dev, scale.dev, groups, 1e-6f),
                   {b, t, d}, lnmod, dt, "layer_norm_modulate");
    expect_matches(*be, be->gated_add(res.dev, x.dev, gate.dev, groups), {b, t, d}, gated, dt,
                   "gated_add");
  }
}

TEST(CpuDitOps, RopeOnInterleavedPairs) {
  for (DType dt : kDtypes) {
    auto be = cpu(dt);
    const int64_t b = 2, t = 9, heads = 3, d = 8;
    Arg x = make_arg(*be, {b, t, heads * d}, 12);
    Tensor angles = test::random_tensor({t, d / 2}, 13, -10.f, 10.f);
    Tensor table = Tensor::empty({t, d / 2, 2}, DType::kF32);
    const float* a = angles.data_as<float>();
    for (int64_t i = 0; i < t * d / 2; ++i) {
      table.data_as<float>()[2 * i] = std::cos(a[i]);
      table.data_as<float>()[2 * i + 1] = std::sin(a[i]);
    }
    Tensor freqs = must(be->upload_fp32(table), "upload_fp32");
    EXPECT_EQ(freqs.dtype(), DType::kF32);
    std::vector<double> want(x.v.size());
    for (int64_t r = 0; r < b * t; ++r)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < d / 2; ++i) {
          const double th = a[(r % t) * d / 2 + i];
          const int64_t o = r * heads * d + h * d + 2 * i;
          // (re + i im) * e^{i th}
          want[o] = x.v[o] * std::cos(th) - x.v[o + 1] * std::sin(th);
          want[o + 1] = x.v[o] * std::sin(th) + x.v[o + 1] * std::cos(th);
        }
    expect_matches(*be, be->rope(x.dev, freqs, heads), {b, t, heads * d}, want, dt, "rope");
  }
}

void check_attention(DType dt, int64_t b, int64_t t, int64_t s, int heads, int64_t d, bool masked) {
  auto be = cpu(dt);
  const int64_t hd = heads * d;
  Arg q = make_arg(*be, {b, t, hd}, 14, -2.f, 2.f), k = make_arg(*be, {b, s, hd}, 15, -2.f, 2.f),
      v = make_arg(*be, {b, s, hd}, 16);
  std::vector<float> mask(static_cast<size_t>(b * s), 1.f);
  if (masked)
    for (int64_t i = 0; i < b * s; ++i) mask[i] = (i % 5 == 1 || i % 7 == 3) ? 0.f : 1.f;
  std::vector<double> want(static_cast<size_t>(b * t * hd)), p(static_cast<size_t>(s));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < s; ++j) {
          if (mask[bi * s + j] == 0.f) continue;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += static_cast<double>(q.v[(bi * t + i) * hd + h * d + c]) *
                   k.v[(bi * s + j) * hd + h * d + c];
          p[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j < s; ++j)
          if (mask[bi * s + j] != 0.f) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t c = 0; c < d; ++c) {
          double o = 0;
          for (int64_t j = 0; j < s; ++j)
            if (mask[bi * s + j] != 0.f) o += p[j] / sum * v.v[(bi * s + j) * hd + h * d + c];
          want[(bi * t + i) * hd + h * d + c] = o;
        }
      }
  Tensor m;
  if (masked) m = must(be->upload(Tensor::from_floats({b, s}, mask)), "upload mask");
  expect_matches(*be, be->attention(q.dev, k.dev, v.dev, heads, m), {b, t, hd}, want, dt,
                 masked ? "attention (masked)" : "attention");
}

TEST(CpuDitOps, AttentionWithKeyPaddingMask) {
  for (DType dt : kDtypes) {
    check_attention(dt, 2, 5, 9, 2, 8, false);
    check_attention(dt, 2, 5, 9, 2, 8, true);
  }
  // More queries than one block (256), keys not a multiple of anything.
  check_attention(DType::kF32, 1, 300, 317, 3, 16, true);
  check_attention(DType::kF32, 2, 261, 40, 2, 32, false);
}

// key_lengths (backend.h) promise that the mask is a prefix of valid keys: the CPU computes with
// the mask alone and checks the promise.
TEST(CpuDitOps, AttentionKeyLengthsDescribeTheMask) {
  auto be = cpu(DType::kF32);
  Arg x = make_arg(*be, {2, 6, 8}, 28);
  const std::vector<float> keep = {1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1};  // lengths 4 and 6
  Tensor mask = must(be->upload(Tensor::from_floats({2, 6}, keep)), "upload");
  Tensor plain = must(be->attention(x.dev, x.dev, x.dev, 2, mask), "attention");
  Tensor with = must(be->attention(x.dev, x.dev, x.dev, 2, mask, {4, 6}), "with key_lengths");
  EXPECT_EQ(with.to_floats(), plain.to_floats());
  auto expect_error = [](const Result<Tensor>& r, const std::string& words) {
    ASSERT_FALSE(r.ok()) << words;
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
  };
  expect_error(be->attention(x.dev, x.dev, x.dev, 2, Tensor(), {4, 6}), "without a key_mask");
  expect_error(be->attention(x.dev, x.dev, x.dev, 2, mask, {4}), "1 key_lengths for a batch of 2");
  expect_error(be->attention(x.dev, x.dev, x.dev, 2, mask, {4, 7}), "is outside [1, 6]");
  expect_error(be->attention(x.dev, x.dev, x.dev, 2, mask, {3, 6}),
               "key_lengths[0] = 3 disagrees with key_mask at key 3");
  // A hole is no prefix, whatever the length.
  const std::vector<float> hole = {1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1};
  Tensor holed = must(be->upload(Tensor::from_floats({2, 6}, hole)), "upload");
  expect_error(be->attention(x.dev, x.dev, x.dev, 2, holed, {4, 6}), "disagrees with key_mask");
}

TEST(CpuDitOps, ActivationsScaledAddAndCfg) {
  for (DType dt : kDtypes) {
    auto be = cpu(dt);
    Arg x = make_arg(*be, {3, 50}, 17, -4.f, 4.f), y = make_arg(*be, {3, 50}, 18, -4.f, 4.f);
    std::vector<double> g(x.v.size()), s(x.v.size()), sa(x.v.size()), cfg(x.v.size());
    for (size_t i = 0; i < x.v.size(); ++i) {
      g[i] = gelu_tanh(x.v[i]);
      s[i] = silu(x.v[i]);
      sa[i] = 0.75 * x.v[i] - 0.125 * y.v[i];
    }
    for (int r = 0; r < 3; ++r) {
      double cn = 0, mn = 0;
      std::vector<double> comb(50);
      for (int i = 0; i < 50; ++i) {
        comb[i] = y.v[r * 50 + i] + 4.0 * (x.v[r * 50 + i] - y.v[r * 50 + i]);
        cn += static_cast<double>(x.v[r * 50 + i]) * x.v[r * 50 + i];
        mn += comb[i] * comb[i];
      }
      for (int i = 0; i < 50; ++i) cfg[r * 50 + i] = comb[i] * std::sqrt(cn / mn);
    }
    expect_matches(*be, be->dit_activation(x.dev, DitActivation::kGELUTanh), {3, 50}, g, dt,
                   "gelu_tanh");
    expect_matches(*be, be->dit_activation(x.dev, DitActivation::kSiLU), {3, 50}, s, dt, "silu");
    expect_matches(*be, be->scaled_add(x.dev, y.dev, 0.75f, -0.125f), {3, 50}, sa, dt,
                   "scaled_add");
    expect_matches(*be, be->cfg_combine(x.dev, y.dev, 4.f), {3, 50}, cfg, dt, "cfg_combine");
  }
}

TEST(CpuDitOps, ConcatAndSliceAlongEachDim) {
  for (DType dt : kDtypes) {
    auto be = cpu(dt);
    Arg a = make_arg(*be, {2, 3, 4}, 19), b = make_arg(*be, {2, 5, 4}, 20);
    auto c = be->concat({a.dev, b.dev}, 1);
    ASSERT_TRUE(c.ok()) << c.status().message();
    ASSERT_EQ(c->shape(), (Shape{2, 8, 4}));
    const std::vector<float> cv = must(be->download(*c), "download").to_floats();
    for (int64_t bi = 0; bi < 2; ++bi)
      for (int64_t t = 0; t < 8; ++t)
        for (int64_t i = 0; i < 4; ++i)
          ASSERT_EQ(cv[(bi * 8 + t) * 4 + i],
                    t < 3 ? a.v[(bi * 3 + t) * 4 + i] : b.v[(bi * 5 + t - 3) * 4 + i]);
    // Slicing back along each dim, including the last (a copy) and the first (a view).
    auto back = be->slice(*c, 1, 3, 5);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(must(be->download(*back), "download").to_floats(), b.v);
    auto last = be->slice(a.dev, -1, 1, 2);
    ASSERT_TRUE(last.ok());
    ASSERT_EQ(last->shape(), (Shape{2, 3, 2}));
    const std::vector<float> lv = must(be->download(*last), "download").to_floats();
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t i = 0; i < 2; ++i) ASSERT_EQ(lv[r * 2 + i], a.v[r * 4 + 1 + i]);
    auto first = be->slice(a.dev, 0, 1, 1);
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(first->storage(), a.dev.storage());  // one contiguous block: a view
    EXPECT_EQ(must(be->download(*first), "download").to_floats(),
              std::vector<float>(a.v.begin() + 12, a.v.end()));
    auto c0 = be->concat({a.dev, a.dev}, 0);
    ASSERT_TRUE(c0.ok());
    EXPECT_EQ(c0->shape(), (Shape{4, 3, 4}));
  }
}

TEST(CpuDitOps, SupportsEveryDitOpInItsDtype) {
  for (DType dt : kDtypes) {
    auto be = cpu(dt);
    for (int op = 0; op <= static_cast<int>(DitOp::kSlice); ++op)
      EXPECT_TRUE(be->supports_dit(static_cast<DitOp>(op), dt))
          << dit_op_name(static_cast<DitOp>(op));
    EXPECT_FALSE(be->supports_dit(DitOp::kLinear, dt == DType::kF32 ? DType::kBF16 : DType::kF32));
  }
}

TEST(CpuDitOps, BadInputsAreErrorsNamingTheOp) {
  auto be = cpu(DType::kF32);
  Arg x = make_arg(*be, {2, 6, 8}, 21), w = make_arg(*be, {4, 7}, 22);
  auto expect_error = [](const Result<Tensor>& r, const std::string& words) {
    ASSERT_FALSE(r.ok()) << words;
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
  };
  expect_error(be->linear(x.dev, w.dev, Tensor(), DitActivation::kNone), "linear: weight w [4, 7]");
  Arg w2 = make_arg(*be, {4, 8}, 23), bias = make_arg(*be, {5}, 24);
  expect_error(be->linear(x.dev, w2.dev, bias.dev, DitActivation::kNone), "linear: bias [5]");
  expect_error(be->linear(x.dev, w2.dev, Tensor(), static_cast<DitActivation>(9)),
               "unknown activation");
  Arg g = make_arg(*be, {7}, 25);
  expect_error(be->layer_norm(x.dev, g.dev, Tensor(), 1e-6f), "layer_norm: gamma [7]");
  expect_error(be->rms_norm(x.dev, Tensor(), -1.f), "rms_norm: invalid eps");
  Arg shift = make_arg(*be, {1, 2, 8}, 26);
  expect_error(be->modulate(x.dev, shift.dev, shift.dev, {0, 3}), "should hold 2 group(s)");
  expect_error(be->modulate(x.dev, shift.dev, shift.dev, {1}), "start at token 0");
  expect_error(be->gated_add(x.dev, x.dev, shift.dev, {0, 6}), "stay below the 6 tokens");
  Tensor table = must(be->upload_fp32(Tensor::zeros({6, 3, 2}, DType::kF32)), "upload_fp32");
  expect_error(be->rope(x.dev, table, 2), "rope: freqs [6, 3, 2] should be [6, 2, 2]");
  expect_error(be->rope(x.dev, table, 3), "do not split into 3 heads");
  Tensor mask = must(be->upload(Tensor::zeros({2, 6}, DType::kF32)), "upload");
  expect_error(be->attention(x.dev, x.dev, x.dev, 2, mask), "masks every key of batch row 0");
  expect_error(be->attention(x.dev, x.dev, x.dev, 3, Tensor()), "cannot be split into 3 heads");
  Arg other = make_arg(*be, {2, 6, 4}, 27);
  expect_error(be->scaled_add(x.dev, other.dev, 1.f, 1.f), "scaled_add: shapes differ");
  expect_error(be->cfg_combine(x.dev, other.dev, 1.f), "cfg_combine: cond [2, 6, 8]");
  expect_error(be->concat({x.dev, other.dev}, 1), "does not match part 0");
  expect_error(be->concat({}, 0), "no tensors");
  expect_error(be->slice(x.dev, 3, 0, 1), "dim 3 is out of range");
  expect_error(be->slice(x.dev, 1, 4, 3), "[4, 7) is outside the 6 entries");
  expect_error(be->linear(Tensor(), w2.dev, Tensor(), DitActivation::kNone),
               "input x is undefined");
}

}  // namespace
}  // namespace latent
