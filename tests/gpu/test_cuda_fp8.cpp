// dtype fp8 on the GPU (backend.h, Fp8Matrix; engine/backends/cuda/fp8_quant.cu, dit_linear.cpp):
//   - the row quantisation kernel gives the host's codes and scales bit for bit
//     (engine/weights/fp8.h, fp8_e4m3_quantize_row), on Qwen-Image-sized and odd shapes;
//   - linear_fp8 on cuBLASLt (e4m3 x e4m3, per-row scales, bias / GELU epilogues) matches the
//     CPU backend's emulation of the same arithmetic (the same codes and scales, multiplied in
//     fp32) within the bf16 output's rounding and the tensor cores' accumulation;
//   - and is an FP8 product, not a bf16 one: its distance from the unquantised fp32 product is
//     that of e4m3 (a few %), within a bound;
//   - linear_fp8_gated_add (the gate in the weight's scales, the residual as C) matches the
//     emulation and the two-op composition on what it adds; linear_fp8_joined writes two
//     layers' rows into one tensor as their outputs concatenated;
//   - the tiny Qwen-Image transformer with LinearFormat::kFp8 on CUDA matches the CPU emulation;
//   - attention_fp8 runs cuDNN's FP8 SDPA (e4m3 q, k, v, probabilities and output, one scale
//     each) within e4m3's error of the fp32 attention, with and without key lengths, its output
//     rows all of one scale; a key mask without lengths stays in bf16 (quantised after); the
//     tiny transformer with one batch row (its attention outputs then FP8) stays near diffusers.
// Skips (77) without a GPU (or in a build without CUDA); the FP8 tests skip on GPUs other than
// compute capability 9.0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/util/test_util.h"
#ifdef LATENT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/sdpa.h"
#include "engine/backends/registry.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/fp8.h"
#include "tests/util/cuda_test_util.h"
#include "tests/util/dit_test_util.h"
#endif

// Runs before gtest's main: no GPU, no test.
const bool kGpuPresent = (latent::test::exit_without_gpu("test_cuda_fp8"), true);

#ifdef LATENT_HAVE_CUDA

namespace latent {
namespace {

class CudaFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu_ = test::poisoned_cuda_backend(DType::kBF16);
    cpu_ = test::cpu_reference();
    ASSERT_TRUE(gpu_ && cpu_);
    if (!gpu_->supports_fp8_linear()) GTEST_SKIP() << gpu_->name() << " has no FP8 row scaling";
  }

  // Uniform [lo, hi) rounded to bf16 (what both backends then see).
  static Tensor bf16_input(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
    return test::random_tensor(shape, seed, lo, hi).to_dtype(DType::kBF16).to_dtype(DType::kF32);
  }
  Tensor up(Backend& be, const Tensor& host) {
    if (!host.defined()) return Tensor();
    Result<Tensor> r = be.upload(host);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r.value() : Tensor();
  }
  // The device bytes of a quantised matrix: codes and scales.
  void fetch(const Fp8Matrix& m, std::vector<uint8_t>* codes, std::vector<float>* scales) {
    ASSERT_TRUE(gpu_->synchronize().ok());
    codes->resize(static_cast<size_t>(m.rows() * m.cols()));
    scales->resize(static_cast<size_t>(m.rows()));
    ASSERT_EQ(cudaMemcpy(codes->data(), m.codes.data(), codes->size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(scales->data(), m.scales.data(), scales->size() * sizeof(float),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  double rel(const Result<Tensor>& a, Backend& ba, const Result<Tensor>& b, Backend& bb) {
    EXPECT_TRUE(a.ok()) << a.status().message();
    EXPECT_TRUE(b.ok()) << b.status().message();
    if (!a.ok() || !b.ok()) return 1e9;
    Result<Tensor> ha = ba.download(a.value()), hb = bb.download(b.value());
    EXPECT_TRUE(ha.ok() && hb.ok());
    if (!ha.ok() || !hb.ok()) return 1e9;
    EXPECT_EQ(test::count_non_finite(ha.value()), 0);
    return relative_l2(ha.value(), hb.value());
  }

  std::shared_ptr<Backend> gpu_, cpu_;
};

TEST_F(CudaFp8, QuantizeRowsMatchesTheHostBitForBit) {
  struct Case {
    Shape shape;
    float lo, hi;
  } cases[] = {{{1, 32}, -1.f, 1.f},           {{7, 48}, -3.f, 0.5f},
               {{2, 5, 1536}, -1e-3f, 1e-3f},  {{4096, 3072}, -4.f, 4.f},
               {{33, 12288}, -20.f, 20.f},     {{3, 16}, 0.f, 1e-30f}};
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.shape));
    Tensor x = bf16_input(c.shape, 11, c.lo, c.hi);
    const int64_t cols = c.shape.back(), rows = x.numel() / cols;
    float* xv = x.data_as<float>();
    for (int64_t k = 0; k < cols; ++k) xv[k] = 0.f;  // a zero row: scale 1
    if (rows > 2) xv[2 * cols + 5] = 8192.f;           // one large value: the rest subnormal
    auto q = gpu_->fp8_quantize_rows(up(*gpu_, x));
    ASSERT_TRUE(q.ok()) << q.status().message();
    ASSERT_EQ(q->shape, c.shape);
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    fetch(*q, &codes, &scales);
    std::vector<uint8_t> want(static_cast<size_t>(cols));
    int64_t bad_rows = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float s = fp8_e4m3_quantize_row(xv + r * cols, static_cast<size_t>(cols), want.data());
      const bool same = std::memcmp(&s, &scales[r], sizeof s) == 0 &&
                        std::memcmp(want.data(), codes.data() + r * cols, want.size()) == 0;
      if (!same && bad_rows++ < 3)
        ADD_FAILURE() << "row " << r << ": scale " << scales[r] << " vs host " << s;
    }
    EXPECT_EQ(bad_rows, 0);
    EXPECT_EQ(scales[0], 1.f);
  }
}

TEST_F(CudaFp8, LinearMatchesTheEmulationAndIsAnFp8Product) {
  struct Case {
    int64_t m, n, k;
    bool bias;
    DitActivation act;
  } cases[] = {
      {1, 64, 32, false, DitActivation::kNone},       // a modulation-like single row
      {7, 192, 64, true, DitActivation::kNone},       // odd token count
      {15, 128, 32, true, DitActivation::kGELUTanh},  // the tiny model's MLP
      {33, 96, 48, true, DitActivation::kSiLU},       // no SiLU epilogue: a pass after
      {4096, 3072, 3072, true, DitActivation::kNone},       // Qwen-Image attention projection
      {4096, 12288, 3072, true, DitActivation::kGELUTanh},  // MLP in
      {301, 3072, 12288, true, DitActivation::kNone},       // MLP out, text stream
  };
  for (const Case& c : cases) {
    const std::string what = str_cat(c.m, "x", c.n, "x", c.k, c.bias ? " bias" : "",
                                     " act ", static_cast<int>(c.act));
    SCOPED_TRACE(what);
    const float ws = 1.f / std::sqrt(static_cast<float>(c.k));
    Tensor x = bf16_input({c.m, c.k}, 21), w = bf16_input({c.n, c.k}, 22, -ws, ws);
    Tensor b = c.bias ? bf16_input({c.n}, 23) : Tensor();
    auto xg = gpu_->fp8_quantize_rows(up(*gpu_, x));
    auto wg = gpu_->fp8_quantize_rows(up(*gpu_, w));
    ASSERT_TRUE(xg.ok() && wg.ok());
    Result<Tensor> y = gpu_->linear_fp8(*xg, *wg, up(*gpu_, b), c.act);
    // The CPU references only where their fp32 products take seconds at most; the 4096-token
    // shapes (minutes on the CPU) for shape and finiteness: the 301-row case runs the same
    // kernels against the emulation.
    if (c.m * c.n * c.k > int64_t{301} * 3072 * 12288) {
      ASSERT_TRUE(y.ok()) << y.status().message();
      EXPECT_EQ(y->shape(), Shape({c.m, c.n}));
      test::download_finite(*gpu_, *y, c.m * c.n, what);
      continue;
    }
    auto xc = cpu_->fp8_quantize_rows(up(*cpu_, x));
    auto wc = cpu_->fp8_quantize_rows(up(*cpu_, w));
    ASSERT_TRUE(xc.ok() && wc.ok());
    const double emu = rel(y, *gpu_, cpu_->linear_fp8(*xc, *wc, up(*cpu_, b), c.act), *cpu_);
    const double exact =
        rel(y, *gpu_, cpu_->linear(up(*cpu_, x), up(*cpu_, w), up(*cpu_, b), c.act), *cpu_);
    std::printf("  fp8 linear %-36s vs emulation %.2e, vs fp32 %.2e\n", what.c_str(), emu, exact);
    EXPECT_LT(emu, 1e-2);   // bf16 output rounding (~2e-3) and FP8 accumulation
    EXPECT_LT(exact, 8e-2);  // e4m3 of both operands: ~2-4 % on random data
    EXPECT_GT(exact, 3e-3);  // ... and not a bf16 product (~2e-3)
  }
}

// LATENT_FP8_GEMM_TUNE=1: the first call of an FP8 GEMM times cuBLASLt's candidates
// (DitLinear::tune) and keeps the fastest. Its result is an FP8 product like the untuned one's
// (candidates differ only in summation order), and later calls reuse the choice: bit for bit
// the first call's output.
TEST_F(CudaFp8, TunedGemmKeepsItsChoice) {
  setenv("LATENT_FP8_GEMM_TUNE", "1", 1);
  Result<std::shared_ptr<Backend>> made = create_cuda_backend(0, DType::kBF16);
  unsetenv("LATENT_FP8_GEMM_TUNE");
  ASSERT_TRUE(made.ok()) << made.status().message();
  Backend& tuned = **made;
  const int64_t m = 301, n = 3072, k = 3072;
  const float ws = 1.f / std::sqrt(static_cast<float>(k));
  Tensor x = bf16_input({m, k}, 41), w = bf16_input({n, k}, 42, -ws, ws), b = bf16_input({n}, 43);
  auto run = [&](Backend& be) -> Result<Tensor> {
    auto xq = be.fp8_quantize_rows(up(be, x));
    auto wq = be.fp8_quantize_rows(up(be, w));
    if (!xq.ok()) return xq.status();
    if (!wq.ok()) return wq.status();
    Result<Tensor> y = be.linear_fp8(*xq, *wq, up(be, b), DitActivation::kNone);
    if (!y.ok()) return y.status();
    return be.download(*y);
  };
  Result<Tensor> first = run(tuned), second = run(tuned), plain = run(*gpu_);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE(second.ok()) << second.status().message();
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  ASSERT_EQ(first->nbytes(), second->nbytes());
  EXPECT_EQ(std::memcmp(first->data(), second->data(), first->nbytes()), 0)
      << "the second call did not run the first call's choice";
  EXPECT_EQ(test::count_non_finite(*first), 0);
  const double d = relative_l2(*first, *plain);
  std::printf("  tuned fp8 GEMM %lldx%lldx%lld against the heuristic's: rel L2 %.2e\n",
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), d);
  EXPECT_LT(d, 1e-2);  // the same FP8 product, another summation order
}

// linear_fp8_gated_add: residual + gate * (x w^T + b) with the gate folded into the weight's
// channel scales and the bias and the residual read as cuBLASLt's C. Against the CPU's
// emulation (linear_fp8 then gated_add, fp32) and the GPU's own two-op composition (the
// Backend default), compared on what the layer adds (y - residual), which the residual would
// otherwise hide.
TEST_F(CudaFp8, GatedAddRunsInTheLayersGemm) {
  struct Case {
    int64_t m, n, k;
    bool bias;
  } cases[] = {
      {1, 64, 32, true}, {7, 192, 64, false}, {301, 3072, 1536, true}, {64, 256, 128, true}};
  for (const Case& c : cases) {
    const std::string what = str_cat(c.m, "x", c.n, "x", c.k, c.bias ? " bias" : "");
    SCOPED_TRACE(what);
    const float ws = 1.f / std::sqrt(static_cast<float>(c.k));
    Tensor x = bf16_input({1, c.m, c.k}, 31), w = bf16_input({c.n, c.k}, 32, -ws, ws);
    Tensor b = c.bias ? bf16_input({c.n}, 33) : Tensor();
    Tensor r = bf16_input({1, c.m, c.n}, 34);
    Tensor g = bf16_input({1, c.n}, 35, -2.f, 2.f);
    g.data_as<float>()[0] = 0.f;  // a closed gate channel: exactly the residual
    auto xg = gpu_->fp8_quantize_rows(up(*gpu_, x));
    auto wg = gpu_->fp8_quantize_rows(up(*gpu_, w));
    auto xc = cpu_->fp8_quantize_rows(up(*cpu_, x));
    auto wc = cpu_->fp8_quantize_rows(up(*cpu_, w));
    ASSERT_TRUE(xg.ok() && wg.ok() && xc.ok() && wc.ok());
    const Tensor rg = up(*gpu_, r), gg = up(*gpu_, g), bg = up(*gpu_, b);
    Result<Tensor> fused = gpu_->linear_fp8_gated_add(*xg, *wg, bg, gg, rg);
    Result<Tensor> apart = gpu_->Backend::linear_fp8_gated_add(*xg, *wg, bg, gg, rg);
    Result<Tensor> emu =
        cpu_->linear_fp8_gated_add(*xc, *wc, up(*cpu_, b), up(*cpu_, g), up(*cpu_, r));
    ASSERT_TRUE(fused.ok()) << fused.status().message();
    ASSERT_TRUE(apart.ok()) << apart.status().message();
    ASSERT_TRUE(emu.ok()) << emu.status().message();
    EXPECT_EQ(fused->shape(), Shape({1, c.m, c.n}));
    auto added = [&](Backend& be, const Tensor& y) {
      Tensor h = be.download(y).value();
      const float* rv = r.data_as<float>();
      float* hv = h.data_as<float>();
      for (int64_t i = 0; i < h.numel(); ++i) hv[i] -= rv[i];
      return h;
    };
    const Tensor df = added(*gpu_, *fused), da = added(*gpu_, *apart), de = added(*cpu_, *emu);
    EXPECT_EQ(test::count_non_finite(df), 0);
    const double vs_emu = relative_l2(df, de), vs_apart = relative_l2(df, da);
    std::printf("  fp8 gated add %-22s added part: vs emulation %.2e, vs two ops %.2e\n",
                what.c_str(), vs_emu, vs_apart);
    EXPECT_LT(vs_emu, 2e-2);  // bf16 roundings of the output (and the two-op path's o)
    EXPECT_LT(vs_apart, 2e-2);
    EXPECT_GT(vs_apart, 0.0);  // one rounding fewer: not the two-op path's bits
    const float* dv = df.data_as<float>();
    for (int64_t row = 0; row < c.m; ++row) EXPECT_EQ(dv[row * c.n], 0.f) << "row " << row;
  }
  // A gate that is not one row of the layer's width is refused, naming it.
  Tensor x = bf16_input({1, 4, 32}, 1), w = bf16_input({64, 32}, 2);
  auto xg = gpu_->fp8_quantize_rows(up(*gpu_, x));
  auto wg = gpu_->fp8_quantize_rows(up(*gpu_, w));
  ASSERT_TRUE(xg.ok() && wg.ok());
  Result<Tensor> bad = gpu_->linear_fp8_gated_add(
      *xg, *wg, Tensor(), up(*gpu_, bf16_input({2, 64}, 3)), up(*gpu_, bf16_input({1, 4, 64}, 4)));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gate"), std::string::npos) << bad.status().message();
}

// linear_fp8_joined: the image and text streams' v written into one [1, T_a + T_b, N] tensor
// by their GEMMs in place, against the default's two outputs and concat on the same GPU.
TEST_F(CudaFp8, JoinedLayersWriteTheirRowsInPlace) {
  struct Case {
    int64_t ta, tb, n, k;
    bool bias;
  } cases[] = {{1000, 24, 384, 128, true}, {7, 5, 64, 32, false}, {64, 1, 3072, 256, true}};
  for (const Case& c : cases) {
    const std::string what = str_cat(c.ta, "+", c.tb, "x", c.n, "x", c.k, c.bias ? " bias" : "");
    SCOPED_TRACE(what);
    const float ws = 1.f / std::sqrt(static_cast<float>(c.k));
    auto q = [&](const Tensor& host) {
      Result<Fp8Matrix> r = gpu_->fp8_quantize_rows(up(*gpu_, host));
      EXPECT_TRUE(r.ok()) << r.status().message();
      return r.ok() ? *r : Fp8Matrix();
    };
    const Fp8Matrix xa = q(bf16_input({1, c.ta, c.k}, 41)), xb = q(bf16_input({1, c.tb, c.k}, 42));
    const Fp8Matrix wa = q(bf16_input({c.n, c.k}, 43, -ws, ws));
    const Fp8Matrix wb = q(bf16_input({c.n, c.k}, 44, -ws, ws));
    const Tensor ba = c.bias ? up(*gpu_, bf16_input({c.n}, 45)) : Tensor();
    const Tensor bb = c.bias ? up(*gpu_, bf16_input({c.n}, 46)) : Tensor();
    Result<Tensor> joined = gpu_->linear_fp8_joined(xa, wa, ba, xb, wb, bb);
    Result<Tensor> apart = gpu_->Backend::linear_fp8_joined(xa, wa, ba, xb, wb, bb);
    ASSERT_TRUE(joined.ok()) << joined.status().message();
    ASSERT_TRUE(apart.ok()) << apart.status().message();
    EXPECT_EQ(joined->shape(), Shape({1, c.ta + c.tb, c.n}));
    const double d = rel(joined, *gpu_, apart, *gpu_);
    std::printf("  fp8 joined %-24s vs two outputs and concat %.2e\n", what.c_str(), d);
    EXPECT_LT(d, 1e-3);  // the same GEMMs (another algorithm at most: accumulation order)
  }
}

TEST_F(CudaFp8, LayerNormModulateQuantisesItsOutputRows) {
  // The fused norm + quantisation against the CPU's composition (LayerNorm-modulate in fp32,
  // then the rows quantised): the same codes but where the GPU's fp32 norm output lands on a
  // rounding boundary of e4m3 differently (a few ulps of fp32): dequantised values within 1e-2.
  struct Case {
    int64_t b, t, d;
    std::vector<int64_t> groups;
  } cases[] = {{1, 4096, 3072, {0}},     {1, 96, 3072, {0}},  // a block a row (text-sized too)
               {2, 40, 3072, {0, 30}}, {2, 37, 64, {0}},    // and a warp a row
               {1, 50, 48, {0, 20}}};
  uint64_t seed = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE(str_cat(c.b, "x", c.t, "x", c.d, " groups ", c.groups.size()));
    const int64_t g = static_cast<int64_t>(c.groups.size());
    Tensor x = bf16_input({c.b, c.t, c.d}, seed++, -4.f, 4.f);
    Tensor shift = bf16_input({g, c.b, c.d}, seed++), scale = bf16_input({g, c.b, c.d}, seed++);
    auto q = gpu_->layer_norm_modulate_fp8(up(*gpu_, x), up(*gpu_, shift), up(*gpu_, scale),
                                           c.groups, 1e-6f);
    ASSERT_TRUE(q.ok()) << q.status().message();
    ASSERT_EQ(q->shape, x.shape());
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    fetch(*q, &codes, &scales);
    std::vector<float> deq(codes.size());
    for (size_t i = 0; i < codes.size(); ++i)
      deq[i] = fp8_e4m3_to_f32(codes[i]) * scales[i / static_cast<size_t>(c.d)];
    auto want = cpu_->layer_norm_modulate_fp8(up(*cpu_, x), up(*cpu_, shift), up(*cpu_, scale),
                                              c.groups, 1e-6f);
    ASSERT_TRUE(want.ok()) << want.status().message();
    Result<Tensor> w = cpu_->download(want->dequant);
    ASSERT_TRUE(w.ok());
    const double err = relative_l2(Tensor::from_floats(x.shape(), deq), w.value());
    std::printf("  layer_norm_modulate_fp8 %s: vs CPU emulation %.2e\n", shape_str(x.shape()).c_str(),
                err);
    EXPECT_LT(err, 1e-2);
  }
}

TEST_F(CudaFp8, RefusesWhatItCannotMultiply) {
  auto odd = gpu_->fp8_quantize_rows(up(*gpu_, bf16_input({4, 40}, 1)));
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("multiple of 16"), std::string::npos)
      << odd.status().message();
  auto x = gpu_->fp8_quantize_rows(up(*gpu_, bf16_input({4, 32}, 2)));
  auto w = gpu_->fp8_quantize_rows(up(*gpu_, bf16_input({8, 48}, 3)));
  ASSERT_TRUE(x.ok() && w.ok());
  auto y = gpu_->linear_fp8(*x, *w, Tensor(), DitActivation::kNone);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("expects 48 input features"), std::string::npos)
      << y.status().message();
  // Operands quantised by another backend (the CPU's emulation holds no codes).
  auto xc = cpu_->fp8_quantize_rows(up(*cpu_, bf16_input({4, 48}, 4)));
  ASSERT_TRUE(xc.ok());
  y = gpu_->linear_fp8(*xc, *w, Tensor(), DitActivation::kNone);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("was not quantised by"), std::string::npos)
      << y.status().message();
}

// The quantised attention output as floats: codes times their row's scale.
std::vector<float> dequantised(const std::vector<uint8_t>& codes, const std::vector<float>& scales,
                               int64_t cols) {
  std::vector<float> out(codes.size());
  for (size_t i = 0; i < codes.size(); ++i)
    out[i] = fp8_e4m3_to_f32(codes[i]) * scales[i / static_cast<size_t>(cols)];
  return out;
}

TEST_F(CudaFp8, AttentionRunsInFp8NearTheFloatResult) {
  struct Case {
    int64_t t, s;
    int heads;
    int64_t d, length;   // length: the key lengths (0: no mask)
    bool lengths_given;  // false: the mask alone (no FP8 graph for a bias)
  } cases[] = {
      {1024, 1024, 4, 128, 0, true},  // Qwen-Image's head size
      {300, 333, 2, 64, 250, true},   // a padded text tail, cuDNN's padding mask
      {70, 70, 2, 16, 0, true},       // the tiny model's head size
      {96, 100, 2, 64, 60, false},    // a mask without lengths: bf16, quantised after
  };
  for (const Case& c : cases) {
    const int64_t hd = c.heads * c.d;
    const std::string what = str_cat("[1, ", c.t, ", ", c.heads, " x ", c.d, "] keys ", c.s,
                                     c.length ? str_cat(", ", c.length, " valid") : std::string(),
                                     c.lengths_given ? "" : " (mask alone)");
    SCOPED_TRACE(what);
    Tensor q = bf16_input({1, c.t, hd}, 31, -2.f, 2.f), k = bf16_input({1, c.s, hd}, 32, -2.f, 2.f);
    Tensor v = bf16_input({1, c.s, hd}, 33, -3.f, 3.f);
    Tensor m;
    std::vector<int64_t> lengths;
    if (c.length) {
      std::vector<float> keep;
      for (int64_t i = 0; i < c.s; ++i) keep.push_back(i < c.length ? 1.f : 0.f);
      m = Tensor::from_floats({1, c.s}, keep);
      if (c.lengths_given) lengths = {c.length};
    }
    const cuda::SdpaCounters before = cuda::sdpa_counters();
    Result<Fp8Matrix> o = gpu_->attention_fp8(up(*gpu_, q), up(*gpu_, k), up(*gpu_, v), c.heads,
                                              up(*gpu_, m), lengths);
    ASSERT_TRUE(o.ok()) << o.status().message();
    const cuda::SdpaCounters after = cuda::sdpa_counters();
    ASSERT_EQ(o->shape, Shape({1, c.t, hd}));
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    fetch(*o, &codes, &scales);
    Result<Tensor> want =
        cpu_->attention(up(*cpu_, q), up(*cpu_, k), up(*cpu_, v), c.heads, up(*cpu_, m), lengths);
    ASSERT_TRUE(want.ok()) << want.status().message();
    const Tensor got = Tensor::from_floats({1, c.t, hd}, dequantised(codes, scales, hd));
    EXPECT_EQ(test::count_non_finite(got), 0);
    const double err = relative_l2(got, want.value());
    const bool fp8 = after.cudnn_fp8 > before.cudnn_fp8;
    bool one_scale = true;
    for (float sc : scales) one_scale = one_scale && sc == scales[0];
    std::printf("  attention_fp8 %-44s %s, vs fp32 %.2e%s\n", what.c_str(),
                fp8 ? "cuDNN FP8" : "bf16 then rows quantised", err,
                one_scale ? ", one output scale" : ", a scale a row");
    if (c.lengths_given) {
      EXPECT_TRUE(fp8) << "cuDNN's FP8 SDPA did not run (CUDNN_FRONTEND_LOG_INFO=1 says why)";
      EXPECT_TRUE(one_scale);
      // e4m3 q, k, v, P and O. With these sharp softmaxes (|q|, |k| up to 2) each output is a
      // few values of v, so v's coding (~3.6 % RMS for e4m3's 3 mantissa bits) is not averaged
      // out and adds to the output's own: measured 5.7-6.4e-2 on an H100, 6.4-6.6e-2 in
      // bench/sim_fp8_attention.py's NumPy emulation of the same coding.
      EXPECT_LT(err, 8e-2);
    } else {
      EXPECT_FALSE(fp8);
      EXPECT_LT(err, 5e-2);  // bf16 attention, e4m3 rows
    }
  }
}

TEST_F(CudaFp8, TinyTransformerOneRowRunsItsAttentionInFp8) {
  const std::string root = test::fixtures_dir() + "/dit_qwen_image_tiny";
  setenv("LATENT_FP8_ATTENTION", "1", 1);  // q, k and v scaled by their amax (codes: below)
  auto g = QwenImageMmdit::load(root, gpu_, {}, LinearFormat::kFp8);
  unsetenv("LATENT_FP8_ATTENTION");
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto c = QwenImageMmdit::load(root, cpu_, {}, LinearFormat::kFp8);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::string io = root + "/io_transformer.safetensors";
  const Tensor ref = test::transformer_case_sample(io, "single");
  ASSERT_TRUE(ref.defined());
  const cuda::SdpaCounters before = cuda::sdpa_counters();
  auto yg = (*g)->forward(test::transformer_case_inputs(*gpu_, io, "single"));
  const cuda::SdpaCounters after = cuda::sdpa_counters();
  auto yc = (*c)->forward(test::transformer_case_inputs(*cpu_, io, "single"));
  const double emu = rel(yg, *gpu_, yc, *cpu_);
  ASSERT_TRUE(yg.ok());
  Result<Tensor> hg = gpu_->download(yg.value());
  ASSERT_TRUE(hg.ok());
  const double vs_fp32 = relative_l2(hg.value(), ref);
  std::printf(
      "  tiny transformer fp8, one batch row: %lld FP8 attention calls, vs CPU emulation "
      "(bf16 attention) %.2e, vs diffusers fp32 %.2e\n",
      static_cast<long long>(after.cudnn_fp8 - before.cudnn_fp8), emu, vs_fp32);
  EXPECT_EQ(after.cudnn_fp8 - before.cudnn_fp8, 2);  // one a block
  EXPECT_LT(emu, 5e-2);
  EXPECT_LT(vs_fp32, 8e-2);
}

// joint_qk_fp8 writes the codes the host's emulation gives (the bf16 intermediate may move a
// value across a rounding boundary: a few codes one step apart), at d = 128 (the packed kernel)
// and d = 16 (the warp-a-head kernel); attention_fp8_coded on them runs cuDNN's FP8 SDPA near
// the fp32 attention of the uncoded values.
TEST_F(CudaFp8, JointQkCodesAndAttentionFromThem) {
  struct Case {
    int64_t t_img, t_txt;
    int heads;
    int64_t d;
  } cases[] = {{1000, 24, 4, 128}, {60, 10, 2, 16}};
  for (const Case& c : cases) {
    const int64_t hd = c.heads * c.d, t = c.t_img + c.t_txt;
    const std::string what =
        str_cat("[1, ", c.t_img, " + ", c.t_txt, ", ", c.heads, " x ", c.d, "]");
    SCOPED_TRACE(what);
    Tensor qi = bf16_input({1, c.t_img, hd}, 51, -3.f, 3.f),
           qt = bf16_input({1, c.t_txt, hd}, 52, -3.f, 3.f);
    Tensor ki = bf16_input({1, c.t_img, hd}, 53, -3.f, 3.f),
           kt = bf16_input({1, c.t_txt, hd}, 54, -3.f, 3.f);
    Tensor gi = bf16_input({c.d}, 55, 0.5f, 2.f), gt = bf16_input({c.d}, 56, -2.f, 1.f);
    Tensor v = bf16_input({1, t, hd}, 57, -3.f, 3.f);
    std::vector<float> f;
    for (int64_t r = 0; r < t; ++r)
      for (int64_t i = 0; i < c.d / 2; ++i) {
        f.push_back(std::cos(0.01f * static_cast<float>(r * (i + 1))));
        f.push_back(std::sin(0.01f * static_cast<float>(r * (i + 1))));
      }
    const Tensor freqs = Tensor::from_floats({t, c.d / 2, 2}, f);
    const float bound = std::sqrt(static_cast<float>(c.d)) * 2.f;
    Result<Tensor> fg = gpu_->upload_fp32(freqs), fc = cpu_->upload_fp32(freqs);
    ASSERT_TRUE(fg.ok() && fc.ok());
    auto q8 = gpu_->joint_qk_fp8(up(*gpu_, qi), up(*gpu_, qt), up(*gpu_, gi), up(*gpu_, gt), *fg,
                                 c.heads, 1e-6f, bound);
    auto k8 = gpu_->joint_qk_fp8(up(*gpu_, ki), up(*gpu_, kt), up(*gpu_, gi), up(*gpu_, gt), *fg,
                                 c.heads, 1e-6f, bound);
    ASSERT_TRUE(q8.ok() && k8.ok()) << (q8.ok() ? k8.status().message() : q8.status().message());
    auto qc = cpu_->joint_qk_fp8(up(*cpu_, qi), up(*cpu_, qt), up(*cpu_, gi), up(*cpu_, gt), *fc,
                                 c.heads, 1e-6f, bound);
    ASSERT_TRUE(qc.ok()) << qc.status().message();
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    fetch(*q8, &codes, &scales);
    const Tensor got = Tensor::from_floats({1, t, hd}, dequantised(codes, scales, hd));
    const double codes_err = relative_l2(got, *cpu_->download(qc->dequant));
    EXPECT_FLOAT_EQ(scales.front(), bound / 448.f);
    EXPECT_FLOAT_EQ(scales.back(), bound / 448.f);
    // The fp32 attention of the uncoded q and k (the CPU's joint_qk) against the GPU's FP8 path.
    auto q = cpu_->joint_qk(up(*cpu_, qi), up(*cpu_, qt), up(*cpu_, gi), up(*cpu_, gt), *fc,
                            c.heads, 1e-6f);
    auto k = cpu_->joint_qk(up(*cpu_, ki), up(*cpu_, kt), up(*cpu_, gi), up(*cpu_, gt), *fc,
                            c.heads, 1e-6f);
    ASSERT_TRUE(q.ok() && k.ok());
    Result<Tensor> want = cpu_->attention(*q, *k, up(*cpu_, v), c.heads, Tensor(), {});
    ASSERT_TRUE(want.ok()) << want.status().message();
    const cuda::SdpaCounters before = cuda::sdpa_counters();
    auto o = gpu_->attention_fp8_coded(*q8, *k8, up(*gpu_, v), c.heads, Tensor(), {});
    ASSERT_TRUE(o.ok()) << o.status().message();
    const bool fp8 = cuda::sdpa_counters().cudnn_fp8 > before.cudnn_fp8;
    fetch(*o, &codes, &scales);
    const double att_err =
        relative_l2(Tensor::from_floats({1, t, hd}, dequantised(codes, scales, hd)), *want);
    std::printf("  joint_qk_fp8 %-26s codes vs host %.2e; attention from codes %s vs fp32 %.2e\n",
                what.c_str(), codes_err, fp8 ? "(cuDNN FP8)" : "(bf16)", att_err);
    EXPECT_LT(codes_err, 1e-2);
    EXPECT_TRUE(fp8);
    EXPECT_LT(att_err, 8e-2);
  }
}

// The default (LATENT_FP8_ATTENTION unset, = codes) on the tiny transformer, one batch row: q
// and k coded by joint_qk, FP8 attention in both blocks, near diffusers.
TEST_F(CudaFp8, TinyTransformerCodesMode) {
  const std::string root = test::fixtures_dir() + "/dit_qwen_image_tiny";
  unsetenv("LATENT_FP8_ATTENTION");
  auto g = QwenImageMmdit::load(root, gpu_, {}, LinearFormat::kFp8);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const std::string io = root + "/io_transformer.safetensors";
  const Tensor ref = test::transformer_case_sample(io, "single");
  const cuda::SdpaCounters before = cuda::sdpa_counters();
  auto yg = (*g)->forward(test::transformer_case_inputs(*gpu_, io, "single"));
  const cuda::SdpaCounters after = cuda::sdpa_counters();
  ASSERT_TRUE(yg.ok()) << yg.status().message();
  Result<Tensor> hg = gpu_->download(yg.value());
  ASSERT_TRUE(hg.ok());
  const double vs_fp32 = relative_l2(hg.value(), ref);
  std::printf(
      "  tiny transformer fp8, codes mode: %lld FP8 attention calls, vs diffusers fp32 "
      "%.2e\n",
      static_cast<long long>(after.cudnn_fp8 - before.cudnn_fp8), vs_fp32);
  EXPECT_EQ(after.cudnn_fp8 - before.cudnn_fp8, 2);
  EXPECT_LT(vs_fp32, 8e-2);
}

TEST_F(CudaFp8, TinyTransformerMatchesTheCpuEmulation) {
  const std::string root = test::fixtures_dir() + "/dit_qwen_image_tiny";
  auto g = QwenImageMmdit::load(root, gpu_, {}, LinearFormat::kFp8);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto c = QwenImageMmdit::load(root, cpu_, {}, LinearFormat::kFp8);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_NE((*g)->description().find("28 in fp8 e4m3"), std::string::npos)
      << (*g)->description();
  const std::string io = root + "/io_transformer.safetensors";
  const Tensor ref = test::transformer_case_sample(io, "masked_batch");
  ASSERT_TRUE(ref.defined());
  auto yg = (*g)->forward(test::transformer_case_inputs(*gpu_, io, "masked_batch"));
  auto yc = (*c)->forward(test::transformer_case_inputs(*cpu_, io, "masked_batch"));
  const double emu = rel(yg, *gpu_, yc, *cpu_);
  ASSERT_TRUE(yg.ok());
  Result<Tensor> hg = gpu_->download(yg.value());
  ASSERT_TRUE(hg.ok());
  const double vs_fp32 = relative_l2(hg.value(), ref);
  std::printf("  tiny transformer fp8: vs CPU emulation %.2e, vs diffusers fp32 %.2e\n", emu,
              vs_fp32);
  EXPECT_LT(emu, 2e-2);  // bf16 activations between the layers on the GPU, fp32 on the CPU
  EXPECT_LT(vs_fp32, 5e-2);
}

}  // namespace
}  // namespace latent

#endif  // LATENT_HAVE_CUDA
