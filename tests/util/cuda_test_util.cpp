#include "tests/util/cuda_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/registry.h"
#include "tests/util/test_util.h"

namespace latent::test {

std::shared_ptr<Backend> poisoned_cuda_backend(DType dtype, bool simple_attention) {
  static std::map<std::pair<DType, bool>, std::shared_ptr<Backend>> cache;
  auto key = std::make_pair(dtype, simple_attention);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  setenv("LATENT_CUDA_POISON", "1", 1);
  if (simple_attention)
    setenv("LATENT_CUDA_ATTENTION", "simple", 1);
  else
    unsetenv("LATENT_CUDA_ATTENTION");
  Result<std::shared_ptr<Backend>> r = create_cuda_backend(0, dtype);
  unsetenv("LATENT_CUDA_ATTENTION");
  if (!r.ok()) {
    ADD_FAILURE() << "create_cuda_backend(0, " << dtype_name(dtype)
                  << "): " << r.status().message();
    return nullptr;
  }
  cache[key] = r.value();
  return r.value();
}

std::shared_ptr<Backend> cpu_reference() {
  BackendOptions o;
  o.device = "cpu";
  o.dtype = "fp32";
  Result<std::shared_ptr<Backend>> r = get_backend(o);
  if (!r.ok()) {
    ADD_FAILURE() << "cpu backend: " << r.status().message();
    return nullptr;
  }
  return r.value();
}

int64_t count_non_finite(const Tensor& host, int64_t* first) {
  const float* p = host.data_as<float>();
  int64_t bad = 0;
  if (first) *first = -1;
  for (int64_t i = 0; i < host.numel(); ++i)
    if (!std::isfinite(p[i])) {
      if (first && *first < 0) *first = i;
      ++bad;
    }
  return bad;
}

Tensor download_finite(Backend& gpu, const Tensor& y, int64_t numel, const std::string& name) {
  Result<Tensor> host = gpu.download(y);
  if (!host.ok()) {
    ADD_FAILURE() << name << ": " << host.status().message();
    return Tensor();
  }
  if (host.value().numel() != numel) {
    ADD_FAILURE() << name << ": " << host.value().numel() << " elements, expected " << numel;
    return Tensor();
  }
  EXPECT_EQ(count_non_finite(host.value()), 0) << name << ": outputs not finite (unwritten?)";
  return host.value();
}

void CudaOpTest::SetUp() {
  gpu_ = poisoned_cuda_backend(GetParam());
  cpu_ = cpu_reference();
  ASSERT_TRUE(gpu_ && cpu_);
}

Tensor CudaOpTest::input(const Shape& shape, uint64_t seed, float lo, float hi) const {
  Tensor t = random_tensor(shape, seed, lo, hi);
  return dtype() == DType::kF32 ? t : t.to_dtype(dtype()).to_dtype(DType::kF32);
}

Tensor CudaOpTest::on_gpu(const Tensor& host) {
  if (!host.defined()) return Tensor();
  Result<Tensor> r = gpu_->upload(host);
  EXPECT_TRUE(r.ok()) << "upload " << host.describe() << ": " << r.status().message();
  return r.ok() ? r.value() : Tensor();
}

Tensor CudaOpTest::on_cpu(const Tensor& host) {
  if (!host.defined()) return Tensor();
  Result<Tensor> r = cpu_->upload(host);
  EXPECT_TRUE(r.ok()) << "cpu upload " << host.describe() << ": " << r.status().message();
  return r.ok() ? r.value() : Tensor();
}

::testing::AssertionResult CudaOpTest::close(const std::string& what, const Result<Tensor>& got,
                                             const Result<Tensor>& want, double tolerance) {
  if (!got.ok())
    return ::testing::AssertionFailure() << what << ": cuda: " << got.status().message();
  if (!want.ok())
    return ::testing::AssertionFailure() << what << ": cpu: " << want.status().message();
  const bool nhwc = close_style_.nhwc_4d && got.value().rank() == 4;
  if (got.value().layout() != (nhwc ? Layout::kNHWC : Layout::kContiguous))
    return ::testing::AssertionFailure()
           << what << ": unexpected layout of " << got.value().describe();
  Result<Tensor> g = gpu_->download(got.value());
  if (!g.ok())
    return ::testing::AssertionFailure() << what << ": download: " << g.status().message();
  Result<Tensor> w = cpu_->download(want.value());
  if (!w.ok())
    return ::testing::AssertionFailure() << what << ": cpu download: " << w.status().message();
  if (g.value().shape() != w.value().shape())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(g.value().shape())
                                         << " != reference " << shape_str(w.value().shape());
  int64_t first_bad = -1;
  if (const int64_t bad = count_non_finite(g.value(), &first_bad))
    return ::testing::AssertionFailure()
           << what << ": " << bad << " of " << g.value().numel()
           << " outputs are not finite (unwritten?), first at " << first_bad;
  const double err = relative_l2(g.value(), w.value());
  std::printf("  %-*s %-5s rel L2 %.3e (tol %.0e)\n", close_style_.name_width, what.c_str(),
              dtype_name(dtype()), err, tolerance);
  if (close_style_.tolerance_passes ? !(err <= tolerance) : !(err < tolerance))
    return ::testing::AssertionFailure()
           << what << ": relative L2 error " << err
           << (close_style_.tolerance_passes ? " > " : " >= ") << tolerance;
  return ::testing::AssertionSuccess();
}

std::vector<int64_t> sample_queries(std::initializer_list<int64_t> candidates, int64_t t) {
  std::vector<int64_t> queries;
  for (int64_t i : candidates)
    if (i >= 0 && i < t && std::find(queries.begin(), queries.end(), i) == queries.end())
      queries.push_back(i);
  return queries;
}

std::vector<int> sample_heads(int heads) {
  std::vector<int> hs = {0, heads / 2, heads - 1};
  hs.erase(std::unique(hs.begin(), hs.end()), hs.end());
  return hs;
}

std::vector<AttentionRow> attention_rows(const Tensor& q, const Tensor& k, const Tensor& v,
                                         int heads, const std::vector<float>& keep,
                                         const std::vector<int>& heads_used,
                                         const std::vector<int64_t>& queries) {
  const int64_t b = q.shape()[0], t = q.shape()[1], ch = q.shape()[2], s = k.shape()[1];
  const int64_t d = ch / heads;
  const float* qp = q.data_as<float>();
  const float* kp = k.data_as<float>();
  const float* vp = v.data_as<float>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> p(static_cast<size_t>(s));
  std::vector<AttentionRow> rows;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int h : heads_used)
      for (int64_t qi : queries) {
        AttentionRow r{bi, qi, h, std::vector<double>(static_cast<size_t>(d), 0.0)};
        const float* qr = qp + (bi * t + qi) * ch + h * d;
        double mx = -INFINITY;
        for (int64_t j = 0; j < s; ++j) {
          if (!keep.empty() && keep[static_cast<size_t>(bi * s + j)] == 0.f) {
            p[j] = -INFINITY;
            continue;
          }
          const float* kr = kp + (bi * s + j) * ch + h * d;
          double acc = 0;
          for (int64_t c = 0; c < d; ++c) acc += static_cast<double>(qr[c]) * kr[c];
          p[j] = acc * scale;
          mx = std::max(mx, p[j]);
        }
        if (mx != -INFINITY) {  // a row without keys stays zero
          double sum = 0;
          for (int64_t j = 0; j < s; ++j) {
            p[j] = p[j] == -INFINITY ? 0.0 : std::exp(p[j] - mx);
            sum += p[j];
          }
          for (int64_t j = 0; j < s; ++j) {
            if (p[j] == 0.0) continue;
            const float* vr = vp + (bi * s + j) * ch + h * d;
            for (int64_t c = 0; c < d; ++c) r.out[c] += p[j] / sum * vr[c];
          }
        }
        rows.push_back(std::move(r));
      }
  return rows;
}

double rows_rel_l2(const std::vector<AttentionRow>& rows,
                   const std::function<double(const AttentionRow&, int64_t)>& at) {
  double num = 0, den = 0;
  for (const AttentionRow& r : rows)
    for (size_t e = 0; e < r.out.size(); ++e) {
      const double g = at(r, static_cast<int64_t>(e));
      num += (g - r.out[e]) * (g - r.out[e]);
      den += r.out[e] * r.out[e];
    }
  return std::sqrt(num / std::max(den, 1e-30));
}

double rows_rel_l2(const std::vector<AttentionRow>& rows, const Tensor& y) {
  const int64_t t = y.shape()[1], ch = y.shape()[2];
  const float* yp = y.data_as<float>();
  return rows_rel_l2(rows, [&](const AttentionRow& r, int64_t e) {
    const int64_t d = static_cast<int64_t>(r.out.size());
    return static_cast<double>(yp[(r.bi * t + r.qi) * ch + r.h * d + e]);
  });
}

}  // namespace latent::test
