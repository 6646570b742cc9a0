// The DiT attention op on cuDNN's fused flash attention (engine/backends/cuda/sdpa.h) against our
// own kernel (LATENT_CUDNN_SDPA=0) and a float64 reference, at Qwen-Image shapes (24 heads of
// 128; 4,224 and 8,320 tokens of [128 text | image], text keys masked in the middle) and odd ones
// (1,000 tokens with only a few valid keys, Tq != Tk), bf16 and fp16:
//   - both paths: every output finite (the backend poisons new buffers with NaN) and sampled rows
//     (every batch row, three heads, queries at tile edges and the ends) within the attention
//     tolerance of test_cuda_dit_ops (relative L2: bf16 1e-2, fp16 5e-3) of float64;
//   - the whole cuDNN output within twice that of our kernel's;
//   - sdpa_counters() shows which path ran: cuDNN for the DiT shapes (required), either for the
//     odd ones (printed);
//   - LATENT_CUDNN_SDPA=0, LATENT_ATTENTION_KERNEL and fp32 select our kernel;
//   - the cuDNN path inside a graph capture replays to the eager result.
// The model's [image | text] order with right-padded text (valid keys a prefix per row, B = 2,
// different lengths) also runs with key lengths: cuDNN's padding mask, checked like the rest
// against float64, the bias graph and our kernel; the variant that ran is printed (the padding
// graph falling back to the bias graph is a warning, not a failure), and the lengths are
// uploaded once. And a timing print (not an assertion) of every path at 4,224 and 8,320 tokens:
// B = 1 with text keys masked in the middle, B = 2 unmasked, bias and padding mask.
//
// Without a GPU, or in a build without cudnn-frontend, the binary exits with 77 (skipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/frames.h"
#include "engine/backends/registry.h"
#include "tests/util/test_util.h"
#ifdef LATENT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/sdpa.h"
#include "tests/util/cuda_test_util.h"
#endif

namespace {

// Runs before gtest's main: no GPU or no cuDNN SDPA in this build, no test.
const bool kRunnable = [] {
  latent::test::exit_without_gpu("test_cuda_sdpa");
#ifdef LATENT_HAVE_CUDA
  if (!latent::cuda::sdpa_compiled()) {
    std::fprintf(stderr,
                 "test_cuda_sdpa: built without cudnn-frontend (cuDNN SDPA off; run "
                 "scripts/install-deps.sh and reconfigure), skipping (exit 77)\n");
    std::exit(77);
  }
#endif
  return true;
}();

}  // namespace

#ifdef LATENT_HAVE_CUDA

namespace latent {
namespace {

using test::random_tensor;

int device_major() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return 0;
  return p.major;
}

// Sets (or, with nullptr, unsets) an environment variable for its lifetime.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// kPadding: cuDNN with key lengths (its padding mask), kCudnn: cuDNN with the mask as a bias
// (or no mask), kOurs: our kernel.
enum class Path { kPadding, kCudnn, kOurs };
const char* path_name(Path p) {
  return p == Path::kPadding ? "padding" : p == Path::kCudnn ? "cudnn" : "ours";
}

// One attention problem: q [b, t, heads * d]; k, v [b, s, heads * d]; keep: b * s flags or
// empty (no mask); lengths: empty, or per row the valid keys that `keep` holds as a prefix.
struct Problem {
  std::string name;
  int64_t b, t, s;
  int heads;
  int64_t d;
  std::vector<float> keep;
  bool cudnn_required;  // a DiT shape: the cuDNN path must have run
  std::vector<int64_t> lengths = {};
};

// The mask of right-padded rows: keys [0, lengths[b]) of row b valid.
std::vector<float> prefix_mask(int64_t s, const std::vector<int64_t>& lengths) {
  std::vector<float> keep(lengths.size() * static_cast<size_t>(s), 0.f);
  for (size_t b = 0; b < lengths.size(); ++b)
    std::fill(keep.begin() + static_cast<int64_t>(b) * s,
              keep.begin() + static_cast<int64_t>(b) * s + lengths[b], 1.f);
  return keep;
}

// The bf16 and fp16 cases (input() rounds to them); no CPU reference (float64 rows instead).
class CudaSdpa : public test::CudaOpTest {
 protected:
  void SetUp() override {
    unsetenv("LATENT_CUDNN_SDPA");
    unsetenv("LATENT_ATTENTION_KERNEL");
    if (device_major() < 8) GTEST_SKIP() << "cuDNN SDPA needs sm_80 or newer";
    gpu_ = test::poisoned_cuda_backend(GetParam());
    ASSERT_TRUE(gpu_);
  }

  double tol() const { return dtype() == DType::kBF16 ? 1e-2 : 5e-3; }

  // Runs the op on one path (key lengths passed only for kPadding); `ran` gets the path
  // sdpa_counters() saw.
  Result<Tensor> run(Path path, const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                     const Tensor& m, Path* ran = nullptr,
                     const std::vector<int64_t>& lengths = {}) {
    ScopedEnv env("LATENT_CUDNN_SDPA", path == Path::kOurs ? "0" : nullptr);
    const cuda::SdpaCounters before = cuda::sdpa_counters();
    Result<Tensor> y = gpu_->attention(q, k, v, heads, m,
                                       path == Path::kPadding ? lengths : std::vector<int64_t>{});
    const cuda::SdpaCounters after = cuda::sdpa_counters();
    if (ran)
      *ran = after.cudnn_padding > before.cudnn_padding ? Path::kPadding
             : after.cudnn > before.cudnn              ? Path::kCudnn
                                                       : Path::kOurs;
    EXPECT_EQ((after.cudnn - before.cudnn) + (after.fallback - before.fallback), 1)
        << "one attention call, one count";
    return y;
  }

  void check(const Problem& p, uint64_t seed) {
    const int64_t ch = p.heads * p.d;
    Tensor q = input({p.b, p.t, ch}, seed, -2.f, 2.f);
    Tensor k = input({p.b, p.s, ch}, seed + 1, -2.f, 2.f);
    Tensor v = input({p.b, p.s, ch}, seed + 2);
    Tensor m = p.keep.empty() ? Tensor() : Tensor::from_floats({p.b, p.s}, p.keep);
    Tensor gq = on_gpu(q), gk = on_gpu(k), gv = on_gpu(v), gm = on_gpu(m);
    // float64 attention for sampled rows.
    const std::vector<test::AttentionRow> rows = test::attention_rows(
        q, k, v, p.heads, p.keep, test::sample_heads(p.heads),
        test::sample_queries(
            {0, 1, 63, 64, 127, 128, p.t / 2 + 3, p.t - 129, p.t - 64, p.t - 2, p.t - 1}, p.t));

    std::map<Path, std::vector<float>> outputs;
    std::vector<Path> paths = {Path::kCudnn, Path::kOurs};
    if (!p.lengths.empty()) paths.insert(paths.begin(), Path::kPadding);
    for (Path path : paths) {
      const std::string name = p.name + " [" + path_name(path) + "]";
      Path ran = Path::kOurs;
      Result<Tensor> y = run(path, gq, gk, gv, p.heads, gm, &ran, p.lengths);
      ASSERT_TRUE(y.ok()) << name << ": " << y.status().message();
      if (path == Path::kOurs) {
        EXPECT_EQ(ran, Path::kOurs) << name << ": LATENT_CUDNN_SDPA=0";
      } else if (p.cudnn_required) {
        EXPECT_NE(ran, Path::kOurs)
            << name << ": cuDNN SDPA did not run (see the warning above; rerun with "
            << "CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr CUDNN_FRONTEND_LOG_INFO=1 "
            << "CUDNN_FRONTEND_LOG_FILE=stderr)";
        if (path == Path::kPadding && ran != Path::kPadding)
          std::printf("  %s: PADDING MASK NOT USED, the %s path ran (see the warning above)\n",
                      name.c_str(), path_name(ran));
        if (path == Path::kCudnn) {
          EXPECT_EQ(ran, Path::kCudnn) << name << ": no key lengths given";
        }
      } else if (ran == Path::kOurs) {
        std::printf("  %s: cuDNN has no engine for this shape, our kernel ran\n", name.c_str());
      }
      const Tensor host = test::download_finite(*gpu_, y.value(), p.b * p.t * ch, name);
      ASSERT_TRUE(host.defined());
      const float* yp = host.data_as<float>();
      const double err = test::rows_rel_l2(rows, host);
      std::printf("  %-66s %-5s ran %-7s vs f64 rel L2 %.3e (tol %.0e, %zu rows)\n", name.c_str(),
                  dtype_name(dtype()), path_name(ran), err, tol(), rows.size());
      EXPECT_LE(err, tol()) << name;
      outputs[path].assign(yp, yp + host.numel());
    }
    auto compare = [&](Path a, Path b) {
      const std::vector<float>& x = outputs[a];
      const std::vector<float>& y = outputs[b];
      double num = 0, den = 0;
      for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
        const double e = static_cast<double>(x[i]) - y[i];
        num += e * e;
        den += static_cast<double>(y[i]) * y[i];
      }
      const double err = std::sqrt(num / std::max(den, 1e-30));
      std::printf("  %-66s %-5s %s vs %s, whole output rel L2 %.3e (tol %.0e)\n", p.name.c_str(),
                  dtype_name(dtype()), path_name(a), path_name(b), err, 2 * tol());
      EXPECT_LE(err, 2 * tol()) << p.name << ": " << path_name(a) << " and " << path_name(b)
                                << " disagree";
    };
    compare(Path::kCudnn, Path::kOurs);
    if (!p.lengths.empty()) {
      compare(Path::kPadding, Path::kCudnn);
      compare(Path::kPadding, Path::kOurs);
    }
  }
};

// [128 text | image] keys with text keys [from, to) masked in batch row `row`.
void mask_text(std::vector<float>* keep, int64_t s, int64_t row, int64_t from, int64_t to) {
  for (int64_t j = from; j < to; ++j) (*keep)[static_cast<size_t>(row * s + j)] = 0.f;
}

TEST_P(CudaSdpa, QwenImageShapes) {
  const int64_t text = 128;
  {
    const int64_t s = text + 4096;
    std::vector<float> keep(static_cast<size_t>(s), 1.f);
    mask_text(&keep, s, 0, 48, 80);  // 32 text keys in the middle
    check({"[1, 4224, 24 x 128], 32 text keys masked", 1, s, s, 24, 128, keep, true}, 2000);
  }
  {
    const int64_t s = text + 4096;
    std::vector<float> keep(static_cast<size_t>(2 * s), 1.f);
    mask_text(&keep, s, 0, 48, 80);
    mask_text(&keep, s, 1, 64, 128);  // row 1: the text's second half
    check({"[2, 4224, 24 x 128], text keys masked per row", 2, s, s, 24, 128, keep, true}, 2010);
  }
  {
    const int64_t s = text + 8192;
    check({"[2, 8320, 24 x 128], no mask", 2, s, s, 24, 128, {}, true}, 2020);
  }
}

// The model's order: [image | 128 text] keys, the text right-padded to a different length per
// row (key s of row b valid iff s < lengths[b]), B = 2: cuDNN's padding mask (key lengths), the
// bias graph and our kernel against float64 and each other.
TEST_P(CudaSdpa, QwenImageShapesWithKeyLengths) {
  for (int64_t image : {int64_t{4096}, int64_t{8192}}) {
    const int64_t s = image + 128;
    const std::vector<int64_t> lengths = {image + 100, image + 37};
    check({str_cat("[2, ", s, ", 24 x 128], text tails of 28 and 91 padded"), 2, s, s, 24, 128,
           prefix_mask(s, lengths), true, lengths},
          2050 + static_cast<uint64_t>(image / 4096));
  }
  {
    // Tq != Tk, one row fully valid, lengths not a multiple of any tile.
    const int64_t s = 1237;
    const std::vector<int64_t> lengths = {s, 613};
    check({"[2, 77 q, 1237 k, 3 x 64], key lengths 1237 and 613", 2, 77, s, 3, 64,
           prefix_mask(s, lengths), false, lengths},
          2060);
  }
}

// The key lengths go up once per distinct set (a second call uploads nothing); their count and
// range are checked.
TEST_P(CudaSdpa, KeyLengthsUploadedOnceAndChecked) {
  const int64_t s = 512;
  const int heads = 2;
  const std::vector<int64_t> lengths = {300, 511};
  Tensor q = on_gpu(input({2, s, heads * 128}, 2070));
  Tensor m = on_gpu(Tensor::from_floats({2, s}, prefix_mask(s, lengths)));
  Path ran = Path::kOurs;
  ASSERT_TRUE(run(Path::kPadding, q, q, q, heads, m, &ran, lengths).ok());
  std::printf("  key lengths [2, 512]: %s ran\n", path_name(ran));
  const TransferCounts before = transfer_counts();
  ASSERT_TRUE(run(Path::kPadding, q, q, q, heads, m, &ran, lengths).ok());
  EXPECT_EQ(transfer_counts().host_to_device, before.host_to_device)
      << "the lengths of an earlier call were uploaded again";
  EXPECT_TRUE(gpu_->synchronize().ok());
  // What the device cannot check against the mask, it checks on the host.
  auto expect_error = [](const Result<Tensor>& r, const std::string& words) {
    ASSERT_FALSE(r.ok()) << words;
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
  };
  expect_error(gpu_->attention(q, q, q, heads, Tensor(), lengths), "without a key_mask");
  expect_error(gpu_->attention(q, q, q, heads, m, {300}), "1 key_lengths for a batch of 2");
  expect_error(gpu_->attention(q, q, q, heads, m, {0, 511}), "key_lengths[0] = 0 is outside");
  expect_error(gpu_->attention(q, q, q, heads, m, {300, 513}), "key_lengths[1] = 513 is outside");
}

TEST_P(CudaSdpa, OddShapes) {
  {
    // Only a few valid keys: row 0 keys 3, 500 and 999, row 1 keys 100..104.
    const int64_t s = 1000;
    std::vector<float> keep(static_cast<size_t>(2 * s), 0.f);
    for (int64_t j : {int64_t{3}, int64_t{500}, int64_t{999}}) keep[static_cast<size_t>(j)] = 1.f;
    for (int64_t j = 100; j < 105; ++j) keep[static_cast<size_t>(s + j)] = 1.f;
    check({"[2, 1000, 24 x 128], few valid keys", 2, s, s, 24, 128, keep, false}, 2100);
  }
  {
    const int64_t s = 1237;
    std::vector<float> keep(static_cast<size_t>(2 * s), 1.f);
    for (int64_t j = s - 100; j < s; ++j) keep[static_cast<size_t>(j)] = 0.f;
    for (int64_t j = 0; j < 130; ++j) keep[static_cast<size_t>(s + j)] = 0.f;
    check({"[2, 77 q, 1237 k, 3 x 64], mask", 2, 77, s, 3, 64, keep, false}, 2110);
  }
  check({"[1, 129 q, 65 k, 2 x 256], no mask", 1, 129, 65, 2, 256, {}, false}, 2120);
}

TEST_P(CudaSdpa, FallbackSwitches) {
  const int64_t s = 256;
  Tensor q = on_gpu(input({1, s, 2 * 128}, 2200));
  Path ran = Path::kCudnn;
  ASSERT_TRUE(run(Path::kCudnn, q, q, q, 2, Tensor(), &ran).ok());
  EXPECT_EQ(ran, Path::kCudnn) << "default: cuDNN SDPA";
  ASSERT_TRUE(run(Path::kOurs, q, q, q, 2, Tensor(), &ran).ok());
  EXPECT_EQ(ran, Path::kOurs) << "LATENT_CUDNN_SDPA=0: our kernel";
  {
    ScopedEnv forced("LATENT_ATTENTION_KERNEL", "mma");
    ASSERT_TRUE(run(Path::kCudnn, q, q, q, 2, Tensor(), &ran).ok());
    EXPECT_EQ(ran, Path::kOurs) << "LATENT_ATTENTION_KERNEL=mma: our kernel";
  }
  {
    ScopedEnv on("LATENT_CUDNN_SDPA", "1");
    const cuda::SdpaCounters before = cuda::sdpa_counters();
    ASSERT_TRUE(gpu_->attention(q, q, q, 2, Tensor()).ok());
    EXPECT_EQ(cuda::sdpa_counters().cudnn, before.cudnn + 1) << "LATENT_CUDNN_SDPA=1: cuDNN";
  }
}

TEST(CudaSdpaFp32, UsesOurKernel) {
  if (device_major() < 8) GTEST_SKIP() << "sm_80 or newer";
  std::shared_ptr<Backend> gpu = test::poisoned_cuda_backend(DType::kF32);
  ASSERT_TRUE(gpu);
  Result<Tensor> q = gpu->upload(random_tensor({1, 64, 128}, 2300));
  ASSERT_TRUE(q.ok());
  const cuda::SdpaCounters before = cuda::sdpa_counters();
  ASSERT_TRUE(gpu->attention(q.value(), q.value(), q.value(), 1, Tensor()).ok());
  EXPECT_EQ(cuda::sdpa_counters().fallback, before.fallback + 1);
  EXPECT_EQ(cuda::sdpa_counters().cudnn, before.cudnn);
}

TEST_P(CudaSdpa, GraphCapture) {
  // The cuDNN path queued inside a capture (graph built by the eager call before it) replays
  // to the eager result.
  if (!gpu_->supports_capture()) GTEST_SKIP() << "backend does not capture";
  const int64_t s = 640;
  const int heads = 4;
  std::vector<float> keep(static_cast<size_t>(s), 1.f);
  for (int64_t j = 10; j < 40; ++j) keep[static_cast<size_t>(j)] = 0.f;
  Tensor q = on_gpu(input({1, s, heads * 128}, 2400, -2.f, 2.f));
  Tensor k = on_gpu(input({1, s, heads * 128}, 2401, -2.f, 2.f));
  Tensor v = on_gpu(input({1, s, heads * 128}, 2402));
  Tensor m = on_gpu(Tensor::from_floats({1, s}, keep));
  Path ran = Path::kOurs;
  Result<Tensor> eager = run(Path::kCudnn, q, k, v, heads, m, &ran);
  ASSERT_TRUE(eager.ok()) << eager.status().message();
  ASSERT_EQ(ran, Path::kCudnn);
  Tensor dst = on_gpu(Tensor::zeros({1, s, heads * 128}, DType::kF32));
  ASSERT_TRUE(gpu_->begin_capture().ok());
  Result<Tensor> y = run(Path::kCudnn, q, k, v, heads, m, &ran);
  Status copied = y.ok() ? gpu_->copy_into(y.value(), dst) : y.status();
  Result<std::shared_ptr<CapturedGraph>> graph = gpu_->end_capture();
  ASSERT_TRUE(copied.ok()) << copied.message();
  ASSERT_TRUE(graph.ok()) << graph.status().message();
  EXPECT_EQ(ran, Path::kCudnn) << "cuDNN SDPA inside the capture";
  ASSERT_TRUE(gpu_->replay(*graph.value()).ok());
  Result<Tensor> a = gpu_->download(eager.value());
  Result<Tensor> b = gpu_->download(dst);
  ASSERT_TRUE(a.ok() && b.ok());
  const double err = relative_l2(b.value(), a.value());
  std::printf("  capture replay vs eager (%s): rel L2 %.3e\n", dtype_name(dtype()), err);
  EXPECT_LE(err, 1e-6);
}

TEST_P(CudaSdpa, GraphCaptureWithKeyLengths) {
  // The padding graph and its lengths, made by the eager call, inside a capture.
  if (!gpu_->supports_capture()) GTEST_SKIP() << "backend does not capture";
  const int64_t s = 640;
  const int heads = 4;
  const std::vector<int64_t> lengths = {600, 77};
  Tensor q = on_gpu(input({2, s, heads * 128}, 2410, -2.f, 2.f));
  Tensor k = on_gpu(input({2, s, heads * 128}, 2411, -2.f, 2.f));
  Tensor v = on_gpu(input({2, s, heads * 128}, 2412));
  Tensor m = on_gpu(Tensor::from_floats({2, s}, prefix_mask(s, lengths)));
  Path eager_ran = Path::kOurs, ran = Path::kOurs;
  Result<Tensor> eager = run(Path::kPadding, q, k, v, heads, m, &eager_ran, lengths);
  ASSERT_TRUE(eager.ok()) << eager.status().message();
  Tensor dst = on_gpu(Tensor::zeros({2, s, heads * 128}, DType::kF32));
  ASSERT_TRUE(gpu_->begin_capture().ok());
  Result<Tensor> y = run(Path::kPadding, q, k, v, heads, m, &ran, lengths);
  Status copied = y.ok() ? gpu_->copy_into(y.value(), dst) : y.status();
  Result<std::shared_ptr<CapturedGraph>> graph = gpu_->end_capture();
  ASSERT_TRUE(copied.ok()) << copied.message();
  ASSERT_TRUE(graph.ok()) << graph.status().message();
  EXPECT_EQ(ran, eager_ran) << "the same path inside the capture";
  ASSERT_TRUE(gpu_->replay(*graph.value()).ok());
  Result<Tensor> a = gpu_->download(eager.value());
  Result<Tensor> b = gpu_->download(dst);
  ASSERT_TRUE(a.ok() && b.ok());
  const double err = relative_l2(b.value(), a.value());
  std::printf("  capture replay vs eager, key lengths (%s, %s ran): rel L2 %.3e\n",
              dtype_name(dtype()), path_name(ran), err);
  EXPECT_LE(err, 1e-6);
}

TEST_P(CudaSdpa, Timing) {
  // Not an assertion: ms per call and TFLOP/s (4 B H Tq Tk d / t) of both paths, B = 1.
  const int heads = 24;
  const int64_t d = 128;
  for (int64_t s : {int64_t{4224}, int64_t{8320}}) {
    for (bool masked : {true, false}) {
      std::vector<float> keep(static_cast<size_t>(s), 1.f);
      mask_text(&keep, s, 0, 48, 80);
      Tensor q = on_gpu(input({1, s, heads * d}, 2500, -2.f, 2.f));
      Tensor k = on_gpu(input({1, s, heads * d}, 2501, -2.f, 2.f));
      Tensor v = on_gpu(input({1, s, heads * d}, 2502));
      Tensor m = masked ? on_gpu(Tensor::from_floats({1, s}, keep)) : Tensor();
      for (Path path : {Path::kCudnn, Path::kOurs}) {
        ScopedEnv env("LATENT_CUDNN_SDPA", path == Path::kOurs ? "0" : nullptr);
        for (int i = 0; i < 3; ++i) ASSERT_TRUE(gpu_->attention(q, k, v, heads, m).ok());
        ASSERT_TRUE(gpu_->synchronize().ok());
        const cuda::SdpaCounters before = cuda::sdpa_counters();
        const int iters = 20;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) ASSERT_TRUE(gpu_->attention(q, k, v, heads, m).ok());
        ASSERT_TRUE(gpu_->synchronize().ok());
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count() /
            iters;
        const bool cudnn = cuda::sdpa_counters().cudnn > before.cudnn;
        const double flop = 4.0 * heads * static_cast<double>(s) * s * d;
        std::printf("  timing %-5s T=%-5lld %-7s requested %-5s ran %-5s %.3f ms %.0f TFLOP/s\n",
                    dtype_name(dtype()), static_cast<long long>(s), masked ? "mask" : "no mask",
                    path_name(path), cudnn ? "cudnn" : "ours", ms, flop / (ms * 1e-3) / 1e12);
      }
    }
  }
}

TEST_P(CudaSdpa, TimingKeyLengths) {
  // Not an assertion: B = 2 in the model's [image | text] order, text tails padded (valid 100
  // and 37 of 128): unmasked, the mask as bias, cuDNN's padding mask, our kernel with the mask.
  // TFLOP/s count every key (4 B H T T d / t), masked or not.
  const int heads = 24;
  const int64_t d = 128;
  for (int64_t image : {int64_t{4096}, int64_t{8192}}) {
    const int64_t s = image + 128;
    const std::vector<int64_t> lengths = {image + 100, image + 37};
    Tensor q = on_gpu(input({2, s, heads * d}, 2600, -2.f, 2.f));
    Tensor k = on_gpu(input({2, s, heads * d}, 2601, -2.f, 2.f));
    Tensor v = on_gpu(input({2, s, heads * d}, 2602));
    Tensor m = on_gpu(Tensor::from_floats({2, s}, prefix_mask(s, lengths)));
    struct Variant {
      const char* name;
      Path path;
      bool masked;
    };
    for (const Variant& x :
         {Variant{"no mask", Path::kCudnn, false}, Variant{"bias", Path::kCudnn, true},
          Variant{"padding", Path::kPadding, true}, Variant{"ours, mask", Path::kOurs, true}}) {
      const Tensor mask = x.masked ? m : Tensor();
      Path ran = Path::kOurs;
      for (int i = 0; i < 3; ++i)
        ASSERT_TRUE(run(x.path, q, k, v, heads, mask, &ran, lengths).ok());
      ASSERT_TRUE(gpu_->synchronize().ok());
      ScopedEnv env("LATENT_CUDNN_SDPA", x.path == Path::kOurs ? "0" : nullptr);
      const std::vector<int64_t> given =
          x.path == Path::kPadding ? lengths : std::vector<int64_t>{};
      const int iters = 20;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i)
        ASSERT_TRUE(gpu_->attention(q, k, v, heads, mask, given).ok());
      ASSERT_TRUE(gpu_->synchronize().ok());
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
          iters;
      const double flop = 4.0 * 2 * heads * static_cast<double>(s) * s * d;
      std::printf("  timing %-5s B=2 T=%-5lld %-10s ran %-7s %.3f ms %.0f TFLOP/s\n",
                  dtype_name(dtype()), static_cast<long long>(s), x.name, path_name(ran), ms,
                  flop / (ms * 1e-3) / 1e12);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaSdpa, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace latent

#endif  // LATENT_HAVE_CUDA
