// Every DiT op of the CUDA backend (backend.h, "DiT ops") against the CPU backend (fp32), at
// Qwen-Image-sized shapes (3072 features, 24 heads of 128, 4096 image + 512 text tokens) and at
// small, odd shapes that take the kernels' unvectorised paths, for bf16, fp16 and fp32. Inputs
// are rounded to the dtype under test before both backends see them.
//
// Tolerances (relative L2 over the whole output): bf16 2e-2 (1e-2 for linear and attention),
// fp16 5e-3, fp32 1e-3, except fp32 linear layers, which run on TF32 tensor cores (10-bit
// mantissa products): 3e-3. Moves (concat, slice) must be exact.
// The backends are created with LATENT_CUDA_POISON=1: every new device buffer starts as NaN,
// so an output element an op leaves unwritten fails the test.
//
// Without a GPU (or in a build without CUDA) the binary exits with 77 (skipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/registry.h"
#include "tests/util/test_util.h"
#ifdef LATENT_HAVE_CUDA
#include "engine/backends/cuda/cuda_backend.h"
#include "tests/util/cuda_test_util.h"
#endif

// Runs before gtest's main: no GPU, no test.
const bool kGpuPresent = (latent::test::exit_without_gpu("test_cuda_dit_ops"), true);

#ifdef LATENT_HAVE_CUDA

namespace latent {
namespace {

using test::random_tensor;

// A host rotary table [t, half, 2] fp32 of (cos, sin) of random angles (seeded).
Tensor random_rope_table(int64_t t, int64_t half, uint64_t seed) {
  Tensor angles = random_tensor({t, half}, seed, -3.14159f, 3.14159f);
  std::vector<float> table(static_cast<size_t>(t * half * 2));
  for (int64_t i = 0; i < t * half; ++i) {
    table[2 * i] = std::cos(angles.data_as<float>()[i]);
    table[2 * i + 1] = std::sin(angles.data_as<float>()[i]);
  }
  return Tensor::from_floats({t, half, 2}, table);
}

// Every attention kernel variant LATENT_ATTENTION_KERNEL can force (attention_flash.cuh; "wgmma"
// is the Hopper kernel on compute capability 9.0 and the default elsewhere, "simple" the
// CUDA-core kernel). The untimed Hopper kernel last, so the others have run if it breaks.
const char* const kAttentionKernels[] = {"mma", "mma16", "mma32", "simple", "wgmma"};

// Forces one attention kernel variant (attention_flash.cuh) for its lifetime.
struct ScopedAttentionKernel {
  explicit ScopedAttentionKernel(const char* name) { setenv("LATENT_ATTENTION_KERNEL", name, 1); }
  ~ScopedAttentionKernel() { unsetenv("LATENT_ATTENTION_KERNEL"); }
};

class CudaDitOps : public test::CudaOpTest {
 protected:
  CudaDitOps() { close_style_ = {66, /*tolerance_passes=*/true, /*nhwc_4d=*/false}; }

  // Elementwise and row ops.
  double tol() const {
    switch (dtype()) {
      case DType::kBF16:
        return 2e-2;
      case DType::kF16:
        return 5e-3;
      case DType::kF32:
        break;
    }
    return 1e-3;
  }
  double linear_tol() const {
    return dtype() == DType::kBF16 ? 1e-2 : dtype() == DType::kF32 ? 3e-3 : tol();
  }
  double attention_tol() const { return dtype() == DType::kBF16 ? 1e-2 : tol(); }

  // A host tensor viewed in another shape (uploaded 3-D, then reshaped on the device: upload()
  // would put a 4-D tensor in NHWC).
  static Tensor reshaped(const Tensor& t, const Shape& shape) {
    Result<Tensor> r = t.reshape(shape);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r.value() : Tensor();
  }

  void check_linear(const std::string& what, const Shape& xs, int64_t n, bool bias,
                    DitActivation act, uint64_t seed) {
    const int64_t k = xs.back();
    const float ws = 1.f / std::sqrt(static_cast<float>(k));
    Tensor x = input(xs, seed), w = input({n, k}, seed + 1, -ws, ws);
    Tensor b = bias ? input({n}, seed + 2) : Tensor();
    EXPECT_TRUE(close(what, gpu_->linear(on_gpu(x), on_gpu(w), on_gpu(b), act),
                      cpu_->linear(on_cpu(x), on_cpu(w), on_cpu(b), act), linear_tol()));
  }

  // q: [b, t, heads * d]; k, v: [b, s, heads * d]; keep: b * s flags or empty (no mask).
  void check_attention(const std::string& what, int64_t b, int64_t t, int64_t s, int heads,
                       int64_t d, const std::vector<float>& keep, uint64_t seed) {
    Tensor q = input({b, t, heads * d}, seed, -2.f, 2.f);
    Tensor k = input({b, s, heads * d}, seed + 1, -2.f, 2.f);
    Tensor v = input({b, s, heads * d}, seed + 2);
    Tensor m = keep.empty() ? Tensor() : Tensor::from_floats({b, s}, keep);
    EXPECT_TRUE(close(what, gpu_->attention(on_gpu(q), on_gpu(k), on_gpu(v), heads, on_gpu(m)),
                      cpu_->attention(on_cpu(q), on_cpu(k), on_cpu(v), heads, on_cpu(m)),
                      attention_tol()));
  }

  // The attention variants worth running: fp32 has one kernel (CUDA cores), whatever is forced.
  std::vector<const char*> attention_kernels() const {
    if (dtype() == DType::kF32) return {"mma"};
    return std::vector<const char*>(std::begin(kAttentionKernels), std::end(kAttentionKernels));
  }

  // Attention at full DiT size, where a CPU reference of the whole output would take minutes:
  // every output element must be finite (the poison is NaN), and sampled rows (both batch rows,
  // three heads, queries at the tile edges and the ends) are compared against a float64
  // reference. Runs once per kernel variant on the same device inputs.
  void check_attention_sampled(const std::string& what, int64_t b, int64_t t, int64_t s, int heads,
                               int64_t d, const std::vector<float>& keep, uint64_t seed) {
    const int64_t ch = heads * d;
    Tensor q = input({b, t, ch}, seed, -2.f, 2.f);
    Tensor k = input({b, s, ch}, seed + 1, -2.f, 2.f);
    Tensor v = input({b, s, ch}, seed + 2);
    Tensor m = keep.empty() ? Tensor() : Tensor::from_floats({b, s}, keep);
    Tensor gq = on_gpu(q), gk = on_gpu(k), gv = on_gpu(v), gm = on_gpu(m);
    const std::vector<test::AttentionRow> rows =
        test::attention_rows(q, k, v, heads, keep, test::sample_heads(heads),
                             test::sample_queries({0, 1, 15, 16, 63, 64, 127, 128, t / 2 + 3,
                                                   t - 129, t - 128, t - 65, t - 64, t - 2, t - 1},
                                                  t));

    for (const char* kernel : attention_kernels()) {
      ScopedAttentionKernel forced(kernel);
      const std::string name = what + " [" + kernel + "]";
      Result<Tensor> y = gpu_->attention(gq, gk, gv, heads, gm);
      ASSERT_TRUE(y.ok()) << name << ": " << y.status().message();
      const Tensor host = test::download_finite(*gpu_, y.value(), b * t * ch, name);
      ASSERT_TRUE(host.defined());
      const double err = test::rows_rel_l2(rows, host);
      std::printf("  %-66s %-5s rel L2 %.3e (tol %.0e, %zu rows)\n", name.c_str(),
                  dtype_name(dtype()), err, attention_tol(), rows.size());
      EXPECT_LE(err, attention_tol()) << name;
    }
  }
};

const char* act_name(DitActivation act) {
  switch (act) {
    case DitActivation::kNone:
      return "none";
    case DitActivation::kSiLU:
      return "silu";
    case DitActivation::kGELUTanh:
      return "gelu_tanh";
  }
  return "?";
}

TEST_P(CudaDitOps, SupportsEveryOp) {
  for (int op = 0; op <= static_cast<int>(DitOp::kSlice); ++op) {
    EXPECT_TRUE(gpu_->supports_dit(static_cast<DitOp>(op), dtype()))
        << dit_op_name(static_cast<DitOp>(op));
    if (static_cast<DitOp>(op) != DitOp::kUploadFp32) {
      EXPECT_FALSE(gpu_->supports_dit(static_cast<DitOp>(op),
                                      dtype() == DType::kF32 ? DType::kBF16 : DType::kF32));
    }
  }
}

TEST_P(CudaDitOps, UploadFp32KeepsFullPrecision) {
  Tensor host = random_tensor({37, 5, 2}, 10, -3.f, 3.f);  // not representable in bf16
  for (DType src : {DType::kF32, DType::kBF16}) {
    Tensor h = host.to_dtype(src);
    Result<Tensor> dev = gpu_->upload_fp32(h);
    ASSERT_TRUE(dev.ok()) << dev.status().message();
    EXPECT_EQ(dev.value().dtype(), DType::kF32);
    EXPECT_EQ(dev.value().layout(), Layout::kContiguous);
    Result<Tensor> back = gpu_->download(dev.value());
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(relative_l2(back.value(), h.to_dtype(DType::kF32)), 0.0) << dtype_name(src);
  }
}

TEST_P(CudaDitOps, LinearDitSized) {
  // Qwen-Image: 2 x 4096 image tokens, 3072 features; attention projections and the MLP.
  check_linear("linear [8192, 3072] -> 3072 +bias", {8192, 3072}, 3072, true, DitActivation::kNone,
               100);
  check_linear("linear [2, 4096, 3072] -> 12288 +bias, gelu_tanh (fused)", {2, 4096, 3072}, 12288,
               true, DitActivation::kGELUTanh, 110);
  check_linear("linear [1, 512, 3584] -> 3072 +bias (text in)", {1, 512, 3584}, 3072, true,
               DitActivation::kNone, 120);
  check_linear("linear [2, 3072] -> 18432 +bias, silu (AdaLN-sized)", {2, 3072}, 18432, true,
               DitActivation::kSiLU, 130);
}

TEST_P(CudaDitOps, LinearSmallEveryEpilogue) {
  uint64_t seed = 200;
  for (DitActivation act : {DitActivation::kNone, DitActivation::kSiLU, DitActivation::kGELUTanh}) {
    for (bool bias : {false, true}) {
      check_linear(str_cat("linear [2, 7, 40] -> 24", bias ? " +bias" : "", ", ", act_name(act)),
                   {2, 7, 40}, 24, bias, act, seed);
      check_linear(str_cat("linear [3, 5] -> 6", bias ? " +bias" : "", ", ", act_name(act)), {3, 5},
                   6, bias, act, seed + 10);
      seed += 20;
    }
  }
  // The same shape again reuses its cached plan.
  check_linear("linear [2, 7, 40] -> 24 +bias, gelu_tanh (cached plan)", {2, 7, 40}, 24, true,
               DitActivation::kGELUTanh, 300);
}

// linear_add (runtime LoRAs: the up projection accumulated onto the base output as cuBLASLt's C)
// against the CPU backend's composition (linear + scaled_add + activation).
TEST_P(CudaDitOps, LinearAddOntoResidual) {
  struct Case {
    Shape xs;
    int64_t n;
  };
  uint64_t seed = 400;
  for (const Case& c : {Case{{2, 4096, 64}, 3072}, Case{{1, 4096, 64}, 12288},
                        Case{{2, 7, 4}, 24}, Case{{3, 2}, 6}}) {
    for (DitActivation act :
         {DitActivation::kNone, DitActivation::kGELUTanh, DitActivation::kSiLU}) {
      const int64_t k = c.xs.back();
      Shape ys = c.xs;
      ys.back() = c.n;
      const float ws = 1.f / std::sqrt(static_cast<float>(k));
      Tensor x = input(c.xs, seed), w = input({c.n, k}, seed + 1, -ws, ws);
      Tensor r = input(ys, seed + 2);
      EXPECT_TRUE(close(str_cat("linear_add ", shape_str(c.xs), " -> ", c.n, ", ", act_name(act)),
                        gpu_->linear_add(on_gpu(x), on_gpu(w), on_gpu(r), act),
                        cpu_->linear_add(on_cpu(x), on_cpu(w), on_cpu(r), act), linear_tol()));
      seed += 10;
    }
  }
  // A residual of another shape is refused.
  Tensor x = input({3, 4}, 1), w = input({5, 4}, 2), r = input({3, 6}, 3);
  auto y = gpu_->linear_add(on_gpu(x), on_gpu(w), on_gpu(r), DitActivation::kNone);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("residual"), std::string::npos) << y.status().message();
}

// The ops of runtime LoRAs folded into the base GEMM (backend.h): the norm written with spare
// columns, the low-rank projection written into them in place, the layer reading the first K
// columns of each wide row and writing a wide output for the next layer, rows at their pitch
// throughout; against the CPU backend's compositions (slice, linear, concat). Every column is
// written by the end of the chain, so the whole result is compared.
TEST_P(CudaDitOps, FoldedLoraOpsReadAndWriteRowsAtTheirPitch) {
  struct Case {
    Shape shape;  // x [B, T, D]
    int64_t extra, k_less, n, extra2;
    DitActivation act;
    bool bias;
  };
  const Case cases[] = {
      // Qwen-Image's q/k/v with rank 64 on all three (3 x 64 columns), the MLP's fc1 -> fc2.
      {{1, 4096, 3072}, 192, 0, 3072, 0, DitActivation::kNone, true},
      {{1, 4096, 3072}, 64, 0, 12288, 64, DitActivation::kGELUTanh, true},
      {{1, 4096, 3072}, 192, 64, 3072, 0, DitActivation::kNone, true},  // q: first 3072 + 128
      // Small and odd: rows not whole 16-byte packs, SiLU (the epilogue run apart), no bias.
      {{2, 7, 24}, 8, 3, 40, 8, DitActivation::kSiLU, true},
      {{3, 5, 12}, 3, 0, 6, 5, DitActivation::kGELUTanh, false},
  };
  uint64_t seed = 1500;
  for (const Case& c : cases) {
    const int64_t d = c.shape[2], k = d + c.extra - c.k_less;
    const Shape cond = {1, c.shape[0], d};
    const float ws = 1.f / std::sqrt(static_cast<float>(k));
    Tensor x = input(c.shape, seed++, -2.f, 2.f);
    Tensor shift = input(cond, seed++), scale = input(cond, seed++, -0.5f, 0.5f);
    Tensor down = input({c.extra, d}, seed++, -ws, ws), w = input({c.n, k}, seed++, -ws, ws);
    Tensor b = c.bias ? input({c.n}, seed++) : Tensor();
    Tensor down2 = input({c.extra2 > 0 ? c.extra2 : 1, c.n}, seed++, -ws, ws);
    const std::string what = str_cat(shape_str(c.shape), " +", c.extra, " -> ", c.n, " +", c.extra2,
                                     " (K ", k, "), ", act_name(c.act));
    auto chain = [&](Backend& be, auto up) -> Result<Tensor> {
      LATENT_ASSIGN_OR_RETURN(
          Tensor a, be.layer_norm_modulate_wide(up(x), up(shift), up(scale), {0}, 1e-6f, c.extra));
      LATENT_ASSIGN_OR_RETURN(Tensor filled, be.linear_into_columns(a, up(down), d));
      if (&be == gpu_.get()) {
        EXPECT_EQ(filled.data(), a.data()) << "written in place";
      }
      LATENT_ASSIGN_OR_RETURN(Tensor y, be.linear_wide(filled, up(w), up(b), c.act, c.extra2));
      if (c.extra2 == 0) return y;
      return be.linear_into_columns(y, up(down2), c.n);
    };
    EXPECT_TRUE(close("folded LoRA chain " + what,
                      chain(*gpu_, [&](const Tensor& t) { return on_gpu(t); }),
                      chain(*cpu_, [&](const Tensor& t) { return on_cpu(t); }), linear_tol()));
  }
  // What would read columns it writes, or write outside the row, is refused.
  Tensor x = input({4, 10}, 1), w = input({3, 6}, 2);
  auto y = gpu_->linear_into_columns(on_gpu(x), on_gpu(w), 5);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("linear_into_columns"), std::string::npos)
      << y.status().message();
  y = gpu_->linear_wide(on_gpu(x), on_gpu(input({3, 11}, 3)), Tensor(), DitActivation::kNone, 0);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("reads 11"), std::string::npos) << y.status().message();
}

// attention_wide (the attention-output layers' folded LoRAs): cuDNN's graph writes output rows
// heads * d + extra apart where extra keeps them 16-byte aligned, else our kernel plus a row
// copy; the extra columns are then filled (linear_into_columns), so every column is compared
// against the CPU's composition. With a key mask and key lengths (the padding-mask graph).
TEST_P(CudaDitOps, AttentionWideWritesRowsAtTheirPitch) {
  struct Case {
    int64_t b, t, s;
    int heads;
    int64_t d, extra;
    std::vector<int64_t> lengths;  // empty: no key mask
  };
  const Case cases[] = {
      {1, 300, 300, 4, 64, 16, {}},
      {2, 200, 230, 2, 64, 8, {230, 150}},
      {1, 70, 70, 2, 32, 3, {}},  // rows 67 elements apart: not 16-byte aligned
  };
  uint64_t seed = 1700;
  for (const Case& c : cases) {
    const int64_t hd = c.heads * c.d;
    Tensor q = input({c.b, c.t, hd}, seed++, -2.f, 2.f),
           k = input({c.b, c.s, hd}, seed++, -2.f, 2.f);
    Tensor v = input({c.b, c.s, hd}, seed++);
    const float ws = 1.f / std::sqrt(static_cast<float>(hd));
    Tensor down = input({c.extra, hd}, seed++, -ws, ws);
    Tensor m;
    if (!c.lengths.empty()) {
      std::vector<float> keep;
      for (int64_t bi = 0; bi < c.b; ++bi)
        for (int64_t si = 0; si < c.s; ++si) keep.push_back(si < c.lengths[bi] ? 1.f : 0.f);
      m = Tensor::from_floats({c.b, c.s}, keep);
    }
    auto chain = [&](Backend& be, auto up) -> Result<Tensor> {
      LATENT_ASSIGN_OR_RETURN(
          Tensor o, be.attention_wide(up(q), up(k), up(v), c.heads, up(m), c.lengths, c.extra));
      return be.linear_into_columns(o, up(down), hd);
    };
    EXPECT_TRUE(close(str_cat("attention_wide [", c.b, ", ", c.t, ", ", c.heads, " x ", c.d, "] +",
                              c.extra, c.lengths.empty() ? "" : ", key lengths"),
                      chain(*gpu_, [&](const Tensor& t) { return on_gpu(t); }),
                      chain(*cpu_, [&](const Tensor& t) { return on_cpu(t); }), attention_tol()));
  }
}

TEST_P(CudaDitOps, LinearGeluEpilogueIsTheTanhForm) {
  // cuBLASLt's GELU epilogue must be PyTorch's approximate="tanh" GELU, not the erf form. With
  // y = x exactly (x on a grid TF32 holds, times one-hot weights), the fused output must lie
  // closer to the tanh form than to the erf form (they differ by up to ~1e-3 near |x| = 2).
  if (dtype() != DType::kF32) GTEST_SKIP() << "bf16/fp16 output rounding hides the difference";
  const int64_t m = 512, k = 8, n = 8;
  std::vector<float> xs(m * k, 0.f), ws(n * k, 0.f);
  for (int64_t i = 0; i < m; ++i) xs[i * k] = -4.f + static_cast<float>(i) / 64.f;
  for (int64_t j = 0; j < n; ++j) ws[j * k] = 1.f;
  Result<Tensor> y =
      gpu_->linear(on_gpu(Tensor::from_floats({m, k}, xs)), on_gpu(Tensor::from_floats({n, k}, ws)),
                   Tensor(), DitActivation::kGELUTanh);
  ASSERT_TRUE(y.ok()) << y.status().message();
  Result<Tensor> host = gpu_->download(y.value());
  ASSERT_TRUE(host.ok()) << host.status().message();
  double to_tanh = 0, to_erf = 0;
  for (int64_t i = 0; i < m; ++i) {
    const double v = xs[i * k];
    const double t = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    const double e = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    for (int64_t j = 0; j < n; ++j) {
      const double g = host.value().data_as<float>()[i * n + j];
      to_tanh += (g - t) * (g - t);
      to_erf += (g - e) * (g - e);
    }
  }
  std::printf("  GELU epilogue: L2 distance to tanh form %.3e, to erf form %.3e\n",
              std::sqrt(to_tanh), std::sqrt(to_erf));
  EXPECT_LT(to_tanh, to_erf);
}

TEST_P(CudaDitOps, LinearUnalignedOperands) {
  // A bias (and an input) that are views at an odd element offset: the bias leaves the cuBLASLt
  // epilogue for a separate pass, the input gets an algorithm for its alignment.
  const int64_t n = 48, k = 64;
  Tensor x = input({1, 9, k}, 400), w = input({n, k}, 401, -0.125f, 0.125f);
  Tensor b = input({n + 1}, 402);
  for (DitActivation act : {DitActivation::kNone, DitActivation::kSiLU, DitActivation::kGELUTanh}) {
    Result<Tensor> gb = gpu_->slice(on_gpu(b), 0, 1, n);  // one element in: a view
    Result<Tensor> cb = cpu_->slice(on_cpu(b), 0, 1, n);
    Result<Tensor> gx = gpu_->slice(on_gpu(x), 1, 1, 8);  // one token in: a view
    Result<Tensor> cx = cpu_->slice(on_cpu(x), 1, 1, 8);
    ASSERT_TRUE(gb.ok() && cb.ok() && gx.ok() && cx.ok());
    EXPECT_TRUE(close(str_cat("linear, unaligned bias and input, ", act_name(act)),
                      gpu_->linear(gx.value(), on_gpu(w), gb.value(), act),
                      cpu_->linear(cx.value(), on_cpu(w), cb.value(), act), linear_tol()));
  }
}

TEST_P(CudaDitOps, LayerNorm) {
  struct Case {
    Shape shape;
    bool gamma, beta;
    float offset;
  };
  const Case cases[] = {
      {{2, 1024, 3072}, true, true, 0.f},
      {{1, 4096, 3072}, false, false, 0.f},
      {{1, 300, 3072}, true, false, 8.f},  // mean far from 0: two-pass statistics hold
      {{1, 96, 3072}, true, true, 8.f},    // few rows (the text stream): a block a row
      {{2, 33, 1000}, true, true, 0.f},    // a block a row, the last packs partly held
      {{3, 7, 37}, false, true, 0.f},      // rows not a whole number of packs
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const int64_t d = c.shape.back();
    Tensor x = input(c.shape, seed++, -1.f + c.offset, 1.f + c.offset);
    Tensor g = c.gamma ? input({d}, seed++, 0.5f, 1.5f) : Tensor();
    Tensor b = c.beta ? input({d}, seed++) : Tensor();
    EXPECT_TRUE(close(str_cat("layer_norm ", shape_str(c.shape), c.gamma ? " gamma" : "",
                              c.beta ? " beta" : "", c.offset != 0.f ? " offset 8" : ""),
                      gpu_->layer_norm(on_gpu(x), on_gpu(g), on_gpu(b), 1e-6f),
                      cpu_->layer_norm(on_cpu(x), on_cpu(g), on_cpu(b), 1e-6f), tol()));
  }
}

TEST_P(CudaDitOps, RmsNorm) {
  // Per-head QK norm: [B, T, H * d] viewed as [B, T, H, d] (a contiguous 4-D tensor).
  Tensor x = input({1, 4608, 3072}, 600, -2.f, 2.f);
  Tensor g = input({128}, 601, 0.5f, 1.5f);
  EXPECT_TRUE(close("rms_norm [1, 4608, 24, 128] per head, gamma",
                    gpu_->rms_norm(reshaped(on_gpu(x), {1, 4608, 24, 128}), on_gpu(g), 1e-6f),
                    cpu_->rms_norm(reshaped(on_cpu(x), {1, 4608, 24, 128}), on_cpu(g), 1e-6f),
                    tol()));
  Tensor y = input({2, 64, 3072}, 602);
  EXPECT_TRUE(close("rms_norm [2, 64, 3072] no gamma", gpu_->rms_norm(on_gpu(y), Tensor(), 1e-6f),
                    cpu_->rms_norm(on_cpu(y), Tensor(), 1e-6f), tol()));
  Tensor z = input({5, 30}, 603);
  Tensor gz = input({30}, 604);
  EXPECT_TRUE(close("rms_norm [5, 30] gamma", gpu_->rms_norm(on_gpu(z), on_gpu(gz), 1e-5f),
                    cpu_->rms_norm(on_cpu(z), on_cpu(gz), 1e-5f), tol()));
}

TEST_P(CudaDitOps, ModulateAndGatedAdd) {
  struct Case {
    Shape shape;
    std::vector<int64_t> starts;
  };
  const Case cases[] = {
      {{2, 1024, 3072}, {0}},
      {{1, 4096, 3072}, {0, 3000}},  // zero_cond_t: target tokens, then reference tokens
      {{1, 96, 3072}, {0}},          // the text stream's few rows
      {{2, 9, 20}, {0, 4}},          // rows not a whole number of packs
      {{3, 6, 8}, {0, 1, 2}},
  };
  uint64_t seed = 700;
  for (const Case& c : cases) {
    const int64_t groups = static_cast<int64_t>(c.starts.size());
    const Shape cond = {groups, c.shape[0], c.shape[2]};
    Tensor x = input(c.shape, seed++, -2.f, 2.f), r = input(c.shape, seed++);
    Tensor shift = input(cond, seed++), scale = input(cond, seed++, -0.5f, 0.5f);
    Tensor gate = input(cond, seed++);
    const std::string s = str_cat(shape_str(c.shape), " G=", groups);
    EXPECT_TRUE(close("modulate " + s,
                      gpu_->modulate(on_gpu(x), on_gpu(shift), on_gpu(scale), c.starts),
                      cpu_->modulate(on_cpu(x), on_cpu(shift), on_cpu(scale), c.starts), tol()));
    EXPECT_TRUE(
        close("layer_norm_modulate " + s,
              gpu_->layer_norm_modulate(on_gpu(x), on_gpu(shift), on_gpu(scale), c.starts, 1e-6f),
              cpu_->layer_norm_modulate(on_cpu(x), on_cpu(shift), on_cpu(scale), c.starts, 1e-6f),
              tol()));
    EXPECT_TRUE(close("gated_add " + s,
                      gpu_->gated_add(on_gpu(r), on_gpu(x), on_gpu(gate), c.starts),
                      cpu_->gated_add(on_cpu(r), on_cpu(x), on_cpu(gate), c.starts), tol()));
  }
}

TEST_P(CudaDitOps, Rope) {
  struct Case {
    Shape shape;
    int heads;
  };
  const Case cases[] = {{{1, 4608, 3072}, 24}, {{2, 300, 256}, 2}, {{2, 5, 18}, 3}};
  uint64_t seed = 800;
  for (const Case& c : cases) {
    const int64_t t = c.shape[1], half = c.shape[2] / c.heads / 2;
    Tensor freqs = random_rope_table(t, half, seed++);
    Result<Tensor> gf = gpu_->upload_fp32(freqs), cf = cpu_->upload_fp32(freqs);
    ASSERT_TRUE(gf.ok() && cf.ok());
    Tensor x = input(c.shape, seed++, -2.f, 2.f);
    EXPECT_TRUE(close(str_cat("rope ", shape_str(c.shape), " ", c.heads, " heads"),
                      gpu_->rope(on_gpu(x), gf.value(), c.heads),
                      cpu_->rope(on_cpu(x), cf.value(), c.heads), tol()));
  }
}

TEST_P(CudaDitOps, JointQkIsNormConcatRopeInOnePass) {
  // Backend::joint_qk against the CPU's composition (rms_norm per head, concat, rope).
  struct Case {
    int64_t b, t_img, t_txt;
    int heads;
    int64_t d;
  };
  // The packed kernel takes heads of 4 to 32 packs of 16 bytes: d = 128, 64, 256 and fp32's 16.
  // bf16 / fp16 d = 16 (2 packs), fp32 d = 256 (64 packs) and d = 6 run the warp-a-head kernel.
  const Case cases[] = {{1, 4096, 96, 24, 128}, {1, 60, 9, 4, 64}, {2, 33, 4, 2, 256},
                        {2, 7, 5, 3, 16},       {2, 30, 1, 2, 6}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const int64_t t = c.t_img + c.t_txt, half = c.d / 2, ch = c.heads * c.d;
    Tensor freqs = random_rope_table(t, half, seed++);
    Result<Tensor> gf = gpu_->upload_fp32(freqs), cf = cpu_->upload_fp32(freqs);
    ASSERT_TRUE(gf.ok() && cf.ok());
    Tensor img = input({c.b, c.t_img, ch}, seed++, -3.f, 3.f);
    Tensor txt = input({c.b, c.t_txt, ch}, seed++, -0.5f, 0.5f);  // another scale per stream
    Tensor gi = input({c.d}, seed++, 0.5f, 1.5f), gt = input({c.d}, seed++, -1.f, 1.f);
    EXPECT_TRUE(close(str_cat("joint_qk ", c.b, "x(", c.t_img, "+", c.t_txt, ") ", c.heads,
                              " heads of ", c.d),
                      gpu_->joint_qk(on_gpu(img), on_gpu(txt), on_gpu(gi), on_gpu(gt), gf.value(),
                                     c.heads, 1e-6f),
                      cpu_->joint_qk(on_cpu(img), on_cpu(txt), on_cpu(gi), on_cpu(gt), cf.value(),
                                     c.heads, 1e-6f),
                      tol()));
  }
  // Refusals name the problem.
  Tensor img = input({1, 4, 32}, 1), txt = input({1, 3, 16}, 2), g = input({16}, 3);
  Tensor f = Tensor::from_floats({7, 8, 2}, std::vector<float>(7 * 16, 0.f));
  auto r = gpu_->joint_qk(on_gpu(img), on_gpu(txt), on_gpu(g), on_gpu(g),
                          gpu_->upload_fp32(f).value(), 2, 1e-6f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("do not fit together"), std::string::npos)
      << r.status().message();
}

TEST_P(CudaDitOps, AttentionDitSized) {
  // Joint attention of Qwen-Image: 512 text tokens (the last 212 padding) then 4096 image
  // tokens, 24 heads of 128; the padding sits in the middle of the key sequence.
  const int64_t text = 512, image = 4096, s = text + image;
  std::vector<float> keep(static_cast<size_t>(s), 1.f);
  for (int64_t j = 300; j < text; ++j) keep[j] = 0.f;
  check_attention_sampled("attention [1, 4608, 24 x 128], 212 padding keys", 1, s, s, 24, 128, keep,
                          900);
}

TEST_P(CudaDitOps, AttentionSmall) {
  // Cross lengths, masks that empty whole key tiles (including the first), every kernel path:
  // tensor cores for d = 64 / 128 in bf16/fp16, CUDA cores for the rest and for fp32.
  std::vector<float> keep(2 * 130, 1.f);
  for (int64_t j = 0; j < 70; ++j) keep[130 + j] = 0.f;  // row 1: keys 0..69 masked
  for (int64_t j = 100; j < 130; ++j) keep[j] = 0.f;     // row 0: the tail masked
  check_attention("attention b2 t77 s130 2 x 64, mask", 2, 77, 130, 2, 64, keep, 1000);
  check_attention("attention b2 t33 s50 3 x 128, no mask", 2, 33, 50, 3, 128, {}, 1010);
  check_attention("attention b2 t77 s130 4 x 32, mask", 2, 77, 130, 4, 32, keep, 1020);
  check_attention("attention b2 t77 s130 1 x 80, mask", 2, 77, 130, 1, 80, keep, 1030);
  check_attention("attention b1 t1 s1 1 x 128", 1, 1, 1, 1, 128, {}, 1040);
  check_attention("attention b1 t200 s7 2 x 256", 1, 200, 7, 2, 256, {}, 1050);
}

TEST_P(CudaDitOps, AttentionQwenImageShapes) {
  // The shapes of one Qwen-Image step, joint attention over [128 text | image] keys, 24 heads of
  // 128: text-to-image (4,096 image tokens, the last quarter of the text padding) and edit
  // (8,192 image tokens) with the CFG batch of 2 (row 1 with half of the text padding).
  // Every kernel variant, sampled rows against float64.
  const int64_t text = 128;
  {
    const int64_t s = text + 4096;
    std::vector<float> keep(static_cast<size_t>(s), 1.f);
    for (int64_t j = 96; j < text; ++j) keep[j] = 0.f;
    check_attention_sampled("attention [1, 4224, 24 x 128], 32 text keys masked", 1, s, s, 24, 128,
                            keep, 1500);
  }
  {
    const int64_t s = text + 8192;
    std::vector<float> keep(static_cast<size_t>(2 * s), 1.f);
    for (int64_t j = 96; j < text; ++j) keep[j] = 0.f;
    for (int64_t j = 64; j < text; ++j) keep[s + j] = 0.f;
    check_attention_sampled("attention [2, 8320, 24 x 128], text keys masked", 2, s, s, 24, 128,
                            keep, 1510);
  }
}

TEST_P(CudaDitOps, AttentionOddSizesEveryKernel) {
  // Lengths that are no multiple of any tile (16, 32, 64, 128), whole key tiles masked at the
  // start (row 1) and at the end (row 0: the last 100 keys, so the final 64-key tile is empty),
  // d = 64 and 128, every kernel variant, full CPU reference.
  const int64_t s = 1237;
  std::vector<float> keep(static_cast<size_t>(2 * s), 1.f);
  for (int64_t j = s - 100; j < s; ++j) keep[j] = 0.f;
  for (int64_t j = 0; j < 70; ++j) keep[s + j] = 0.f;
  for (const char* kernel : attention_kernels()) {
    ScopedAttentionKernel forced(kernel);
    const std::string tag = std::string(" [") + kernel + "]";
    check_attention("attention b2 t1000 s1237 2 x 128, mask" + tag, 2, 1000, s, 2, 128, keep, 1600);
    check_attention("attention b2 t77 s1237 3 x 64, mask" + tag, 2, 77, s, 3, 64, keep, 1610);
    check_attention("attention b1 t129 s65 2 x 128, no mask" + tag, 1, 129, 65, 2, 128, {}, 1620);
  }
}

TEST_P(CudaDitOps, AttentionFullyMaskedRowIsZero) {
  // The CPU backend rejects a batch row without keys; the CUDA one cannot see the mask's values
  // without a host synchronisation and writes zeros for such a row instead of NaN.
  for (const char* kernel : attention_kernels()) {
    ScopedAttentionKernel forced(kernel);
    for (int64_t d : {128, 64, 48}) {
      const int64_t s = 40;
      std::vector<float> keep(2 * s, 1.f);
      for (int64_t j = 0; j < s; ++j) keep[s + j] = 0.f;
      Tensor q = on_gpu(input({2, 10, 2 * d}, 1100)), kv = on_gpu(input({2, s, 2 * d}, 1101));
      Result<Tensor> y = gpu_->attention(q, kv, kv, 2, on_gpu(Tensor::from_floats({2, s}, keep)));
      ASSERT_TRUE(y.ok()) << y.status().message();
      Result<Tensor> host = gpu_->download(y.value());
      ASSERT_TRUE(host.ok()) << host.status().message();
      const float* p = host.value().data_as<float>();
      const int64_t row = 10 * 2 * d;
      double first = 0;
      for (int64_t i = 0; i < row; ++i) first += std::fabs(p[i]);
      EXPECT_GT(first, 0.0) << kernel << " d " << d << ": batch row 0 has keys";
      for (int64_t i = row; i < 2 * row; ++i)
        ASSERT_EQ(p[i], 0.f) << kernel << " d " << d << " at " << i;
    }
  }
}

TEST_P(CudaDitOps, ElementwiseOps) {
  uint64_t seed = 1200;
  for (const Shape& s : {Shape{2, 4096, 64}, Shape{3, 1000}, Shape{37}}) {
    for (DitActivation act :
         {DitActivation::kNone, DitActivation::kSiLU, DitActivation::kGELUTanh}) {
      Tensor x = input(s, seed++, -5.f, 5.f);
      EXPECT_TRUE(close(str_cat("dit_activation ", act_name(act), " ", shape_str(s)),
                        gpu_->dit_activation(on_gpu(x), act), cpu_->dit_activation(on_cpu(x), act),
                        tol()));
    }
    Tensor a = input(s, seed++), b = input(s, seed++);
    EXPECT_TRUE(close(str_cat("scaled_add ", shape_str(s)),
                      gpu_->scaled_add(on_gpu(a), on_gpu(b), 0.75f, -1.25f),
                      cpu_->scaled_add(on_cpu(a), on_cpu(b), 0.75f, -1.25f), tol()));
  }
  for (const Shape& s : {Shape{2, 4096, 64}, Shape{3, 5, 7}, Shape{1, 16, 3072}}) {
    Tensor c = input(s, seed++), u = input(s, seed++);
    EXPECT_TRUE(close(str_cat("cfg_combine ", shape_str(s), " scale 4"),
                      gpu_->cfg_combine(on_gpu(c), on_gpu(u), 4.f),
                      cpu_->cfg_combine(on_cpu(c), on_cpu(u), 4.f), tol()));
  }
}

TEST_P(CudaDitOps, ConcatAndSliceAreExact) {
  Tensor text = input({2, 512, 3072}, 1300), image = input({2, 4096, 3072}, 1301);
  EXPECT_TRUE(close("concat tokens [2, 512 + 4096, 3072]",
                    gpu_->concat({on_gpu(text), on_gpu(image)}, 1),
                    cpu_->concat({on_cpu(text), on_cpu(image)}, 1), 0.0));
  Tensor a = input({3, 5, 7}, 1302), b = input({3, 5, 2}, 1303), c = input({3, 5, 1}, 1304);
  EXPECT_TRUE(close("concat features [3, 5, 7 + 2 + 1] (dim -1)",
                    gpu_->concat({on_gpu(a), on_gpu(b), on_gpu(c)}, -1),
                    cpu_->concat({on_cpu(a), on_cpu(b), on_cpu(c)}, -1), 0.0));
  Tensor d = input({1, 5, 7}, 1305);
  EXPECT_TRUE(close("concat batch [3 + 1, 5, 7]", gpu_->concat({on_gpu(a), on_gpu(d)}, 0),
                    cpu_->concat({on_cpu(a), on_cpu(d)}, 0), 0.0));

  Tensor x = input({2, 4608, 3072}, 1306);
  Tensor gx = on_gpu(x), cx = on_cpu(x);
  EXPECT_TRUE(close("slice tokens [512, 4608) of [2, 4608, 3072] (copy)",
                    gpu_->slice(gx, 1, 512, 4096), cpu_->slice(cx, 1, 512, 4096), 0.0));
  EXPECT_TRUE(
      close("slice batch row 1 (view)", gpu_->slice(gx, 0, 1, 1), cpu_->slice(cx, 0, 1, 1), 0.0));
  EXPECT_TRUE(close("slice features [3, 6) of [3, 5, 7]", gpu_->slice(on_gpu(a), -1, 3, 3),
                    cpu_->slice(on_cpu(a), -1, 3, 3), 0.0));
  // A view feeds other ops like any tensor.
  Tensor y = input({1, 600, 64}, 1307);
  Result<Tensor> gv = gpu_->slice(on_gpu(y), 1, 77, 500), cv = cpu_->slice(on_cpu(y), 1, 77, 500);
  ASSERT_TRUE(gv.ok() && cv.ok());
  EXPECT_TRUE(close("layer_norm of a token view",
                    gpu_->layer_norm(gv.value(), Tensor(), Tensor(), 1e-6f),
                    cpu_->layer_norm(cv.value(), Tensor(), Tensor(), 1e-6f), tol()));
}

TEST_P(CudaDitOps, RejectsBadInputs) {
  Tensor host = input({2, 8, 16}, 1400);
  Tensor x = on_gpu(host);
  Tensor w = on_gpu(input({4, 12}, 1401));
  Result<Tensor> r = gpu_->layer_norm(host, Tensor(), Tensor(), 1e-6f);  // a host tensor
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("upload"), std::string::npos) << r.status().message();
  r = gpu_->linear(x, w, Tensor(), DitActivation::kNone);  // 12 input features, x has 16
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("input features"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("linear on cuda:0"), std::string::npos)
      << r.status().message();
  Tensor nhwc = on_gpu(input({1, 4, 3, 5}, 1402));  // uploaded 4-D: NHWC
  r = gpu_->rms_norm(nhwc, Tensor(), 1e-6f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("NHWC"), std::string::npos) << r.status().message();
  Tensor cond = on_gpu(input({1, 2, 16}, 1403));
  EXPECT_FALSE(gpu_->modulate(x, cond, cond, {0, 4}).ok());  // 2 groups, 1 group of rows given
  EXPECT_FALSE(gpu_->modulate(x, cond, cond, {0, 0}).ok());  // starts not increasing
  EXPECT_FALSE(gpu_->gated_add(x, on_gpu(input({2, 7, 16}, 1404)), cond, {0}).ok());
  EXPECT_FALSE(gpu_->attention(x, x, x, 3, Tensor()).ok());  // 16 features, 3 heads
  EXPECT_FALSE(gpu_->attention(x, x, x, 2, on_gpu(input({2, 7}, 1405))).ok());  // mask [2, 7]
  Result<Tensor> f = gpu_->upload_fp32(random_tensor({7, 4, 2}, 1406));
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(gpu_->rope(x, f.value(), 2).ok());  // 8 tokens need [8, 4, 2]
  EXPECT_FALSE(gpu_->rope(x, f.value(), 3).ok());  // 16 features, 3 heads
  if (dtype() != DType::kF32) {
    EXPECT_FALSE(gpu_->rope(x, x, 2).ok());  // freqs not fp32
  }
  EXPECT_FALSE(gpu_->slice(x, 1, 4, 5).ok());
  EXPECT_FALSE(gpu_->slice(x, 3, 0, 1).ok());
  EXPECT_FALSE(gpu_->concat({x, on_gpu(input({2, 8, 15}, 1407))}, 1).ok());
  EXPECT_FALSE(gpu_->scaled_add(x, on_gpu(input({2, 8, 15}, 1408)), 1.f, 1.f).ok());
  EXPECT_FALSE(gpu_->dit_activation(x, static_cast<DitActivation>(9)).ok());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaDitOps,
                         ::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace latent

#endif  // LATENT_HAVE_CUDA
