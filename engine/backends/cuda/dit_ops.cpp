// Checks and dispatch of the CUDA backend's DiT ops (see dit_ops.h). The checks mirror the CPU
// backend's (engine/backends/cpu/dit_ops.cpp), so both reject the same inputs with the same
// words, except that the CUDA attention cannot look at the key mask's values (see dit_ops.h).
#include "engine/backends/cuda/dit_ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/convert.cuh"
#include "engine/backends/cuda/fp8_quant.cuh"
#include "engine/backends/cuda/sdpa.h"
#include "engine/backends/frames.h"

namespace latent::cuda {
namespace {

// A row-major tensor: contiguous, or a 4-D NHWC one whose layout agrees with row-major (one
// channel or one pixel).
bool row_major(const Tensor& t) {
  if (t.layout() == Layout::kContiguous) return true;
  return t.rank() == 4 && (t.dim(1) == 1 || t.dim(2) * t.dim(3) == 1);
}

// A tensor of this device in `dtype`, row-major, with all its bytes in its storage, of rank
// `rank` (-1: any, >= 1) with no empty dim. `form` names the expected shape in messages.
Status check(const DitEnv& env, const char* what, const Tensor& t, DType dtype, int rank,
             const char* form) {
  if (!t.defined()) return Status::errorf(what, " is undefined");
  if (t.device() != env.device)
    return Status::errorf(what, " ", t.describe(), " is not on ", env.name,
                          t.device().is_cpu() ? " (upload() it first)" : "");
  if (t.dtype() != dtype)
    return Status::errorf(what, " ", t.describe(), " is not in ", dtype_name(dtype));
  if (!row_major(t))
    return Status::errorf(what, " ", t.describe(),
                          " is in the NHWC layout; DiT ops take row-major tensors");
  if (t.byte_offset() + t.nbytes() > t.storage()->bytes())
    return Status::errorf(what, " ", t.describe(), " needs ", t.nbytes(), " bytes at offset ",
                          t.byte_offset(), " but its storage holds ", t.storage()->bytes());
  if (t.rank() == 0 || (rank >= 0 && t.rank() != rank))
    return Status::errorf(what, " must be ", form, ", got ", shape_str(t.shape()));
  for (int64_t d : t.shape())
    if (d <= 0) return Status::errorf(what, " ", shape_str(t.shape()), " has an empty dimension");
  return ok_status();
}

Status check_vector(const DitEnv& env, const char* what, const Tensor& t, int64_t n,
                    const Tensor& x) {
  if (!t.defined()) return ok_status();
  LATENT_TRY(check(env, what, t, env.dtype, -1, "a vector"));
  if (t.numel() != n)
    return Status::errorf(what, " ", shape_str(t.shape()), " should have ", n,
                          " elements for input ", shape_str(x.shape()));
  return ok_status();
}

Status check_groups(const std::vector<int64_t>& starts, int64_t tokens, DitGroups* groups) {
  if (starts.empty() || starts[0] != 0) return Status::error("token groups must start at token 0");
  for (size_t g = 1; g < starts.size(); ++g)
    if (starts[g] <= starts[g - 1] || starts[g] >= tokens)
      return Status::errorf("token group starts must increase and stay below the ", tokens,
                            " tokens (group ", g, " starts at ", starts[g], ")");
  if (starts.size() > static_cast<size_t>(kMaxDitGroups))
    return Status::errorf(starts.size(), " token groups; the CUDA kernels take at most ",
                          kMaxDitGroups);
  groups->count = static_cast<int>(starts.size());
  for (size_t g = 0; g < starts.size(); ++g) groups->starts[g] = starts[g];
  return ok_status();
}

// A conditioning tensor for G groups of a [B, T, D] input: G * B rows of D.
Status check_conditioning(const DitEnv& env, const char* what, const Tensor& c, const Tensor& x,
                          size_t groups) {
  LATENT_TRY(check(env, what, c, env.dtype, -1, "[G, B, D] or [G * B, D]"));
  const int64_t want = static_cast<int64_t>(groups) * x.dim(0) * x.dim(2);
  if (c.dim(-1) != x.dim(2) || c.numel() != want)
    return Status::errorf(what, " ", shape_str(c.shape()), " should hold ", groups, " group(s) x ",
                          x.dim(0), " batch rows x ", x.dim(2), " features for input ",
                          shape_str(x.shape()));
  return ok_status();
}

Status check_eps(float eps) {
  if (!(eps >= 0.f) || !std::isfinite(eps)) return Status::errorf("invalid eps ", eps);
  return ok_status();
}

Status check_act(DitActivation act) {
  if (static_cast<int>(act) > static_cast<int>(DitActivation::kGELUTanh))
    return Status::errorf("unknown activation ", static_cast<int>(act));
  return ok_status();
}

Status resolve_dim(int* dim, const Tensor& x) {
  const int d = *dim < 0 ? *dim + x.rank() : *dim;
  if (d < 0 || d >= x.rank())
    return Status::errorf("dim ", *dim, " is out of range for ", shape_str(x.shape()));
  *dim = d;
  return ok_status();
}

Result<Tensor> empty(DitEnv& env, const Shape& shape, DType dtype) {
  return env.ctx->empty(shape, dtype, Layout::kContiguous);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int64_t rows_of(const Tensor& x) { return x.numel() / x.dim(-1); }

const void* data_or_null(const Tensor& t) { return t.defined() ? t.data() : nullptr; }

}  // namespace

Status check_host_tensor(const Tensor& host) {
  if (!host.defined()) return Status::error("tensor is undefined");
  if (!host.device().is_cpu() || host.layout() != Layout::kContiguous)
    return Status::errorf(host.describe(), " is not a contiguous host tensor");
  if (host.byte_offset() + host.nbytes() > host.storage()->bytes())
    return Status::errorf(host.describe(), " needs ", host.nbytes(), " bytes at offset ",
                          host.byte_offset(), " but its storage holds ", host.storage()->bytes());
  for (int64_t d : host.shape())
    if (d < 0) return Status::errorf(host.describe(), " has a negative dimension");
  return ok_status();
}

Result<Tensor> dit_upload_fp32(DitEnv& env, const Tensor& host) {
  LATENT_TRY(check_host_tensor(host));
  LATENT_ASSIGN_OR_RETURN(Tensor out, empty(env, host.shape(), DType::kF32));
  if (host.numel() == 0) return out;
  cudaStream_t stream = env.ctx->stream();
  count_host_to_device(host.nbytes());  // transfer_counts() (frames.h) sees every upload
  if (host.dtype() == DType::kF32) {
    LATENT_CUDA_CHECK(
        cudaMemcpyAsync(out.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream));
    return out;
  }
  TempBuffer staging;
  LATENT_TRY(staging.allocate(*env.ctx, host.nbytes()));
  LATENT_CUDA_CHECK(
      cudaMemcpyAsync(staging.get(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream));
  LATENT_TRY(launch_convert(staging.get(), host.dtype(), out.data(), DType::kF32, host.numel(),
                            env.launch));
  return out;
}

namespace {

// act(x[..., :K] w^T + bias), K = w.dim(1) <= x.dim(-1) (x's rows read at their pitch), into the
// first N columns of y [..., N + extra] (dit_linear: K = x.dim(-1), extra = 0). Checks all but
// how K relates to x (the callers').
Result<Tensor> linear_rows(DitEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
                           DitActivation act, int64_t extra) {
  LATENT_TRY(check_vector(env, "bias", bias, w.dim(0), w));
  LATENT_TRY(check_act(act));
  const int64_t m = rows_of(x), n = w.dim(0), k = w.dim(1), ldx = x.dim(-1), ldy = n + extra;
  const int64_t big = std::numeric_limits<int32_t>::max();
  if (m > big || ldy > big || ldx > big)
    return Status::errorf("x ", shape_str(x.shape()), " . w^T ", shape_str(w.shape()),
                          " is too large for cuBLASLt");
  Shape out_shape = x.shape();
  out_shape.back() = ldy;
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, out_shape, env.dtype));
  // Bias and tanh-GELU go into cuBLASLt's epilogue; SiLU (no such epilogue) and a bias that is
  // not 16-byte aligned (a view at an odd offset) take one more pass over the product, after
  // which the GELU has to wait too. That pass runs on y itself when its rows are contiguous,
  // else on a contiguous product whose rows are then copied into y's.
  const bool fuse_bias = bias.defined() && aligned16(bias.data());
  const bool fuse_gelu = act == DitActivation::kGELUTanh && (!bias.defined() || fuse_bias);
  const bool bias_left = bias.defined() && !fuse_bias;
  const bool act_left =
      act == DitActivation::kSiLU || (act == DitActivation::kGELUTanh && !fuse_gelu);
  const bool apart = (bias_left || act_left) && extra > 0;
  Tensor out = y;
  if (apart) {
    LATENT_ASSIGN_OR_RETURN(out, empty(env, {m, n}, env.dtype));
  }
  LATENT_TRY(env.linear->run(*env.ctx, x.data(), w.data(), fuse_bias ? bias.data() : nullptr,
                             out.data(), m, n, k, env.dtype, fuse_gelu, nullptr, ldx,
                             apart ? n : ldy));
  if (!bias_left && !act_left) return y;
  LATENT_TRY(launch_dit_bias_act(out.data(), bias_left ? bias.data() : nullptr, out.data(), m * n,
                                 n, act_left ? act : DitActivation::kNone, env.dtype, env.launch));
  if (apart) {
    const size_t es = dtype_size(env.dtype);
    LATENT_CUDA_CHECK(cudaMemcpy2DAsync(y.data(), static_cast<size_t>(ldy) * es, out.data(),
                                        static_cast<size_t>(n) * es, static_cast<size_t>(n) * es,
                                        static_cast<size_t>(m), cudaMemcpyDeviceToDevice,
                                        env.ctx->stream()));
  }
  return y;
}

}  // namespace

Result<Tensor> dit_linear(DitEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
                          DitActivation act) {
  LATENT_TRY(check(env, "input x", x, env.dtype, -1, "[..., K]"));
  LATENT_TRY(check(env, "weight w", w, env.dtype, 2, "[N, K]"));
  if (w.dim(1) != x.dim(-1))
    return Status::errorf("weight w ", shape_str(w.shape()), " expects ", w.dim(1),
                          " input features but x is ", shape_str(x.shape()));
  return linear_rows(env, x, w, bias, act, 0);
}

Result<Tensor> dit_linear_add(DitEnv& env, const Tensor& x, const Tensor& w,
                              const Tensor& residual, DitActivation act) {
  LATENT_TRY(check(env, "input x", x, env.dtype, -1, "[..., K]"));
  LATENT_TRY(check(env, "weight w", w, env.dtype, 2, "[N, K]"));
  if (w.dim(1) != x.dim(-1))
    return Status::errorf("weight w ", shape_str(w.shape()), " expects ", w.dim(1),
                          " input features but x is ", shape_str(x.shape()));
  LATENT_TRY(check_act(act));
  Shape out_shape = x.shape();
  out_shape.back() = w.dim(0);
  LATENT_TRY(check(env, "residual", residual, env.dtype, -1, "[..., N]"));
  if (residual.shape() != out_shape)
    return Status::errorf("residual ", shape_str(residual.shape()), " does not match the output ",
                          shape_str(out_shape));
  const int64_t m = rows_of(x), n = w.dim(0), k = w.dim(1);
  const int64_t big = std::numeric_limits<int32_t>::max();
  if (m > big || n > big || k > big)
    return Status::errorf("x ", shape_str(x.shape()), " . w^T ", shape_str(w.shape()),
                          " is too large for cuBLASLt");
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, out_shape, env.dtype));
  const bool gelu = act == DitActivation::kGELUTanh;
  LATENT_TRY(env.linear->run(*env.ctx, x.data(), w.data(), nullptr, y.data(), m, n, k, env.dtype,
                             gelu, residual.data()));
  if (act == DitActivation::kSiLU)
    LATENT_TRY(launch_dit_bias_act(y.data(), nullptr, y.data(), y.numel(), n, act, env.dtype,
                                   env.launch));
  return y;
}

Result<Tensor> dit_linear_wide(DitEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
                               DitActivation act, int64_t extra) {
  LATENT_TRY(check(env, "input x", x, env.dtype, -1, "[..., K]"));
  LATENT_TRY(check(env, "weight w", w, env.dtype, 2, "[N, K]"));
  if (w.dim(1) > x.dim(-1))
    return Status::errorf("linear_wide: weight w ", shape_str(w.shape()), " reads ", w.dim(1),
                          " input features but x ", shape_str(x.shape()), " has ", x.dim(-1));
  if (extra < 0) return Status::errorf("linear_wide: ", extra, " extra columns asked for");
  return linear_rows(env, x, w, bias, act, extra);
}

Result<Tensor> dit_linear_into_columns(DitEnv& env, const Tensor& x, const Tensor& w,
                                       int64_t column) {
  LATENT_TRY(check(env, "input x", x, env.dtype, -1, "[..., C]"));
  LATENT_TRY(check(env, "weight w", w, env.dtype, 2, "[N, K]"));
  const int64_t m = rows_of(x), n = w.dim(0), k = w.dim(1), ld = x.dim(-1);
  if (k > column || column + n > ld)
    return Status::errorf("linear_into_columns: weight w ", shape_str(w.shape()),
                          " [N, K] must read columns before ", column, " and write [", column, ", ",
                          column + n, ") inside the ", ld, " columns of x ", shape_str(x.shape()));
  const int64_t big = std::numeric_limits<int32_t>::max();
  if (m > big || ld > big)
    return Status::errorf("x ", shape_str(x.shape()), " is too large for cuBLASLt");
  char* base = static_cast<char*>(x.data());
  LATENT_TRY(env.linear->run(*env.ctx, base, w.data(), nullptr,
                             base + column * static_cast<int64_t>(dtype_size(env.dtype)), m, n, k,
                             env.dtype, false, nullptr, ld, ld));
  return x;
}

Result<Fp8Matrix> dit_fp8_quantize_rows(DitEnv& env, const Tensor& x) {
  LATENT_TRY(check(env, "input x", x, env.dtype, -1, "[..., K]"));
  const int64_t k = x.dim(-1), rows = rows_of(x);
  if (k % 16 != 0)
    return Status::errorf("fp8 rows: x ", shape_str(x.shape()), " has ", k,
                          " columns; FP8 matrix multiplication needs a multiple of 16");
  Fp8Matrix q;
  q.shape = x.shape();
  LATENT_ASSIGN_OR_RETURN(q.codes, empty(env, {rows, k / 2}, DType::kBF16));  // k bytes a row
  LATENT_ASSIGN_OR_RETURN(q.scales, empty(env, {rows}, DType::kF32));
  LATENT_TRY(launch_fp8_quantize_rows(x.data(), env.dtype, rows, k,
                                      static_cast<uint8_t*>(q.codes.data()),
                                      static_cast<float*>(q.scales.data()), env.launch));
  return q;
}

namespace {

// dit_linear_fp8's operands: both quantised on this device, w [N, K] with x's K, bias [N].
Status check_linear_fp8(DitEnv& env, const Fp8Matrix& x, const Fp8Matrix& w, const Tensor& bias) {
  for (const Fp8Matrix* m : {&x, &w}) {
    const char* what = m == &x ? "input x" : "weight w";
    if (!m->defined() || !m->codes.defined() || !m->scales.defined())
      return Status::errorf("linear_fp8: ", what, " was not quantised by ", env.name);
    if (m->codes.device() != env.device || m->scales.device() != env.device)
      return Status::errorf("linear_fp8: ", what, " is not on ", env.name);
    if (m->codes.nbytes() != static_cast<size_t>(m->rows() * m->cols()) ||
        m->scales.numel() != m->rows())
      return Status::errorf("linear_fp8: ", what, " ", shape_str(m->shape),
                            " does not match its codes / scales");
  }
  if (w.shape.size() != 2)
    return Status::errorf("linear_fp8: weight w must be [N, K], got ", shape_str(w.shape));
  if (w.cols() != x.cols())
    return Status::errorf("weight w ", shape_str(w.shape), " expects ", w.cols(),
                          " input features but x is ", shape_str(x.shape));
  if (bias.defined()) {
    LATENT_TRY(check(env, "bias", bias, env.dtype, -1, "a vector"));
    if (bias.numel() != w.rows())
      return Status::errorf("bias ", shape_str(bias.shape()), " should have ", w.rows(),
                            " elements for weight ", shape_str(w.shape));
  }
  return ok_status();
}

// One FP8 GEMM of x [M, K] and w [N, K] into `out` (M rows of N): act(x w^T + bias), plus
// `accumulate` (cuBLASLt's C) where given, with w's row scales or `w_scales` in their place (the
// gated add's). Bias and GELU run in cuBLASLt's epilogue where it has a kernel for them (and the
// bias is 16-byte aligned), else in a pass after, as does SiLU.
Status run_fp8_into(DitEnv& env, const Fp8Matrix& x, const Fp8Matrix& w, const float* w_scales,
                    const Tensor& bias, void* out, DitActivation act,
                    const void* accumulate = nullptr) {
  const int64_t m = x.rows(), n = w.rows(), k = w.cols();
  const bool fuse_bias = !bias.defined() || aligned16(bias.data());
  const bool gelu = act == DitActivation::kGELUTanh;
  bool fused = false;
  LATENT_TRY(env.linear->run_fp8(*env.ctx, x.codes.data(),
                                 static_cast<const float*>(x.scales.data()), w.codes.data(),
                                 w_scales ? w_scales : static_cast<const float*>(w.scales.data()),
                                 fuse_bias && bias.defined() ? bias.data() : nullptr, out, m, n, k,
                                 env.dtype, gelu && fuse_bias, &fused, accumulate));
  const bool bias_left = bias.defined() && !(fuse_bias && fused);
  const bool act_left = act == DitActivation::kSiLU || (gelu && !(fuse_bias && fused));
  if (bias_left || act_left)
    LATENT_TRY(launch_dit_bias_act(out, bias_left ? bias.data() : nullptr, out, m * n, n,
                                   act_left ? act : DitActivation::kNone, env.dtype, env.launch));
  return ok_status();
}

}  // namespace

Result<Tensor> dit_linear_fp8(DitEnv& env, const Fp8Matrix& x, const Fp8Matrix& w,
                              const Tensor& bias, DitActivation act) {
  LATENT_TRY(check_linear_fp8(env, x, w, bias));
  LATENT_TRY(check_act(act));
  const int64_t m = x.rows(), n = w.rows(), k = w.cols();
  const int64_t big = std::numeric_limits<int32_t>::max();
  if (m > big || n > big || k > big)
    return Status::errorf("x ", shape_str(x.shape), " . w^T ", shape_str(w.shape),
                          " is too large for cuBLASLt");
  Shape out_shape = x.shape;
  out_shape.back() = n;
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, out_shape, env.dtype));
  LATENT_TRY(run_fp8_into(env, x, w, nullptr, bias, y.data(), act));
  return y;
}

Result<Tensor> dit_linear_fp8_joined(DitEnv& env, const Fp8Matrix& x_a, const Fp8Matrix& w_a,
                                     const Tensor& b_a, const Fp8Matrix& x_b, const Fp8Matrix& w_b,
                                     const Tensor& b_b) {
  LATENT_TRY(check_linear_fp8(env, x_a, w_a, b_a));
  LATENT_TRY(check_linear_fp8(env, x_b, w_b, b_b));
  if (x_a.shape.size() != 3 || x_b.shape.size() != 3 || x_a.shape[0] != 1 || x_b.shape[0] != 1)
    return Status::errorf("linear_fp8_joined: inputs ", shape_str(x_a.shape), " and ",
                          shape_str(x_b.shape), " are not [1, T, K] each");
  if (w_a.rows() != w_b.rows())
    return Status::errorf("linear_fp8_joined: weights ", shape_str(w_a.shape), " and ",
                          shape_str(w_b.shape), " differ in output features");
  const int64_t n = w_a.rows(), ta = x_a.rows(), tb = x_b.rows();
  const int64_t big = std::numeric_limits<int32_t>::max();
  if (ta + tb > big || n > big || w_a.cols() > big || w_b.cols() > big)
    return Status::errorf("linear_fp8_joined: ", ta + tb, " x ", n, " is too large for cuBLASLt");
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, {1, ta + tb, n}, env.dtype));
  const size_t row_bytes = static_cast<size_t>(n) * dtype_size(env.dtype);
  LATENT_TRY(run_fp8_into(env, x_a, w_a, nullptr, b_a, y.data(), DitActivation::kNone));
  LATENT_TRY(run_fp8_into(env, x_b, w_b, nullptr, b_b,
                          static_cast<uint8_t*>(y.data()) + ta * row_bytes, DitActivation::kNone));
  return y;
}

Result<Tensor> dit_linear_fp8_gated_add(DitEnv& env, const Fp8Matrix& x, const Fp8Matrix& w,
                                        const Tensor& bias, const Tensor& gate,
                                        const Tensor& residual) {
  LATENT_TRY(check_linear_fp8(env, x, w, bias));
  const int64_t m = x.rows(), n = w.rows(), k = w.cols();
  LATENT_TRY(check(env, "gate", gate, env.dtype, -1, "one row of the layer's width"));
  if (gate.numel() != n)
    return Status::errorf("linear_fp8_gated_add: gate ", shape_str(gate.shape()),
                          " is not one row of ", n, " (one batch row, one token group)");
  LATENT_TRY(check(env, "residual", residual, env.dtype, -1, "[..., N]"));
  Shape out_shape = x.shape;
  out_shape.back() = n;
  if (residual.shape() != out_shape)
    return Status::errorf("linear_fp8_gated_add: residual ", shape_str(residual.shape()),
                          " is not the output's ", shape_str(out_shape));
  const int64_t big = std::numeric_limits<int32_t>::max();
  if (m > big || n > big || k > big)
    return Status::errorf("x ", shape_str(x.shape), " . w^T ", shape_str(w.shape),
                          " is too large for cuBLASLt");
  // The gate goes into the weight's per-channel scales and the bias:
  // residual + gate * (x w^T + b) = residual + (x w^T) * (w_scale * gate) * x_scale + b * gate.
  LATENT_ASSIGN_OR_RETURN(Tensor scales, empty(env, {n}, DType::kF32));
  Tensor gated_bias;
  if (bias.defined()) {
    LATENT_ASSIGN_OR_RETURN(gated_bias, empty(env, {n}, env.dtype));
  }
  LATENT_TRY(launch_fp8_gate_scales(static_cast<const float*>(w.scales.data()), gate.data(),
                                    data_or_null(bias), n, env.dtype,
                                    static_cast<float*>(scales.data()),
                                    bias.defined() ? gated_bias.data() : nullptr, env.launch));
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, out_shape, env.dtype));
  LATENT_TRY(run_fp8_into(env, x, w, static_cast<const float*>(scales.data()), gated_bias, y.data(),
                          DitActivation::kNone, residual.data()));
  return y;
}

Result<Tensor> dit_layer_norm(DitEnv& env, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              float eps) {
  LATENT_TRY(check(env, "input x", x, env.dtype, -1, "[..., D]"));
  LATENT_TRY(check_vector(env, "gamma", gamma, x.dim(-1), x));
  LATENT_TRY(check_vector(env, "beta", beta, x.dim(-1), x));
  LATENT_TRY(check_eps(eps));
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, x.shape(), env.dtype));
  LATENT_TRY(launch_dit_norm(x.data(), y.data(), rows_of(x), x.dim(-1), DitNorm::kLayer, eps,
                             data_or_null(gamma), data_or_null(beta), nullptr, nullptr, DitGroups(),
                             env.dtype, env.launch));
  return y;
}

Result<Tensor> dit_rms_norm(DitEnv& env, const Tensor& x, const Tensor& gamma, float eps) {
  LATENT_TRY(check(env, "input x", x, env.dtype, -1, "[..., D]"));
  LATENT_TRY(check_vector(env, "gamma", gamma, x.dim(-1), x));
  LATENT_TRY(check_eps(eps));
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, x.shape(), env.dtype));
  LATENT_TRY(launch_dit_norm(x.data(), y.data(), rows_of(x), x.dim(-1), DitNorm::kRms, eps,
                             data_or_null(gamma), nullptr, nullptr, nullptr, DitGroups(), env.dtype,
                             env.launch));
  return y;
}

Result<Tensor> dit_modulate(DitEnv& env, const Tensor& x, const Tensor& shift, const Tensor& scale,
                            const std::vector<int64_t>& group_starts, bool normalize, float eps) {
  LATENT_TRY(check(env, "input x", x, env.dtype, 3, "[B, T, D]"));
  DitGroups groups;
  LATENT_TRY(check_groups(group_starts, x.dim(1), &groups));
  LATENT_TRY(check_conditioning(env, "shift", shift, x, group_starts.size()));
  LATENT_TRY(check_conditioning(env, "scale", scale, x, group_starts.size()));
  if (normalize) LATENT_TRY(check_eps(eps));
  groups.batch = x.dim(0);
  groups.tokens = x.dim(1);
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, x.shape(), env.dtype));
  LATENT_TRY(launch_dit_norm(x.data(), y.data(), rows_of(x), x.dim(2),
                             normalize ? DitNorm::kLayer : DitNorm::kNone, eps, nullptr, nullptr,
                             shift.data(), scale.data(), groups, env.dtype, env.launch));
  return y;
}

Result<Tensor> dit_layer_norm_modulate_wide(DitEnv& env, const Tensor& x, const Tensor& shift,
                                            const Tensor& scale,
                                            const std::vector<int64_t>& group_starts, float eps,
                                            int64_t extra) {
  LATENT_TRY(check(env, "input x", x, env.dtype, 3, "[B, T, D]"));
  if (extra < 0)
    return Status::errorf("layer_norm_modulate_wide: ", extra, " extra columns asked for");
  DitGroups groups;
  LATENT_TRY(check_groups(group_starts, x.dim(1), &groups));
  LATENT_TRY(check_conditioning(env, "shift", shift, x, group_starts.size()));
  LATENT_TRY(check_conditioning(env, "scale", scale, x, group_starts.size()));
  LATENT_TRY(check_eps(eps));
  groups.batch = x.dim(0);
  groups.tokens = x.dim(1);
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, {x.dim(0), x.dim(1), x.dim(2) + extra}, env.dtype));
  LATENT_TRY(launch_dit_norm(x.data(), y.data(), rows_of(x), x.dim(2), DitNorm::kLayer, eps,
                             nullptr, nullptr, shift.data(), scale.data(), groups, env.dtype,
                             env.launch, nullptr, nullptr, x.dim(2) + extra));
  return y;
}

Result<Fp8Matrix> dit_layer_norm_modulate_fp8(DitEnv& env, const Tensor& x, const Tensor& shift,
                                              const Tensor& scale,
                                              const std::vector<int64_t>& group_starts,
                                              float eps) {
  LATENT_TRY(check(env, "input x", x, env.dtype, 3, "[B, T, D]"));
  DitGroups groups;
  LATENT_TRY(check_groups(group_starts, x.dim(1), &groups));
  LATENT_TRY(check_conditioning(env, "shift", shift, x, group_starts.size()));
  LATENT_TRY(check_conditioning(env, "scale", scale, x, group_starts.size()));
  LATENT_TRY(check_eps(eps));
  const int64_t k = x.dim(2), rows = rows_of(x);
  if (k % 16 != 0)
    return Status::errorf("fp8 rows: x ", shape_str(x.shape()), " has ", k,
                          " columns; FP8 matrix multiplication needs a multiple of 16");
  groups.batch = x.dim(0);
  groups.tokens = x.dim(1);
  Fp8Matrix q;
  q.shape = x.shape();
  LATENT_ASSIGN_OR_RETURN(q.codes, empty(env, {rows, k / 2}, DType::kBF16));  // k bytes a row
  LATENT_ASSIGN_OR_RETURN(q.scales, empty(env, {rows}, DType::kF32));
  LATENT_TRY(launch_dit_norm(x.data(), nullptr, rows, k, DitNorm::kLayer, eps, nullptr, nullptr,
                             shift.data(), scale.data(), groups, env.dtype, env.launch,
                             static_cast<uint8_t*>(q.codes.data()),
                             static_cast<float*>(q.scales.data())));
  return q;
}

Result<Tensor> dit_gated_add(DitEnv& env, const Tensor& residual, const Tensor& x,
                             const Tensor& gate, const std::vector<int64_t>& group_starts) {
  LATENT_TRY(check(env, "input x", x, env.dtype, 3, "[B, T, D]"));
  LATENT_TRY(check(env, "residual", residual, env.dtype, 3, "[B, T, D]"));
  if (residual.shape() != x.shape())
    return Status::errorf("residual ", shape_str(residual.shape()), " and x ", shape_str(x.shape()),
                          " differ");
  DitGroups groups;
  LATENT_TRY(check_groups(group_starts, x.dim(1), &groups));
  LATENT_TRY(check_conditioning(env, "gate", gate, x, group_starts.size()));
  groups.batch = x.dim(0);
  groups.tokens = x.dim(1);
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, x.shape(), env.dtype));
  LATENT_TRY(launch_dit_gated_add(residual.data(), x.data(), gate.data(), y.data(), x.dim(2),
                                  groups, env.dtype, env.launch));
  return y;
}

Result<Tensor> dit_rope(DitEnv& env, const Tensor& x, const Tensor& freqs, int heads) {
  LATENT_TRY(check(env, "input x", x, env.dtype, 3, "[B, T, heads * d]"));
  if (heads < 1 || x.dim(2) % heads != 0 || (x.dim(2) / heads) % 2 != 0)
    return Status::errorf(x.dim(2), " features of x ", shape_str(x.shape()), " do not split into ",
                          heads, " heads of an even size");
  LATENT_TRY(check(env, "freqs", freqs, DType::kF32, 3, "[T, d/2, 2] fp32 (upload_fp32)"));
  const int64_t d = x.dim(2) / heads;
  if (freqs.dim(0) != x.dim(1) || freqs.dim(1) != d / 2 || freqs.dim(2) != 2)
    return Status::errorf("freqs ", shape_str(freqs.shape()), " should be [", x.dim(1), ", ", d / 2,
                          ", 2] for x ", shape_str(x.shape()), " with ", heads, " heads");
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, x.shape(), env.dtype));
  LATENT_TRY(launch_dit_rope(x.data(), freqs.data_as<float>(), y.data(), x.dim(0) * x.dim(1),
                             x.dim(1), heads, d, env.dtype, env.launch));
  return y;
}

namespace {

// The shapes joint_qk() and joint_qk_fp8() take (backend.h); the head size in *d.
Status check_joint_qk(DitEnv& env, const Tensor& img, const Tensor& txt, const Tensor& gamma_img,
                      const Tensor& gamma_txt, const Tensor& freqs, int heads, int64_t* d) {
  LATENT_TRY(check(env, "image stream", img, env.dtype, 3, "[B, T_img, heads * d]"));
  LATENT_TRY(check(env, "text stream", txt, env.dtype, 3, "[B, T_txt, heads * d]"));
  if (txt.dim(0) != img.dim(0) || txt.dim(2) != img.dim(2))
    return Status::errorf("joint_qk: image ", shape_str(img.shape()), " and text ",
                          shape_str(txt.shape()), " streams do not fit together");
  if (heads < 1 || img.dim(2) % heads != 0 || (img.dim(2) / heads) % 2 != 0)
    return Status::errorf(img.dim(2), " features of ", shape_str(img.shape()),
                          " do not split into ", heads, " heads of an even size");
  *d = img.dim(2) / heads;
  const int64_t t_all = img.dim(1) + txt.dim(1);
  LATENT_TRY(check_vector(env, "gamma (image)", gamma_img, *d, img));
  LATENT_TRY(check_vector(env, "gamma (text)", gamma_txt, *d, txt));
  if (!gamma_img.defined() || !gamma_txt.defined())
    return Status::error("joint_qk: both streams need their RMS norm gamma");
  LATENT_TRY(check(env, "freqs", freqs, DType::kF32, 3, "[T, d/2, 2] fp32 (upload_fp32)"));
  if (freqs.dim(0) != t_all || freqs.dim(1) != *d / 2 || freqs.dim(2) != 2)
    return Status::errorf("freqs ", shape_str(freqs.shape()), " should be [", t_all, ", ", *d / 2,
                          ", 2] for ", img.dim(1), " image and ", txt.dim(1), " text tokens");
  return ok_status();
}

}  // namespace

Result<Tensor> dit_joint_qk(DitEnv& env, const Tensor& img, const Tensor& txt,
                            const Tensor& gamma_img, const Tensor& gamma_txt, const Tensor& freqs,
                            int heads, float eps) {
  int64_t d = 0;
  LATENT_TRY(check_joint_qk(env, img, txt, gamma_img, gamma_txt, freqs, heads, &d));
  const int64_t t_all = img.dim(1) + txt.dim(1);
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, {img.dim(0), t_all, img.dim(2)}, env.dtype));
  LATENT_TRY(launch_dit_joint_qk(img.data(), txt.data(), gamma_img.data(), gamma_txt.data(),
                                 freqs.data_as<float>(), y.data(), img.dim(0), img.dim(1),
                                 txt.dim(1), heads, d, eps, env.dtype, env.launch));
  return y;
}

Result<Fp8Matrix> dit_joint_qk_fp8(DitEnv& env, const Tensor& img, const Tensor& txt,
                                   const Tensor& gamma_img, const Tensor& gamma_txt,
                                   const Tensor& freqs, int heads, float eps, float bound) {
  int64_t d = 0;
  LATENT_TRY(check_joint_qk(env, img, txt, gamma_img, gamma_txt, freqs, heads, &d));
  if (!(bound > 0.f) || !std::isfinite(bound))
    return Status::errorf("joint_qk_fp8: bound ", bound, " is not a positive number");
  const int64_t b = img.dim(0), t_all = img.dim(1) + txt.dim(1), hd = img.dim(2);
  const float descale = bound / 448.f;
  Fp8Matrix m;
  m.shape = {b, t_all, hd};
  LATENT_ASSIGN_OR_RETURN(m.codes, empty(env, {b * t_all, hd / 2}, DType::kBF16));  // hd bytes
  LATENT_ASSIGN_OR_RETURN(m.scales, empty(env, {b * t_all}, DType::kF32));
  LATENT_TRY(launch_fp8_fill(static_cast<float*>(m.scales.data()), b * t_all, descale, env.launch));
  LATENT_TRY(launch_dit_joint_qk_codes(
      img.data(), txt.data(), gamma_img.data(), gamma_txt.data(), freqs.data_as<float>(),
      static_cast<uint8_t*>(m.codes.data()), descale, b, img.dim(1), txt.dim(1), heads, d, eps,
      env.dtype, env.launch));
  return m;
}

namespace {

// The shapes attention() and attention_fp8() take (backend.h).
Status check_attention(DitEnv& env, const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                       const Tensor& key_mask, const std::vector<int64_t>& key_lengths) {
  LATENT_TRY(check(env, "q", q, env.dtype, 3, "[B, T, heads * d]"));
  LATENT_TRY(check(env, "k", k, env.dtype, 3, "[B, S, heads * d]"));
  LATENT_TRY(check(env, "v", v, env.dtype, 3, "[B, S, heads * d]"));
  if (k.shape() != v.shape() || k.dim(0) != q.dim(0) || k.dim(2) != q.dim(2))
    return Status::errorf("q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), " and v ",
                          shape_str(v.shape()), " do not fit together");
  if (heads < 1 || q.dim(2) % heads != 0)
    return Status::errorf(q.dim(2), " features of q ", shape_str(q.shape()),
                          " cannot be split into ", heads, " heads");
  if (key_mask.defined()) {
    LATENT_TRY(check(env, "key_mask", key_mask, env.dtype, 2, "[B, S]"));
    if (key_mask.dim(0) != k.dim(0) || key_mask.dim(1) != k.dim(1))
      return Status::errorf("key_mask ", shape_str(key_mask.shape()), " should be [", k.dim(0),
                            ", ", k.dim(1), "] for k ", shape_str(k.shape()));
  }
  if (!key_lengths.empty()) {
    if (!key_mask.defined()) return Status::error("key_lengths given without a key_mask");
    if (static_cast<int64_t>(key_lengths.size()) != k.dim(0))
      return Status::errorf(key_lengths.size(), " key_lengths for a batch of ", k.dim(0));
    for (size_t b = 0; b < key_lengths.size(); ++b)
      if (key_lengths[b] < 1 || key_lengths[b] > k.dim(1))
        return Status::errorf("key_lengths[", b, "] = ", key_lengths[b], " is outside [1, ",
                              k.dim(1), "]");
  }
  return ok_status();
}

}  // namespace

Result<Tensor> dit_attention(DitEnv& env, const Tensor& q, const Tensor& k, const Tensor& v,
                             int heads, const Tensor& key_mask,
                             const std::vector<int64_t>& key_lengths, int64_t extra) {
  if (extra < 0) return Status::errorf("attention_wide: ", extra, " extra columns asked for");
  LATENT_TRY(check_attention(env, q, k, v, heads, key_mask, key_lengths));
  const int64_t hd = q.dim(2), ld = hd + extra;
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, {q.dim(0), q.dim(1), ld}, env.dtype));
  // cuDNN's fused flash attention where it can run (sdpa.h: bf16/fp16, sm_80+, d <= 256, not
  // LATENT_CUDNN_SDPA=0, built with cudnn-frontend; with key lengths its padding mask; output
  // rows `ld` apart), else our kernel, which reads the mask alone (into a tensor of its own,
  // its rows then copied into the wide output's).
  LATENT_ASSIGN_OR_RETURN(
      const bool done,
      sdpa_attention(*env.ctx, q.data(), k.data(), v.data(), data_or_null(key_mask),
                     key_lengths.empty() ? nullptr : key_lengths.data(), y.data(), q.dim(0),
                     q.dim(1), k.dim(1), heads, hd / heads, env.dtype, ld));
  if (done) return y;
  Tensor out = y;
  if (extra > 0) {
    LATENT_ASSIGN_OR_RETURN(out, empty(env, q.shape(), env.dtype));
  }
  LATENT_TRY(launch_dit_attention(q.data(), k.data(), v.data(), data_or_null(key_mask), out.data(),
                                  q.dim(0), q.dim(1), k.dim(1), heads, hd / heads, env.dtype,
                                  env.launch));
  if (extra > 0) {
    const size_t es = dtype_size(env.dtype);
    LATENT_CUDA_CHECK(cudaMemcpy2DAsync(y.data(), static_cast<size_t>(ld) * es, out.data(),
                                        static_cast<size_t>(hd) * es, static_cast<size_t>(hd) * es,
                                        static_cast<size_t>(q.dim(0) * q.dim(1)),
                                        cudaMemcpyDeviceToDevice, env.ctx->stream()));
  }
  return y;
}

Result<Fp8Matrix> dit_attention_fp8(DitEnv& env, const Tensor& q, const Tensor& k, const Tensor& v,
                                    int heads, const Tensor& key_mask,
                                    const std::vector<int64_t>& key_lengths) {
  LATENT_TRY(check_attention(env, q, k, v, heads, key_mask, key_lengths));
  const int64_t b = q.dim(0), tq = q.dim(1), tk = k.dim(1), hd = q.dim(2);
  // cuDNN's FP8 graph takes no bias: a key mask without lengths stays in the compute dtype.
  const bool maskable = !key_mask.defined() || !key_lengths.empty();
  // LATENT_FP8_ATTENTION=0: attention in the compute dtype (the model reads it too: codes / 1)
  const bool off = fp8_attention_from_env() == Fp8Attention::kOff;
  if (maskable && !off && sdpa_compiled() && env.ctx->properties().major >= 9) {
    // Scratch: the three inputs' codes and the scalars; the output's codes and row scales are
    // the result's own.
    const int64_t nq = b * tq * hd, nkv = b * tk * hd;
    TempBuffer scratch;
    const int64_t q_off = 0, k_off = (nq + 255) / 256 * 256;
    const int64_t v_off = k_off + (nkv + 255) / 256 * 256, s_off = v_off + (nkv + 255) / 256 * 256;
    LATENT_TRY(
        scratch.allocate(*env.ctx, static_cast<size_t>(s_off) + kFp8Scalars * sizeof(float)));
    auto* base = static_cast<uint8_t*>(scratch.get());
    float* scalars = reinterpret_cast<float*>(base + s_off);
    Fp8Matrix o;
    o.shape = q.shape();
    LATENT_ASSIGN_OR_RETURN(o.codes, empty(env, {b * tq, hd / 2}, DType::kBF16));  // hd bytes a row
    LATENT_ASSIGN_OR_RETURN(o.scales, empty(env, {b * tq}, DType::kF32));
    LATENT_TRY(launch_fp8_attention_inputs(
        q.data(), k.data(), v.data(), nq, nkv, env.dtype, base + q_off, base + k_off, base + v_off,
        scalars, static_cast<float*>(o.scales.data()), b * tq, env.launch));
    LATENT_ASSIGN_OR_RETURN(
        const bool done,
        sdpa_attention_fp8(*env.ctx, base + q_off, base + k_off, base + v_off,
                           key_lengths.empty() ? nullptr : key_lengths.data(), o.codes.data(),
                           scalars, b, tq, tk, heads, hd / heads, env.dtype));
    if (done) return o;
    // (the quantisation above is wasted: cuDNN refused the shape once; it is remembered, the
    // next call of this shape finds the plan empty and comes here after the same work. Rare:
    // only where cuDNN lacks an FP8 engine.)
  }
  LATENT_ASSIGN_OR_RETURN(Tensor y, dit_attention(env, q, k, v, heads, key_mask, key_lengths, 0));
  return dit_fp8_quantize_rows(env, y);
}

Result<Fp8Matrix> dit_attention_fp8_codes(DitEnv& env, const Fp8Matrix& q, const Fp8Matrix& k,
                                          const Tensor& v, int heads, const Tensor& key_mask,
                                          const std::vector<int64_t>& key_lengths) {
  for (const Fp8Matrix* m : {&q, &k}) {
    const char* what = m == &q ? "q" : "k";
    if (!m->defined() || !m->codes.defined() || !m->scales.defined() || m->shape.size() != 3)
      return Status::errorf("attention_fp8: ", what, " was not coded by ", env.name,
                            "'s joint_qk_fp8");
    if (m->codes.device() != env.device || m->scales.device() != env.device)
      return Status::errorf("attention_fp8: ", what, " is not on ", env.name);
  }
  LATENT_TRY(check(env, "v", v, env.dtype, 3, "[B, S, heads * d]"));
  const Shape ks = k.shape;
  if (ks != v.shape() || ks[0] != q.shape[0] || ks[2] != q.shape[2])
    return Status::errorf("q ", shape_str(q.shape), ", k ", shape_str(ks), " and v ",
                          shape_str(v.shape()), " do not fit together");
  const int64_t b = q.shape[0], tq = q.shape[1], tk = ks[1], hd = q.shape[2];
  if (heads < 1 || hd % heads != 0)
    return Status::errorf(hd, " features of q cannot be split into ", heads, " heads");
  if (key_mask.defined()) {
    LATENT_TRY(check(env, "key_mask", key_mask, env.dtype, 2, "[B, S]"));
    if (key_mask.dim(0) != b || key_mask.dim(1) != tk)
      return Status::errorf("key_mask ", shape_str(key_mask.shape()), " should be [", b, ", ", tk,
                            "]");
  }
  if (!key_lengths.empty()) {
    if (!key_mask.defined()) return Status::error("key_lengths given without a key_mask");
    if (static_cast<int64_t>(key_lengths.size()) != b)
      return Status::errorf(key_lengths.size(), " key_lengths for a batch of ", b);
    for (size_t i = 0; i < key_lengths.size(); ++i)
      if (key_lengths[i] < 1 || key_lengths[i] > tk)
        return Status::errorf("key_lengths[", i, "] = ", key_lengths[i], " is outside [1, ", tk,
                              "]");
  }
  const bool maskable = !key_mask.defined() || !key_lengths.empty();
  if (maskable) {
    const int64_t nkv = b * tk * hd;
    TempBuffer scratch;
    const int64_t s_off = (nkv + 255) / 256 * 256;
    LATENT_TRY(
        scratch.allocate(*env.ctx, static_cast<size_t>(s_off) + kFp8Scalars * sizeof(float)));
    auto* v8 = static_cast<uint8_t*>(scratch.get());
    float* scalars = reinterpret_cast<float*>(v8 + s_off);
    Fp8Matrix o;
    o.shape = q.shape;
    LATENT_ASSIGN_OR_RETURN(o.codes, empty(env, {b * tq, hd / 2}, DType::kBF16));
    LATENT_ASSIGN_OR_RETURN(o.scales, empty(env, {b * tq}, DType::kF32));
    LATENT_TRY(launch_fp8_attention_v(v.data(), nkv, env.dtype, v8,
                                      static_cast<const float*>(q.scales.data()),
                                      static_cast<const float*>(k.scales.data()), scalars,
                                      static_cast<float*>(o.scales.data()), b * tq, env.launch));
    LATENT_ASSIGN_OR_RETURN(
        const bool done,
        sdpa_attention_fp8(*env.ctx, q.codes.data(), k.codes.data(), v8,
                           key_lengths.empty() ? nullptr : key_lengths.data(), o.codes.data(),
                           scalars, b, tq, tk, heads, hd / heads, env.dtype));
    if (done) return o;
  }
  // cuDNN cannot: q and k back to the compute dtype, attention there, its rows quantised.
  Tensor qd, kd;
  for (auto [m, out] : {std::make_pair(&q, &qd), std::make_pair(&k, &kd)}) {
    LATENT_ASSIGN_OR_RETURN(*out, empty(env, m->shape, env.dtype));
    LATENT_TRY(launch_fp8_dequantize_rows(static_cast<const uint8_t*>(m->codes.data()),
                                          static_cast<const float*>(m->scales.data()), m->rows(),
                                          m->cols(), env.dtype, out->data(), env.launch));
  }
  LATENT_ASSIGN_OR_RETURN(Tensor y, dit_attention(env, qd, kd, v, heads, key_mask, key_lengths, 0));
  return dit_fp8_quantize_rows(env, y);
}

Result<Tensor> dit_activation(DitEnv& env, const Tensor& x, DitActivation act) {
  LATENT_TRY(check(env, "input x", x, env.dtype, -1, "a tensor"));
  LATENT_TRY(check_act(act));
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, x.shape(), env.dtype));
  LATENT_TRY(launch_dit_bias_act(x.data(), nullptr, y.data(), x.numel(), x.dim(-1), act, env.dtype,
                                 env.launch));
  return y;
}

Result<Tensor> dit_scaled_add(DitEnv& env, const Tensor& a, const Tensor& b, float alpha,
                              float beta) {
  LATENT_TRY(check(env, "a", a, env.dtype, -1, "a tensor"));
  LATENT_TRY(check(env, "b", b, env.dtype, -1, "a tensor"));
  if (a.shape() != b.shape())
    return Status::errorf("shapes differ: ", shape_str(a.shape()), " and ", shape_str(b.shape()));
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, a.shape(), env.dtype));
  LATENT_TRY(launch_dit_scaled_add(a.data(), b.data(), y.data(), a.numel(), alpha, beta, env.dtype,
                                   env.launch));
  return y;
}

Result<Tensor> dit_cfg_combine(DitEnv& env, const Tensor& cond, const Tensor& uncond, float scale) {
  LATENT_TRY(check(env, "cond", cond, env.dtype, -1, "[..., C]"));
  LATENT_TRY(check(env, "uncond", uncond, env.dtype, -1, "[..., C]"));
  if (cond.shape() != uncond.shape())
    return Status::errorf("cond ", shape_str(cond.shape()), " and uncond ",
                          shape_str(uncond.shape()), " differ");
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, cond.shape(), env.dtype));
  LATENT_TRY(launch_dit_cfg_combine(cond.data(), uncond.data(), y.data(), rows_of(cond),
                                    cond.dim(-1), scale, env.dtype, env.launch));
  return y;
}

Result<Tensor> dit_concat(DitEnv& env, const std::vector<Tensor>& parts, int dim) {
  if (parts.empty()) return Status::error("no tensors given");
  LATENT_TRY(check(env, "part 0", parts[0], env.dtype, -1, "a tensor"));
  LATENT_TRY(resolve_dim(&dim, parts[0]));
  const Tensor& first = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string what = str_cat("part ", i);
    LATENT_TRY(
        check(env, what.c_str(), parts[i], env.dtype, first.rank(), "of the first part's rank"));
    for (int d = 0; d < first.rank(); ++d)
      if (d != dim && parts[i].dim(d) != first.dim(d))
        return Status::errorf("part ", i, " ", shape_str(parts[i].shape()),
                              " does not match part 0 ", shape_str(first.shape()), " outside dim ",
                              dim);
  }
  const size_t es = dtype_size(env.dtype);
  int64_t outer = 1, inner = 1, total = 0;
  for (int i = 0; i < dim; ++i) outer *= first.dim(i);
  for (int i = dim + 1; i < first.rank(); ++i) inner *= first.dim(i);
  for (const Tensor& p : parts) total += p.dim(dim);
  Shape shape = first.shape();
  shape[dim] = total;
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, shape, env.dtype));
  // Each part is `outer` rows of its bytes, landing at its column of the output's rows.
  const size_t out_row = static_cast<size_t>(total * inner) * es;
  size_t col = 0;
  for (const Tensor& p : parts) {
    const size_t bytes = static_cast<size_t>(p.dim(dim) * inner) * es;
    char* dst = static_cast<char*>(y.data()) + col;
    if (outer == 1)
      LATENT_CUDA_CHECK(
          cudaMemcpyAsync(dst, p.data(), bytes, cudaMemcpyDeviceToDevice, env.ctx->stream()));
    else
      LATENT_CUDA_CHECK(cudaMemcpy2DAsync(dst, out_row, p.data(), bytes, bytes,
                                          static_cast<size_t>(outer), cudaMemcpyDeviceToDevice,
                                          env.ctx->stream()));
    col += bytes;
  }
  return y;
}

Result<Tensor> dit_slice(DitEnv& env, const Tensor& x, int dim, int64_t start, int64_t count) {
  LATENT_TRY(check(env, "input x", x, env.dtype, -1, "a tensor"));
  LATENT_TRY(resolve_dim(&dim, x));
  if (start < 0 || count < 1 || start > x.dim(dim) - count)
    return Status::errorf("[", start, ", ", start + count, ") is outside the ", x.dim(dim),
                          " entries of dim ", dim, " of ", shape_str(x.shape()));
  const size_t es = dtype_size(env.dtype);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= x.dim(i);
  for (int i = dim + 1; i < x.rank(); ++i) inner *= x.dim(i);
  Shape shape = x.shape();
  shape[dim] = count;
  const size_t in_row = static_cast<size_t>(x.dim(dim) * inner) * es;
  const size_t offset = static_cast<size_t>(start * inner) * es;
  if (outer == 1)  // one contiguous block: a view sharing the storage
    return Tensor::from_storage(x.storage(), x.byte_offset() + offset, shape, env.dtype);
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, shape, env.dtype));
  const size_t bytes = static_cast<size_t>(count * inner) * es;
  LATENT_CUDA_CHECK(cudaMemcpy2DAsync(y.data(), bytes, static_cast<const char*>(x.data()) + offset,
                                      in_row, bytes, static_cast<size_t>(outer),
                                      cudaMemcpyDeviceToDevice, env.ctx->stream()));
  return y;
}

Result<Tensor> dit_pack_latents(DitEnv& env, const Tensor& latents) {
  const Tensor& x = latents;
  if (!x.defined()) return Status::error("latents are undefined");
  const Shape& s = x.shape();
  if (!(s.size() == 4 || (s.size() == 5 && s[2] == 1 && x.layout() == Layout::kContiguous)))
    return Status::errorf("latents must be [B, C, h, w] or [B, C, 1, h, w], got ", x.describe());
  if (x.device() != env.device)
    return Status::errorf("latents ", x.describe(), " are not on ", env.name,
                          x.device().is_cpu() ? " (upload() them first)" : "");
  if (x.dtype() != env.dtype)
    return Status::errorf("latents ", x.describe(), " are not in ", dtype_name(env.dtype));
  if (x.byte_offset() + x.nbytes() > x.storage()->bytes())
    return Status::errorf("latents ", x.describe(), " are larger than their storage");
  const int64_t b = s[0], c = s[1], h = s[s.size() - 2], w = s[s.size() - 1];
  if (b < 1 || c < 1 || h < 2 || w < 2 || h % 2 || w % 2)
    return Status::errorf("latent height and width must be even, got ", shape_str(s));
  LATENT_ASSIGN_OR_RETURN(Tensor y, empty(env, {b, (h / 2) * (w / 2), 4 * c}, env.dtype));
  LATENT_TRY(launch_dit_patch(x.data(), y.data(), b, c, h, w, x.layout() == Layout::kNHWC, true,
                              env.dtype, env.launch));
  return y;
}

Result<Tensor> dit_unpack_latents(DitEnv& env, const Tensor& tokens, int64_t height,
                                  int64_t width) {
  LATENT_TRY(check(env, "tokens", tokens, env.dtype, 3, "[B, tokens, 4C]"));
  if (tokens.dim(2) % 4 != 0)
    return Status::errorf("tokens ", shape_str(tokens.shape()),
                          " do not hold 2x2 patches (features not a multiple of 4)");
  if (height % 2 || width % 2 || height < 2 || width < 2 ||
      tokens.dim(1) != (height / 2) * (width / 2))
    return Status::errorf(tokens.dim(1), " tokens do not make a ", height, " x ", width,
                          " latent (even sides, (h/2)(w/2) tokens)");
  const int64_t b = tokens.dim(0), c = tokens.dim(2) / 4;
  // y: [B, C, h, w] in the backend's image layout (NHWC), as upload() makes it
  LATENT_ASSIGN_OR_RETURN(Tensor y,
                          env.ctx->empty({b, c, height, width}, env.dtype, Layout::kNHWC));
  LATENT_TRY(launch_dit_patch(tokens.data(), y.data(), b, c, height, width, true, false, env.dtype,
                              env.launch));
  return y;
}

}  // namespace latent::cuda
