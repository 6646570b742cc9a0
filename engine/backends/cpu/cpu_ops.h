// Internal kernels of the CPU backend, one op family per file:
//   conv2d.cpp       convolution on oneDNN (fused bias, residual sum and activation)
//   norm.cpp         group norm, channel RMS norm
//   elementwise.cpp  activations, add, affine, channel affine, clamp, upsample, slice
//   attention.cpp    blocked spatial self-attention on oneDNN sgemm + softmax
// Kernels take contiguous fp32 host tensors whose shapes the dispatch in cpu_backend.cpp has
// already checked, and return fp32 tensors (upsample and slice work on any element size).
// oneDNN exceptions are caught here and reported as a Status naming the op.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "engine/backends/backend.h"

namespace latent::cpu {

// The one oneDNN engine of a backend and the primitives built for it, keyed by op and shape so
// repeated calls at the same shapes do not rebuild them. Primitives are created with a user
// scratchpad, so one primitive may run on several threads at once.
class DnnlContext {
 public:
  DnnlContext() : engine_(dnnl::engine::kind::cpu, 0) {}

  const dnnl::engine& engine() const { return engine_; }

  // The object cached under `key`, built by `build` on first use. `key` must start with the
  // op's name so different ops never share an entry type.
  template <typename T>
  std::shared_ptr<T> cached(const std::string& key,
                            const std::function<std::shared_ptr<T>()>& build) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return std::static_pointer_cast<T>(it->second);
    // A long-running process sees a bounded set of shapes; dropping everything now and then
    // keeps a pathological caller (a new shape every call) from growing memory forever.
    if (cache_.size() >= kMaxEntries) cache_.clear();
    std::shared_ptr<T> value = build();
    cache_.emplace(key, value);
    return value;
  }

 private:
  static constexpr size_t kMaxEntries = 512;
  dnnl::engine engine_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<void>> cache_;
};

// Runs `p` on a fresh stream (cheap on the CPU; a stream per call keeps concurrent callers
// apart) with a scratchpad of the size `pd` asks for.
void execute(DnnlContext& ctx, const dnnl::primitive& p, const dnnl::primitive_desc_base& pd,
             std::unordered_map<int, dnnl::memory> args);

// Elements a thread should at least get before splitting a loop is worth it.
constexpr int64_t kGrain = 1 << 15;

// Runs an op body, turning an exception (out of memory, a oneDNN error that slipped through)
// into an error Status so no user input can abort the process.
template <typename F>
Result<Tensor> guarded(const char* op, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Status::errorf(op, ": out of memory");
  } catch (const std::exception& e) {
    return Status::errorf(op, ": ", e.what());
  }
}

// dst = alg(src) over n floats on oneDNN's eltwise primitive, cached under `key` (which names
// the op, the activation and n). Throws dnnl::error.
void run_eltwise(DnnlContext& ctx, const std::string& key, dnnl::algorithm alg, float alpha,
                 const float* src, float* dst, int64_t n);

// Row softmax over a [rows, cols] fp32 matrix, cached under key_prefix + shape.
struct SoftmaxPlan {
  dnnl::softmax_forward::primitive_desc pd;
  dnnl::softmax_forward prim;
};
std::shared_ptr<SoftmaxPlan> softmax_plan(DnnlContext& ctx, const char* key_prefix, int64_t rows,
                                          int64_t cols);

// Whether `act` maps to a oneDNN eltwise algorithm (kNone does not).
bool eltwise_algorithm(Activation act, dnnl::algorithm* alg, float* alpha);
const char* activation_name(Activation act);

// --- conv2d.cpp ---------------------------------------------------------------------------
// x: [N, Cin, H, W], w: [Cout, Cin, kh, kw], bias: [Cout] or undefined,
// residual: [N, Cout, Ho, Wo] or undefined -> act(conv + bias + residual): [N, Cout, Ho, Wo].
Result<Tensor> conv2d(DnnlContext& ctx, const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Conv2dParams& p, const Tensor& residual, Activation act);

// --- norm.cpp -----------------------------------------------------------------------------
// gamma/beta: C floats or nullptr.
Result<Tensor> group_norm(DnnlContext& ctx, const Tensor& x, int groups, const float* gamma,
                          const float* beta, float eps, Activation act);
Result<Tensor> rms_norm_channels(DnnlContext& ctx, const Tensor& x, const float* gamma,
                                 const float* beta, Activation act);

// --- elementwise.cpp ----------------------------------------------------------------------
// dst[i] = act(src[i]) for i < n; src == dst works in place. kNone copies (or does nothing).
Status activation(DnnlContext& ctx, const float* src, float* dst, int64_t n, Activation act);
Tensor add(const Tensor& a, const Tensor& b);
Tensor affine(const Tensor& x, float scale, float shift);
// x: [N, C, H, W]; scale, shift: C floats.
Tensor channel_affine(const Tensor& x, const float* scale, const float* shift);
Tensor clamp(const Tensor& x, float lo, float hi);
// Any element type: [N, C, H, W] -> [N, C, 2H, 2W].
Tensor upsample_nearest2x(const Tensor& x);
// z [N, 4C, H + 1, W + 1] -> y [N, C, 2H, 2W], y[n, c, 2i + a, 2j + b] = z[n, (2a + b)C + c, i + a,
// j + b] (Backend::interleave_phases2x); any dtype, elements moved unchanged.
Tensor interleave_phases2x(const Tensor& z);
// Any element type: channels [start, start + count) of [N, C, H, W].
Tensor slice_channels(const Tensor& x, int64_t start, int64_t count);
// Any element type: [1, C, T, H, W] <-> [T, C, H, W] (a clip and its frames; the same
// transposition of the C and T planes both ways).
Tensor swap_clip_planes(const Tensor& x, const Shape& out_shape);
// Parallel dtype conversion of a whole tensor (a copy, also when the dtype matches).
Tensor convert(const Tensor& x, DType dtype);

// --- attention.cpp ------------------------------------------------------------------------
// q, k, v: [N, C, H, W], C % heads == 0 -> [N, C, H, W].
Result<Tensor> spatial_attention(DnnlContext& ctx, const Tensor& q, const Tensor& k,
                                 const Tensor& v, int heads);

}  // namespace latent::cpu
