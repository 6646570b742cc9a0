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
// And a timing print (not an assertion) of both paths at 4,224 and 8,320 tokens.
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

#include "engine/backends/registry.h"
#include "tests/util/test_util.h"
#ifdef LATENT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/sdpa.h"
#endif

namespace {

// Runs before gtest's main: no GPU or no cuDNN SDPA in this build, no test.
const bool kRunnable = [] {
  if (latent::cuda_device_count() == 0) {
    std::fprintf(stderr, "test_cuda_sdpa: no CUDA device, skipping (exit 77)\n");
    std::exit(77);
  }
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

std::shared_ptr<Backend> cuda_backend(DType dtype) {
  static std::map<DType, std::shared_ptr<Backend>> cache;
  auto it = cache.find(dtype);
  if (it != cache.end()) return it->second;
  setenv("LATENT_CUDA_POISON", "1", 1);
  Result<std::shared_ptr<Backend>> r = create_cuda_backend(0, dtype);
  if (!r.ok()) {
    ADD_FAILURE() << "create_cuda_backend(0, " << dtype_name(dtype)
                  << "): " << r.status().message();
    return nullptr;
  }
  cache[dtype] = r.value();
  return r.value();
}

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

enum class Path { kCudnn, kOurs };
const char* path_name(Path p) { return p == Path::kCudnn ? "cudnn" : "ours"; }

// One attention problem: q [b, t, heads * d]; k, v [b, s, heads * d]; keep: b * s flags or
// empty (no mask).
struct Problem {
  std::string name;
  int64_t b, t, s;
  int heads;
  int64_t d;
  std::vector<float> keep;
  bool cudnn_required;  // a DiT shape: the cuDNN path must have run
};

class CudaSdpa : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    unsetenv("LATENT_CUDNN_SDPA");
    unsetenv("LATENT_ATTENTION_KERNEL");
    if (device_major() < 8) GTEST_SKIP() << "cuDNN SDPA needs sm_80 or newer";
    gpu_ = cuda_backend(GetParam());
    ASSERT_TRUE(gpu_);
  }

  DType dtype() const { return GetParam(); }
  double tol() const { return dtype() == DType::kBF16 ? 1e-2 : 5e-3; }

  // Uniform [lo, hi) fp32 host tensor, rounded to the dtype under test.
  Tensor input(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) const {
    return random_tensor(shape, seed, lo, hi).to_dtype(dtype()).to_dtype(DType::kF32);
  }
  Tensor on_gpu(const Tensor& host) {
    if (!host.defined()) return Tensor();
    Result<Tensor> r = gpu_->upload(host);
    EXPECT_TRUE(r.ok()) << "upload " << host.describe() << ": " << r.status().message();
    return r.ok() ? r.value() : Tensor();
  }

  // Runs the op on one path; `ran` gets the path sdpa_counters() saw.
  Result<Tensor> run(Path path, const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                     const Tensor& m, Path* ran = nullptr) {
    ScopedEnv env("LATENT_CUDNN_SDPA", path == Path::kOurs ? "0" : nullptr);
    const cuda::SdpaCounters before = cuda::sdpa_counters();
    Result<Tensor> y = gpu_->attention(q, k, v, heads, m);
    const cuda::SdpaCounters after = cuda::sdpa_counters();
    if (ran) *ran = after.cudnn > before.cudnn ? Path::kCudnn : Path::kOurs;
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
    const std::vector<Row> rows = reference_rows(p, q, k, v);

    std::vector<float> outputs[2];
    for (Path path : {Path::kCudnn, Path::kOurs}) {
      const std::string name = p.name + " [" + path_name(path) + "]";
      Path ran = Path::kOurs;
      Result<Tensor> y = run(path, gq, gk, gv, p.heads, gm, &ran);
      ASSERT_TRUE(y.ok()) << name << ": " << y.status().message();
      if (path == Path::kOurs) {
        EXPECT_EQ(ran, Path::kOurs) << name << ": LATENT_CUDNN_SDPA=0";
      } else if (p.cudnn_required) {
        EXPECT_EQ(ran, Path::kCudnn)
            << name << ": cuDNN SDPA did not run (see the warning above; rerun with "
            << "CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr CUDNN_FRONTEND_LOG_INFO=1 "
            << "CUDNN_FRONTEND_LOG_FILE=stderr)";
      } else if (ran != Path::kCudnn) {
        std::printf("  %s: cuDNN has no engine for this shape, our kernel ran\n", name.c_str());
      }
      Result<Tensor> host = gpu_->download(y.value());
      ASSERT_TRUE(host.ok()) << name << ": " << host.status().message();
      ASSERT_EQ(host.value().numel(), p.b * p.t * ch) << name;
      const float* yp = host.value().data_as<float>();
      int64_t bad = 0;
      for (int64_t i = 0; i < host.value().numel(); ++i) bad += std::isfinite(yp[i]) ? 0 : 1;
      EXPECT_EQ(bad, 0) << name << ": outputs not finite (unwritten?)";
      double num = 0, den = 0;
      for (const Row& r : rows) {
        const float* yr = yp + (r.bi * p.t + r.qi) * ch + r.h * p.d;
        for (int64_t c = 0; c < p.d; ++c) {
          num += (yr[c] - r.out[c]) * (yr[c] - r.out[c]);
          den += r.out[c] * r.out[c];
        }
      }
      const double err = std::sqrt(num / std::max(den, 1e-30));
      std::printf("  %-60s %-5s ran %-5s vs f64 rel L2 %.3e (tol %.0e, %zu rows)\n",
                  name.c_str(), dtype_name(dtype()), path_name(ran), err, tol(), rows.size());
      EXPECT_LE(err, tol()) << name;
      outputs[path == Path::kCudnn ? 0 : 1].assign(yp, yp + host.value().numel());
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < outputs[0].size(); ++i) {
      const double e = static_cast<double>(outputs[0][i]) - outputs[1][i];
      num += e * e;
      den += static_cast<double>(outputs[1][i]) * outputs[1][i];
    }
    const double err = std::sqrt(num / std::max(den, 1e-30));
    std::printf("  %-60s %-5s cudnn vs ours, whole output rel L2 %.3e (tol %.0e)\n",
                p.name.c_str(), dtype_name(dtype()), err, 2 * tol());
    EXPECT_LE(err, 2 * tol()) << p.name << ": cuDNN and our kernel disagree";
  }

  struct Row {
    int64_t bi, qi;
    int h;
    std::vector<double> out;
  };
  // float64 attention for sampled rows.
  static std::vector<Row> reference_rows(const Problem& p, const Tensor& q, const Tensor& k,
                                         const Tensor& v) {
    const int64_t ch = p.heads * p.d, t = p.t, s = p.s, d = p.d;
    const float* qp = q.data_as<float>();
    const float* kp = k.data_as<float>();
    const float* vp = v.data_as<float>();
    std::vector<int64_t> queries;
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{127},
                      int64_t{128}, t / 2 + 3, t - 129, t - 64, t - 2, t - 1})
      if (i >= 0 && i < t && std::find(queries.begin(), queries.end(), i) == queries.end())
        queries.push_back(i);
    std::vector<int> hs = {0, p.heads / 2, p.heads - 1};
    hs.erase(std::unique(hs.begin(), hs.end()), hs.end());
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> w(static_cast<size_t>(s));
    std::vector<Row> rows;
    for (int64_t bi = 0; bi < p.b; ++bi)
      for (int h : hs)
        for (int64_t qi : queries) {
          Row r{bi, qi, h, std::vector<double>(static_cast<size_t>(d), 0.0)};
          const float* qr = qp + (bi * t + qi) * ch + h * d;
          double mx = -INFINITY;
          for (int64_t j = 0; j < s; ++j) {
            if (!p.keep.empty() && p.keep[static_cast<size_t>(bi * s + j)] == 0.f) {
              w[j] = -INFINITY;
              continue;
            }
            const float* kr = kp + (bi * s + j) * ch + h * d;
            double acc = 0;
            for (int64_t c = 0; c < d; ++c) acc += static_cast<double>(qr[c]) * kr[c];
            w[j] = acc * scale;
            mx = std::max(mx, w[j]);
          }
          double sum = 0;
          for (int64_t j = 0; j < s; ++j) {
            w[j] = w[j] == -INFINITY ? 0.0 : std::exp(w[j] - mx);
            sum += w[j];
          }
          for (int64_t j = 0; j < s; ++j) {
            if (w[j] == 0.0) continue;
            const float* vr = vp + (bi * s + j) * ch + h * d;
            for (int64_t c = 0; c < d; ++c) r.out[c] += w[j] / sum * vr[c];
          }
          rows.push_back(std::move(r));
        }
    return rows;
  }

  std::shared_ptr<Backend> gpu_;
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
  std::shared_ptr<Backend> gpu = cuda_backend(DType::kF32);
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

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaSdpa, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace latent

#endif  // LATENT_HAVE_CUDA
