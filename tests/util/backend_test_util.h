// Helpers of the backend op tests (test_cpu_ops, test_cpu_dit_ops): unwrapping results, the CPU
// backend per dtype, per-dtype tolerances and random arguments with their exact values.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/registry.h"
#include "tests/util/test_util.h"

namespace latent::test {

// The value of `r`, or an exception naming `what` (a test failure, not an abort).
template <typename T>
T must(Result<T> r, const char* what) {
  if (!r.ok()) throw std::runtime_error(str_cat(what, ": ", r.status().message()));
  return std::move(r).value();
}

inline std::shared_ptr<Backend> cpu(DType dtype) {
  return must(get_backend({"cpu", dtype_name(dtype)}), "get_backend");
}

// Relative L2 error allowed for an op whose output is rounded once to the storage dtype.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 1e-5;
    case DType::kBF16:
      return 1e-2;
    case DType::kF16:
      return 2e-3;
  }
  return 0;
}

// A backend tensor and the exact values it holds (after rounding to the storage dtype), which
// the references use so they measure the op's error only.
struct Arg {
  Tensor dev;
  std::vector<float> v;
  const float* p() const { return v.data(); }
};

inline Arg make_arg(Backend& be, const Shape& shape, uint64_t seed, float lo = -1.f,
                    float hi = 1.f) {
  Tensor dev = must(be.upload(random_tensor(shape, seed, lo, hi)), "upload");
  return {dev, must(be.download(dev), "download").to_floats()};
}

// ||got - want|| / ||want|| (the plain L2 norm of the difference when `want` is all zeros).
inline double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace latent::test
