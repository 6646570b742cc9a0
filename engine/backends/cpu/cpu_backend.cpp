// The CPU backend's dispatch: every op checks its inputs here, converts them to fp32 when the
// storage dtype is bf16/fp16, runs the kernel from cpu_ops.h and rounds the result back.
#include "engine/backends/cpu/cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include "engine/backends/cpu/cpu_ops.h"
#include "engine/core/env.h"
#include "engine/core/log.h"

namespace latent {
namespace {

using cpu::guarded;

bool valid_activation(Activation act) {
  return static_cast<int>(act) <= static_cast<int>(Activation::kTanh);
}

}  // namespace

CpuBackend::CpuBackend(DType dtype) : dtype_(dtype), dnnl_(std::make_unique<cpu::DnnlContext>()) {
  conv3d_ = env_choice("LATENT_CPU_CONV3D", {{"0"}, {"1"}}, 0) == 1;
}
CpuBackend::~CpuBackend() = default;

Result<std::shared_ptr<Backend>> create_cpu_backend(DType dtype) {
  try {
    auto backend = std::make_shared<CpuBackend>(dtype);
    LATENT_INFO("cpu backend: tensors in ", dtype_name(dtype), ", computing in fp32 on oneDNN ",
                dnnl::version()->major, '.', dnnl::version()->minor, '.', dnnl::version()->patch);
    return std::shared_ptr<Backend>(std::move(backend));
  } catch (const std::exception& e) {
    return Status::errorf("cpu backend: could not create a oneDNN CPU engine: ", e.what());
  }
}

bool CpuBackend::supports(OpKind op, DType dtype) const {
  // Ops take tensors in the storage dtype only (upload() converts); all ops exist for it.
  return static_cast<int>(op) <= static_cast<int>(OpKind::kInterleavePhases2x) && dtype == dtype_;
}

namespace {

// Checks that `t` is a tensor this backend can read: defined, a contiguous CPU tensor whose
// storage holds all its bytes, in `dtype`, and of rank `rank` (-1: any) with no empty dim.
Status check_tensor(const char* op, const char* what, const Tensor& t, DType dtype, int rank,
                    const char* form = "[N, C, H, W]") {
  if (!t.defined()) return Status::errorf(op, ": ", what, " is undefined");
  if (!t.device().is_cpu())
    return Status::errorf(op, ": ", what, " ", t.describe(), " is not on the CPU");
  if (t.layout() != Layout::kContiguous)
    return Status::errorf(
        op, ": ", what, " ", t.describe(),
        " is in a backend-specific layout, the CPU backend reads contiguous tensors");
  if (t.byte_offset() + t.nbytes() > t.storage()->bytes())
    return Status::errorf(op, ": ", what, " ", t.describe(), " needs ", t.nbytes(),
                          " bytes at offset ", t.byte_offset(), " but its storage holds ",
                          t.storage()->bytes());
  if (t.dtype() != dtype)
    return Status::errorf(op, ": ", what, " ", t.describe(), " is not in this backend's dtype ",
                          dtype_name(dtype), " (upload() converts host tensors)");
  if (rank >= 0) {
    if (t.rank() != rank)
      return Status::errorf(op, ": ", what, " must be ", rank, "-D ", form, ", got ",
                            shape_str(t.shape()));
    for (int64_t d : t.shape())
      if (d <= 0)
        return Status::errorf(op, ": ", what, " ", shape_str(t.shape()), " has an empty dimension");
  }
  return ok_status();
}

// A per-channel parameter (gamma, beta, bias): defined with exactly `channels` elements.
Status check_param(const char* op, const char* what, const Tensor& t, DType dtype, int64_t channels,
                   const Tensor& x) {
  LATENT_TRY(check_tensor(op, what, t, dtype, -1));
  if (t.numel() != channels)
    return Status::errorf(op, ": ", what, " ", shape_str(t.shape()), " should have ", channels,
                          " elements for input ", shape_str(x.shape()));
  return ok_status();
}

Status check_activation(const char* op, Activation act) {
  if (!valid_activation(act))
    return Status::errorf(op, ": unknown activation ", static_cast<int>(act));
  return ok_status();
}

}  // namespace

Tensor CpuBackend::to_f32(const Tensor& x) const {
  return x.dtype() == DType::kF32 ? x : cpu::convert(x, DType::kF32);
}

Tensor CpuBackend::to_storage(Tensor y) const {
  return dtype_ == DType::kF32 ? y : cpu::convert(y, dtype_);
}

Result<Tensor> CpuBackend::upload(const Tensor& host) {
  return guarded("upload", [&]() -> Result<Tensor> {
    if (!host.defined()) return Status::error("upload: tensor is undefined");
    if (!host.device().is_cpu() || host.layout() != Layout::kContiguous)
      return Status::errorf("upload: ", host.describe(), " is not a contiguous host tensor");
    if (host.byte_offset() + host.nbytes() > host.storage()->bytes())
      return Status::errorf("upload: ", host.describe(), " needs ", host.nbytes(),
                            " bytes at offset ", host.byte_offset(), " but its storage holds ",
                            host.storage()->bytes());
    // Always a copy: the caller may reuse or unmap its buffer afterwards.
    return cpu::convert(host, dtype_);
  });
}

Result<Tensor> CpuBackend::download(const Tensor& t) {
  return guarded("download", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("download", "tensor", t, t.defined() ? t.dtype() : dtype_, -1));
    return cpu::convert(t, DType::kF32);
  });
}

Result<Tensor> CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                                  const Conv2dParams& p, const Tensor& residual, Activation act) {
  return guarded("conv2d", [&]() -> Result<Tensor> {
    const char* op = "conv2d";
    LATENT_TRY(check_tensor(op, "input x", x, dtype_, 4));
    LATENT_TRY(check_tensor(op, "weight w", w, dtype_, 4, "[Cout, Cin, kh, kw]"));
    if (w.dim(1) != x.dim(1))
      return Status::errorf(op, ": weight w ", shape_str(w.shape()), " expects ", w.dim(1),
                            " input channels but x is ", shape_str(x.shape()));
    if (p.stride < 1 || p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0)
      return Status::errorf(op, ": invalid stride ", p.stride, " or padding (top ", p.pad_top,
                            ", bottom ", p.pad_bottom, ", left ", p.pad_left, ", right ",
                            p.pad_right, ")");
    const int64_t hp = x.dim(2) + p.pad_top + p.pad_bottom,
                  wp = x.dim(3) + p.pad_left + p.pad_right;
    if (hp < w.dim(2) || wp < w.dim(3))
      return Status::errorf(op, ": kernel ", w.dim(2), 'x', w.dim(3),
                            " is larger than the padded input ", hp, 'x', wp, " of x ",
                            shape_str(x.shape()));
    const Shape out = {x.dim(0), w.dim(0), (hp - w.dim(2)) / p.stride + 1,
                       (wp - w.dim(3)) / p.stride + 1};
    if (bias.defined()) LATENT_TRY(check_param(op, "bias", bias, dtype_, w.dim(0), w));
    if (residual.defined()) {
      LATENT_TRY(check_tensor(op, "residual", residual, dtype_, 4));
      if (residual.shape() != out)
        return Status::errorf(op, ": residual ", shape_str(residual.shape()),
                              " does not match the output ", shape_str(out), " of x ",
                              shape_str(x.shape()), " * w ", shape_str(w.shape()));
    }
    LATENT_TRY(check_activation(op, act));
    Tensor b32 = bias.defined() ? to_f32(bias) : Tensor();
    Tensor r32 = residual.defined() ? to_f32(residual) : Tensor();
    LATENT_ASSIGN_OR_RETURN(Tensor y, cpu::conv2d(*dnnl_, to_f32(x), to_f32(w), b32, p, r32, act));
    return to_storage(std::move(y));
  });
}

Result<Tensor> CpuBackend::group_norm(const Tensor& x, int groups, const Tensor& gamma,
                                      const Tensor& beta, float eps, Activation act) {
  return guarded("group_norm", [&]() -> Result<Tensor> {
    const char* op = "group_norm";
    LATENT_TRY(check_tensor(op, "input x", x, dtype_, 4));
    if (groups < 1 || x.dim(1) % groups != 0)
      return Status::errorf(op, ": ", x.dim(1), " channels of x ", shape_str(x.shape()),
                            " cannot be split into ", groups, " groups");
    if (gamma.defined() != beta.defined())
      return Status::errorf(op, ": gamma and beta must both be given or both be omitted");
    if (!(eps >= 0.f) || !std::isfinite(eps)) return Status::errorf(op, ": invalid eps ", eps);
    Tensor g32, b32;
    if (gamma.defined()) {
      LATENT_TRY(check_param(op, "gamma", gamma, dtype_, x.dim(1), x));
      LATENT_TRY(check_param(op, "beta", beta, dtype_, x.dim(1), x));
      g32 = to_f32(gamma);
      b32 = to_f32(beta);
    }
    LATENT_TRY(check_activation(op, act));
    LATENT_ASSIGN_OR_RETURN(
        Tensor y,
        cpu::group_norm(*dnnl_, to_f32(x), groups, g32.defined() ? g32.data_as<float>() : nullptr,
                        b32.defined() ? b32.data_as<float>() : nullptr, eps, act));
    return to_storage(std::move(y));
  });
}

Result<Tensor> CpuBackend::rms_norm_channels(const Tensor& x, const Tensor& gamma,
                                             const Tensor& beta, Activation act) {
  return guarded("rms_norm_channels", [&]() -> Result<Tensor> {
    const char* op = "rms_norm_channels";
    LATENT_TRY(check_tensor(op, "input x", x, dtype_, 4));
    Tensor g32, b32;
    if (gamma.defined()) {
      LATENT_TRY(check_param(op, "gamma", gamma, dtype_, x.dim(1), x));
      g32 = to_f32(gamma);
    }
    if (beta.defined()) {
      LATENT_TRY(check_param(op, "beta", beta, dtype_, x.dim(1), x));
      b32 = to_f32(beta);
    }
    LATENT_TRY(check_activation(op, act));
    LATENT_ASSIGN_OR_RETURN(
        Tensor y,
        cpu::rms_norm_channels(*dnnl_, to_f32(x), g32.defined() ? g32.data_as<float>() : nullptr,
                               b32.defined() ? b32.data_as<float>() : nullptr, act));
    return to_storage(std::move(y));
  });
}

Status CpuBackend::copy_into(const Tensor& src, const Tensor& dst) {
  return guarded("copy_into",
                 [&]() -> Result<Tensor> {
                   LATENT_TRY(check_tensor("copy_into", "src", src, dtype_, -1));
                   LATENT_TRY(check_tensor("copy_into", "dst", dst, dtype_, -1));
                   if (src.shape() != dst.shape())
                     return Status::errorf("copy_into: src ", src.describe(), " and dst ",
                                           dst.describe(), " differ in shape");
                   if (src.data() != dst.data()) std::memmove(dst.data(), src.data(), src.nbytes());
                   return dst;
                 })
      .status();
}

Result<Tensor> CpuBackend::activation(const Tensor& x, Activation act) {
  return guarded("activation", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("activation", "input x", x, dtype_, -1));
    LATENT_TRY(check_activation("activation", act));
    // Always a fresh tensor, never the input changed in place.
    Tensor x32 = to_f32(x);
    Tensor y = x32.data() == x.data() ? Tensor::empty(x.shape(), DType::kF32) : x32;
    LATENT_TRY(cpu::activation(*dnnl_, x32.data_as<float>(), y.data_as<float>(), y.numel(), act));
    return to_storage(std::move(y));
  });
}

Result<Tensor> CpuBackend::add(const Tensor& a, const Tensor& b) {
  return guarded("add", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("add", "a", a, dtype_, -1));
    LATENT_TRY(check_tensor("add", "b", b, dtype_, -1));
    if (a.shape() != b.shape())
      return Status::errorf("add: shapes differ: ", shape_str(a.shape()), " + ",
                            shape_str(b.shape()));
    return to_storage(cpu::add(to_f32(a), to_f32(b)));
  });
}

Result<Tensor> CpuBackend::affine(const Tensor& x, float scale, float shift) {
  return guarded("affine", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("affine", "input x", x, dtype_, -1));
    return to_storage(cpu::affine(to_f32(x), scale, shift));
  });
}

Result<Tensor> CpuBackend::channel_affine(const Tensor& x, const std::vector<float>& scale,
                                          const std::vector<float>& shift) {
  return guarded("channel_affine", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("channel_affine", "input x", x, dtype_, 4));
    if (static_cast<int64_t>(scale.size()) != x.dim(1) ||
        static_cast<int64_t>(shift.size()) != x.dim(1))
      return Status::errorf("channel_affine: ", scale.size(), " scales and ", shift.size(),
                            " shifts for ", x.dim(1), " channels of x ", shape_str(x.shape()));
    return to_storage(cpu::channel_affine(to_f32(x), scale.data(), shift.data()));
  });
}

Result<Tensor> CpuBackend::clamp(const Tensor& x, float lo, float hi) {
  return guarded("clamp", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("clamp", "input x", x, dtype_, -1));
    if (!(lo <= hi)) return Status::errorf("clamp: empty range [", lo, ", ", hi, "]");
    return to_storage(cpu::clamp(to_f32(x), lo, hi));
  });
}

Result<Tensor> CpuBackend::upsample_nearest2x(const Tensor& x) {
  return guarded("upsample_nearest2x", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("upsample_nearest2x", "input x", x, dtype_, 4));
    return cpu::upsample_nearest2x(x);  // moves elements unchanged, in any dtype
  });
}

Result<Tensor> CpuBackend::interleave_phases2x(const Tensor& z) {
  return guarded("interleave_phases2x", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("interleave_phases2x", "input z", z, dtype_, 4));
    LATENT_TRY(check_phases2x(z));
    return cpu::interleave_phases2x(z);  // moves elements unchanged, in any dtype
  });
}

Result<Tensor> CpuBackend::slice_channels(const Tensor& x, int64_t start, int64_t count) {
  return guarded("slice_channels", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("slice_channels", "input x", x, dtype_, 4));
    if (start < 0 || count < 1 || start > x.dim(1) - count)
      return Status::errorf("slice_channels: channels [", start, ", ", start + count,
                            ") are outside the ", x.dim(1), " channels of x ",
                            shape_str(x.shape()));
    return cpu::slice_channels(x, start, count);
  });
}

Result<Tensor> CpuBackend::spatial_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             int heads) {
  return guarded("spatial_attention", [&]() -> Result<Tensor> {
    const char* op = "spatial_attention";
    LATENT_TRY(check_tensor(op, "q", q, dtype_, 4));
    LATENT_TRY(check_tensor(op, "k", k, dtype_, 4));
    LATENT_TRY(check_tensor(op, "v", v, dtype_, 4));
    if (k.shape() != q.shape() || v.shape() != q.shape())
      return Status::errorf(op, ": q ", shape_str(q.shape()), ", k ", shape_str(k.shape()),
                            " and v ", shape_str(v.shape()), " must have the same shape");
    if (heads < 1 || q.dim(1) % heads != 0)
      return Status::errorf(op, ": ", q.dim(1), " channels of q ", shape_str(q.shape()),
                            " cannot be split into ", heads, " heads");
    LATENT_ASSIGN_OR_RETURN(Tensor y,
                            cpu::spatial_attention(*dnnl_, to_f32(q), to_f32(k), to_f32(v), heads));
    return to_storage(std::move(y));
  });
}

Result<Tensor> CpuBackend::clip_to_frames(const Tensor& clip) {
  return guarded("clip_to_frames", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("clip_to_frames", "clip", clip, dtype_, 5, "[1, C, T, H, W]"));
    if (clip.dim(0) != 1)
      return Status::errorf("clip_to_frames: expected one clip [1, C, T, H, W], got ",
                            shape_str(clip.shape()));
    // [1, C, T, H, W] -> [T, C, H, W]
    return cpu::swap_clip_planes(clip, {clip.dim(2), clip.dim(1), clip.dim(3), clip.dim(4)});
  });
}

Result<Tensor> CpuBackend::frames_to_clip(const Tensor& frames) {
  return guarded("frames_to_clip", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("frames_to_clip", "frames", frames, dtype_, 4, "[T, C, H, W]"));
    // [T, C, H, W] -> [1, C, T, H, W]
    return cpu::swap_clip_planes(frames,
                                 {1, frames.dim(1), frames.dim(0), frames.dim(2), frames.dim(3)});
  });
}

Result<Tensor> CpuBackend::conv3d_frames(const Tensor& x, const Tensor& w, int kt,
                                         const Tensor& bias, const Conv2dParams& p,
                                         const Tensor& residual, Activation act) {
  LATENT_TRY(check_tensor("conv3d_frames", "input x", x, dtype_, 4, "[T + kt - 1, Cin, H, W]"));
  LATENT_TRY(check_tensor("conv3d_frames", "weight w", w, dtype_, 4, "[Cout, Cin, kt * kh, kw]"));
  if (kt < 2 || w.dim(2) % kt != 0 || w.dim(1) != x.dim(1) || x.dim(0) < kt)
    return Status::errorf("conv3d_frames: weight w ", shape_str(w.shape()), " with ", kt,
                          " temporal taps does not fit frames x ", shape_str(x.shape()));
  const int64_t t = x.dim(0) - kt + 1, kh = w.dim(2) / kt, kw = w.dim(3);
  const int64_t cout = w.dim(0), cin = w.dim(1);
  const size_t es = dtype_size(dtype_);
  const size_t frame = x.nbytes() / static_cast<size_t>(x.dim(0));
  Tensor y = residual;
  for (int j = 0; j < kt; ++j) {
    // tap j: w[:, :, j * kh : (j + 1) * kh, :] -> [Cout, Cin, kh, kw]
    Tensor tap = Tensor::empty({cout, cin, kh, kw}, dtype_);
    const size_t run = static_cast<size_t>(kh * kw) * es;
    for (int64_t oi = 0; oi < cout * cin; ++oi)
      std::memcpy(static_cast<char*>(tap.data()) + oi * run,
                  static_cast<const char*>(w.data()) + (oi * kt + j) * run, run);
    const Tensor in = Tensor::from_storage(x.storage(), x.byte_offset() + frame * j,
                                           {t, x.dim(1), x.dim(2), x.dim(3)}, x.dtype());
    const bool last = j == kt - 1;
    LATENT_ASSIGN_OR_RETURN(
        y, conv2d(in, tap, last ? bias : Tensor(), p, y, last ? act : Activation::kNone));
  }
  return y;
}

Result<Tensor> CpuBackend::conv3d_frames_normed(const Tensor& x, const Tensor& w, int kt,
                                                const Tensor& bias, const Conv2dParams& p,
                                                const Tensor& gamma, Activation act,
                                                const Tensor& into) {
  if (!conv3d_) return Tensor();
  LATENT_ASSIGN_OR_RETURN(Tensor y, conv3d_frames(x, w, kt, bias, p));
  LATENT_DEBUG("conv3d_frames_normed: ", shape_str(y.shape()),
               into.defined() ? " into a slot" : "");
  if (!into.defined()) return rms_norm_channels(y, gamma, Tensor(), act);
  if (into.shape() != y.shape())
    return Status::errorf("conv3d_frames_normed: output into ", shape_str(into.shape()),
                          " does not match the output ", shape_str(y.shape()));
  LATENT_TRY(rms_norm_channels_into(y, gamma, Tensor(), act, into));
  return into;
}

}  // namespace latent
