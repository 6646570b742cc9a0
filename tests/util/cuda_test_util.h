// The harness of the CUDA op tests (tests/gpu/test_cuda_ops.cpp, test_cuda_dit_ops.cpp,
// test_cuda_sdpa.cpp): poisoned CUDA backends and the fp32 CPU reference, inputs rounded to the
// dtype under test, relative-L2 checks against the reference, and float64 attention references
// for sampled rows where a whole reference output would take minutes. Built with CUDA only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"

namespace latent::test {

// A fresh CUDA backend on device 0 (not the registry's shared one), one per dtype and attention
// choice for the process, created with LATENT_CUDA_POISON=1: every new device buffer starts as
// NaN, so an output element an op leaves unwritten fails. With `simple_attention`, created with
// LATENT_CUDA_ATTENTION=simple (the CUDA-core attention kernel even for bf16/fp16).
std::shared_ptr<Backend> poisoned_cuda_backend(DType dtype, bool simple_attention = false);
// The CPU backend in fp32: the reference.
std::shared_ptr<Backend> cpu_reference();

// How many elements of a host fp32 tensor are not finite (NaN poison: unwritten); the index of
// the first in *first (-1 if none).
int64_t count_non_finite(const Tensor& host, int64_t* first = nullptr);

// Downloads an op's output `y` from `gpu`, expecting `numel` elements, all finite. On a failure
// (reported with `name`) an undefined tensor, except for non-finite elements, which are reported
// and the tensor returned.
Tensor download_finite(Backend& gpu, const Tensor& y, int64_t numel, const std::string& name);

// Base fixture of the op tests, parameterised by the dtype under test: gpu_ (poisoned) against
// cpu_ (fp32).
class CudaOpTest : public ::testing::TestWithParam<DType> {
 protected:
  // How close() reports: names padded to `name_width` in its printed line; whether an error equal
  // to the tolerance passes; whether 4-D results must be NHWC (the VAE ops) rather than row-major.
  struct CloseStyle {
    int name_width = 58;
    bool tolerance_passes = false;
    bool nhwc_4d = true;
  };

  void SetUp() override;

  DType dtype() const { return GetParam(); }

  // Uniform [lo, hi) fp32 host tensor, rounded to the dtype under test.
  Tensor input(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) const;
  Tensor on_gpu(const Tensor& host);
  Tensor on_cpu(const Tensor& host);

  // Downloads both results and compares: same shape, every element finite, relative L2 within
  // `tolerance`. Prints one line with the error.
  ::testing::AssertionResult close(const std::string& what, const Result<Tensor>& got,
                                   const Result<Tensor>& want, double tolerance);

  std::shared_ptr<Backend> gpu_, cpu_;
  CloseStyle close_style_;
};

// ---- float64 attention for sampled rows --------------------------------------------------------

// One sampled output row of attention: query qi of batch row bi, head h.
struct AttentionRow {
  int64_t bi, qi;
  int h;
  std::vector<double> out;
};

// The queries of `candidates` within [0, t), each once, in order.
std::vector<int64_t> sample_queries(std::initializer_list<int64_t> candidates, int64_t t);
// Heads 0, heads / 2 and heads - 1, each once.
std::vector<int> sample_heads(int heads);

// DiT attention (engine/backends/backend.h) in float64 for every batch row, head of `heads_used`
// and query of `queries`: q [b, t, heads * d]; k, v [b, s, heads * d] (host fp32); keep: b * s
// flags or empty (no mask). A row without keys is zero.
std::vector<AttentionRow> attention_rows(const Tensor& q, const Tensor& k, const Tensor& v,
                                         int heads, const std::vector<float>& keep,
                                         const std::vector<int>& heads_used,
                                         const std::vector<int64_t>& queries);

// Relative L2 error of an output at the sampled rows; `at(row, e)` reads element e of the row.
double rows_rel_l2(const std::vector<AttentionRow>& rows,
                   const std::function<double(const AttentionRow&, int64_t)>& at);
// The same for a DiT attention output y [b, t, heads * d] (host).
double rows_rel_l2(const std::vector<AttentionRow>& rows, const Tensor& y);

}  // namespace latent::test
