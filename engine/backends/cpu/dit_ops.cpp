// The CPU backend's DiT ops (backend.h, "DiT ops"): each checks its inputs, converts them to
// fp32 when the storage dtype is bf16/fp16, runs the kernel from dit_ops.h and rounds the
// result back once. upload_fp32 tables and key masks are read as they are.
#include "engine/backends/cpu/dit_ops.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <new>

#include "engine/backends/cpu/cpu_backend.h"

namespace latent {
namespace {

using cpu::guarded;

// A contiguous CPU tensor holding its bytes, in `dtype`, of rank `rank` (-1: any, >= 1) with no
// empty dim. `form` names the expected shape in messages.
Status check(const char* op, const char* what, const Tensor& t, DType dtype, int rank,
             const char* form) {
  if (!t.defined()) return Status::errorf(op, ": ", what, " is undefined");
  if (!t.device().is_cpu())
    return Status::errorf(op, ": ", what, " ", t.describe(), " is not on the CPU");
  if (t.layout() != Layout::kContiguous)
    return Status::errorf(op, ": ", what, " ", t.describe(), " is not in the contiguous layout");
  if (t.byte_offset() + t.nbytes() > t.storage()->bytes())
    return Status::errorf(op, ": ", what, " ", t.describe(), " needs ", t.nbytes(),
                          " bytes at offset ", t.byte_offset(), " but its storage holds ",
                          t.storage()->bytes());
  if (t.dtype() != dtype)
    return Status::errorf(op, ": ", what, " ", t.describe(), " is not in ", dtype_name(dtype));
  if (t.rank() == 0 || (rank >= 0 && t.rank() != rank))
    return Status::errorf(op, ": ", what, " must be ", form, ", got ", shape_str(t.shape()));
  for (int64_t d : t.shape())
    if (d <= 0)
      return Status::errorf(op, ": ", what, " ", shape_str(t.shape()), " has an empty dimension");
  return ok_status();
}

// A per-feature vector (gamma, beta, bias) of exactly n elements, if defined.
Status check_vector(const char* op, const char* what, const Tensor& t, DType dtype, int64_t n,
                    const Tensor& x) {
  if (!t.defined()) return ok_status();
  LATENT_TRY(check(op, what, t, dtype, -1, "a vector"));
  if (t.numel() != n)
    return Status::errorf(op, ": ", what, " ", shape_str(t.shape()), " should have ", n,
                          " elements for input ", shape_str(x.shape()));
  return ok_status();
}

Status check_groups(const char* op, const std::vector<int64_t>& starts, int64_t tokens) {
  if (starts.empty() || starts[0] != 0)
    return Status::errorf(op, ": token groups must start at token 0");
  for (size_t g = 1; g < starts.size(); ++g)
    if (starts[g] <= starts[g - 1] || starts[g] >= tokens)
      return Status::errorf(op, ": token group starts must increase and stay below the ", tokens,
                            " tokens (group ", g, " starts at ", starts[g], ")");
  return ok_status();
}

// A conditioning tensor for G groups of a [B, T, D] input: G * B rows of D.
Status check_conditioning(const char* op, const char* what, const Tensor& c, DType dtype,
                          const Tensor& x, size_t groups) {
  LATENT_TRY(check(op, what, c, dtype, -1, "[G, B, D] or [G * B, D]"));
  const int64_t want = static_cast<int64_t>(groups) * x.dim(0) * x.dim(2);
  if (c.dim(-1) != x.dim(2) || c.numel() != want)
    return Status::errorf(op, ": ", what, " ", shape_str(c.shape()), " should hold ", groups,
                          " group(s) x ", x.dim(0), " batch rows x ", x.dim(2),
                          " features for input ", shape_str(x.shape()));
  return ok_status();
}

Status check_eps(const char* op, float eps) {
  if (!(eps >= 0.f) || !std::isfinite(eps)) return Status::errorf(op, ": invalid eps ", eps);
  return ok_status();
}

Status check_dit_activation(const char* op, DitActivation act) {
  if (static_cast<int>(act) > static_cast<int>(DitActivation::kGELUTanh))
    return Status::errorf(op, ": unknown activation ", static_cast<int>(act));
  return ok_status();
}

// Normalises a dim argument (negative counts from the end) or reports it out of range.
Status resolve_dim(const char* op, int* dim, const Tensor& x) {
  const int d = *dim < 0 ? *dim + x.rank() : *dim;
  if (d < 0 || d >= x.rank())
    return Status::errorf(op, ": dim ", *dim, " is out of range for ", shape_str(x.shape()));
  *dim = d;
  return ok_status();
}

const float* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_as<float>() : nullptr; }

}  // namespace

bool CpuBackend::supports_dit(DitOp op, DType dtype) const {
  if (op == DitOp::kUploadFp32) return true;
  return static_cast<int>(op) <= static_cast<int>(DitOp::kLinearAdd) && dtype == dtype_;
}

Result<Tensor> CpuBackend::upload_fp32(const Tensor& host) {
  return guarded("upload_fp32", [&]() -> Result<Tensor> {
    if (!host.defined()) return Status::error("upload_fp32: tensor is undefined");
    if (!host.device().is_cpu() || host.layout() != Layout::kContiguous)
      return Status::errorf("upload_fp32: ", host.describe(), " is not a contiguous host tensor");
    if (host.byte_offset() + host.nbytes() > host.storage()->bytes())
      return Status::errorf("upload_fp32: ", host.describe(), " needs ", host.nbytes(),
                            " bytes at offset ", host.byte_offset(), " but its storage holds ",
                            host.storage()->bytes());
    return cpu::convert(host, DType::kF32);
  });
}

Result<Tensor> CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias,
                                  DitActivation act) {
  return guarded("linear", [&]() -> Result<Tensor> {
    const char* op = "linear";
    LATENT_TRY(check(op, "input x", x, dtype_, -1, "[..., K]"));
    LATENT_TRY(check(op, "weight w", w, dtype_, 2, "[N, K]"));
    if (w.dim(1) != x.dim(-1))
      return Status::errorf(op, ": weight w ", shape_str(w.shape()), " expects ", w.dim(1),
                            " input features but x is ", shape_str(x.shape()));
    LATENT_TRY(check_vector(op, "bias", bias, dtype_, w.dim(0), w));
    LATENT_TRY(check_dit_activation(op, act));
    Tensor b32 = bias.defined() ? to_f32(bias) : Tensor();
    LATENT_ASSIGN_OR_RETURN(Tensor y, cpu::linear(*dnnl_, to_f32(x), to_f32(w), b32, act));
    return to_storage(std::move(y));
  });
}

Result<Tensor> CpuBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      float eps) {
  return guarded("layer_norm", [&]() -> Result<Tensor> {
    const char* op = "layer_norm";
    LATENT_TRY(check(op, "input x", x, dtype_, -1, "[..., D]"));
    LATENT_TRY(check_vector(op, "gamma", gamma, dtype_, x.dim(-1), x));
    LATENT_TRY(check_vector(op, "beta", beta, dtype_, x.dim(-1), x));
    LATENT_TRY(check_eps(op, eps));
    Tensor g32 = gamma.defined() ? to_f32(gamma) : Tensor();
    Tensor b32 = beta.defined() ? to_f32(beta) : Tensor();
    return to_storage(cpu::layer_norm(to_f32(x), ptr_or_null(g32), ptr_or_null(b32), eps));
  });
}

Result<Tensor> CpuBackend::rms_norm(const Tensor& x, const Tensor& gamma, float eps) {
  return guarded("rms_norm", [&]() -> Result<Tensor> {
    const char* op = "rms_norm";
    LATENT_TRY(check(op, "input x", x, dtype_, -1, "[..., D]"));
    LATENT_TRY(check_vector(op, "gamma", gamma, dtype_, x.dim(-1), x));
    LATENT_TRY(check_eps(op, eps));
    Tensor g32 = gamma.defined() ? to_f32(gamma) : Tensor();
    return to_storage(cpu::rms_norm(to_f32(x), ptr_or_null(g32), eps));
  });
}

namespace {
// Shared checks of modulate / layer_norm_modulate.
Status check_modulate(const char* op, const Tensor& x, const Tensor& shift, const Tensor& scale,
                      const std::vector<int64_t>& starts, DType dtype) {
  LATENT_TRY(check(op, "input x", x, dtype, 3, "[B, T, D]"));
  LATENT_TRY(check_groups(op, starts, x.dim(1)));
  LATENT_TRY(check_conditioning(op, "shift", shift, dtype, x, starts.size()));
  LATENT_TRY(check_conditioning(op, "scale", scale, dtype, x, starts.size()));
  return ok_status();
}
}  // namespace

Result<Tensor> CpuBackend::modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                    const std::vector<int64_t>& group_starts) {
  return guarded("modulate", [&]() -> Result<Tensor> {
    LATENT_TRY(check_modulate("modulate", x, shift, scale, group_starts, dtype_));
    Tensor sh = to_f32(shift), sc = to_f32(scale);
    return to_storage(cpu::modulate(to_f32(x), sh.data_as<float>(), sc.data_as<float>(),
                                    group_starts, false, 0.f));
  });
}

Result<Tensor> CpuBackend::layer_norm_modulate(const Tensor& x, const Tensor& shift,
                                               const Tensor& scale,
                                               const std::vector<int64_t>& group_starts,
                                               float eps) {
  return guarded("layer_norm_modulate", [&]() -> Result<Tensor> {
    const char* op = "layer_norm_modulate";
    LATENT_TRY(check_modulate(op, x, shift, scale, group_starts, dtype_));
    LATENT_TRY(check_eps(op, eps));
    Tensor sh = to_f32(shift), sc = to_f32(scale);
    return to_storage(cpu::modulate(to_f32(x), sh.data_as<float>(), sc.data_as<float>(),
                                    group_starts, true, eps));
  });
}

Result<Tensor> CpuBackend::gated_add(const Tensor& residual, const Tensor& x, const Tensor& gate,
                                     const std::vector<int64_t>& group_starts) {
  return guarded("gated_add", [&]() -> Result<Tensor> {
    const char* op = "gated_add";
    LATENT_TRY(check(op, "input x", x, dtype_, 3, "[B, T, D]"));
    LATENT_TRY(check(op, "residual", residual, dtype_, 3, "[B, T, D]"));
    if (residual.shape() != x.shape())
      return Status::errorf(op, ": residual ", shape_str(residual.shape()), " and x ",
                            shape_str(x.shape()), " differ");
    LATENT_TRY(check_groups(op, group_starts, x.dim(1)));
    LATENT_TRY(check_conditioning(op, "gate", gate, dtype_, x, group_starts.size()));
    Tensor g = to_f32(gate);
    return to_storage(
        cpu::gated_add(to_f32(residual), to_f32(x), g.data_as<float>(), group_starts));
  });
}

Result<Tensor> CpuBackend::rope(const Tensor& x, const Tensor& freqs, int heads) {
  return guarded("rope", [&]() -> Result<Tensor> {
    const char* op = "rope";
    LATENT_TRY(check(op, "input x", x, dtype_, 3, "[B, T, heads * d]"));
    if (heads < 1 || x.dim(2) % heads != 0 || (x.dim(2) / heads) % 2 != 0)
      return Status::errorf(op, ": ", x.dim(2), " features of x ", shape_str(x.shape()),
                            " do not split into ", heads, " heads of an even size");
    LATENT_TRY(check(op, "freqs", freqs, DType::kF32, 3, "[T, d/2, 2] fp32 (upload_fp32)"));
    const int64_t d = x.dim(2) / heads;
    if (freqs.dim(0) != x.dim(1) || freqs.dim(1) != d / 2 || freqs.dim(2) != 2)
      return Status::errorf(op, ": freqs ", shape_str(freqs.shape()), " should be [", x.dim(1),
                            ", ", d / 2, ", 2] for x ", shape_str(x.shape()), " with ", heads,
                            " heads");
    return to_storage(cpu::rope(to_f32(x), freqs, heads));
  });
}

Result<Tensor> CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                                     const Tensor& key_mask,
                                     const std::vector<int64_t>& key_lengths) {
  return guarded("attention", [&]() -> Result<Tensor> {
    const char* op = "attention";
    LATENT_TRY(check(op, "q", q, dtype_, 3, "[B, T, heads * d]"));
    LATENT_TRY(check(op, "k", k, dtype_, 3, "[B, S, heads * d]"));
    LATENT_TRY(check(op, "v", v, dtype_, 3, "[B, S, heads * d]"));
    if (k.shape() != v.shape() || k.dim(0) != q.dim(0) || k.dim(2) != q.dim(2))
      return Status::errorf(op, ": q ", shape_str(q.shape()), ", k ", shape_str(k.shape()),
                            " and v ", shape_str(v.shape()), " do not fit together");
    if (heads < 1 || q.dim(2) % heads != 0)
      return Status::errorf(op, ": ", q.dim(2), " features of q ", shape_str(q.shape()),
                            " cannot be split into ", heads, " heads");
    Tensor m32;
    if (key_mask.defined()) {
      LATENT_TRY(check(op, "key_mask", key_mask, dtype_, 2, "[B, S]"));
      if (key_mask.dim(0) != k.dim(0) || key_mask.dim(1) != k.dim(1))
        return Status::errorf(op, ": key_mask ", shape_str(key_mask.shape()), " should be [",
                              k.dim(0), ", ", k.dim(1), "] for k ", shape_str(k.shape()));
      m32 = to_f32(key_mask);
      const float* m = m32.data_as<float>();
      for (int64_t b = 0; b < k.dim(0); ++b) {
        bool any = false;
        for (int64_t j = 0; j < k.dim(1) && !any; ++j) any = m[b * k.dim(1) + j] != 0.f;
        if (!any)
          return Status::errorf(op, ": key_mask masks every key of batch row ", b,
                                " (softmax over no keys)");
      }
    }
    // The mask does the work here; the lengths are only checked against their promise, so
    // that a caller's wrong lengths fail on the CPU rather than silently on another backend.
    if (!key_lengths.empty()) {
      if (!key_mask.defined()) return Status::errorf(op, ": key_lengths given without a key_mask");
      if (static_cast<int64_t>(key_lengths.size()) != k.dim(0))
        return Status::errorf(op, ": ", key_lengths.size(), " key_lengths for a batch of ",
                              k.dim(0));
      const float* m = m32.data_as<float>();
      for (int64_t b = 0; b < k.dim(0); ++b) {
        const int64_t len = key_lengths[static_cast<size_t>(b)];
        if (len < 1 || len > k.dim(1))
          return Status::errorf(op, ": key_lengths[", b, "] = ", len, " is outside [1, ", k.dim(1),
                                "]");
        for (int64_t j = 0; j < k.dim(1); ++j)
          if ((m[b * k.dim(1) + j] != 0.f) != (j < len))
            return Status::errorf(op, ": key_lengths[", b, "] = ", len,
                                  " disagrees with key_mask at key ", j);
      }
    }
    LATENT_ASSIGN_OR_RETURN(
        Tensor y, cpu::attention(*dnnl_, to_f32(q), to_f32(k), to_f32(v), heads, ptr_or_null(m32)));
    return to_storage(std::move(y));
  });
}

Result<Tensor> CpuBackend::dit_activation(const Tensor& x, DitActivation act) {
  return guarded("dit_activation", [&]() -> Result<Tensor> {
    LATENT_TRY(check("dit_activation", "input x", x, dtype_, -1, "a tensor"));
    LATENT_TRY(check_dit_activation("dit_activation", act));
    LATENT_ASSIGN_OR_RETURN(Tensor y, cpu::dit_activation(*dnnl_, to_f32(x), act));
    return to_storage(std::move(y));
  });
}

Result<Tensor> CpuBackend::scaled_add(const Tensor& a, const Tensor& b, float alpha, float beta) {
  return guarded("scaled_add", [&]() -> Result<Tensor> {
    LATENT_TRY(check("scaled_add", "a", a, dtype_, -1, "a tensor"));
    LATENT_TRY(check("scaled_add", "b", b, dtype_, -1, "a tensor"));
    if (a.shape() != b.shape())
      return Status::errorf("scaled_add: shapes differ: ", shape_str(a.shape()), " and ",
                            shape_str(b.shape()));
    return to_storage(cpu::scaled_add(to_f32(a), to_f32(b), alpha, beta));
  });
}

Result<Tensor> CpuBackend::cfg_combine(const Tensor& cond, const Tensor& uncond, float scale) {
  return guarded("cfg_combine", [&]() -> Result<Tensor> {
    LATENT_TRY(check("cfg_combine", "cond", cond, dtype_, -1, "[..., C]"));
    LATENT_TRY(check("cfg_combine", "uncond", uncond, dtype_, -1, "[..., C]"));
    if (cond.shape() != uncond.shape())
      return Status::errorf("cfg_combine: cond ", shape_str(cond.shape()), " and uncond ",
                            shape_str(uncond.shape()), " differ");
    return to_storage(cpu::cfg_combine(to_f32(cond), to_f32(uncond), scale));
  });
}

Result<Tensor> CpuBackend::concat(const std::vector<Tensor>& parts, int dim) {
  return guarded("concat", [&]() -> Result<Tensor> {
    const char* op = "concat";
    if (parts.empty()) return Status::error("concat: no tensors given");
    LATENT_TRY(check(op, "part 0", parts[0], dtype_, -1, "a tensor"));
    LATENT_TRY(resolve_dim(op, &dim, parts[0]));
    for (size_t i = 1; i < parts.size(); ++i) {
      const std::string what = str_cat("part ", i);
      LATENT_TRY(
          check(op, what.c_str(), parts[i], dtype_, parts[0].rank(), "of the first part's rank"));
      for (int d = 0; d < parts[0].rank(); ++d)
        if (d != dim && parts[i].dim(d) != parts[0].dim(d))
          return Status::errorf(op, ": part ", i, " ", shape_str(parts[i].shape()),
                                " does not match part 0 ", shape_str(parts[0].shape()),
                                " outside dim ", dim);
    }
    return cpu::concat(parts, dim);  // moves elements unchanged, in any dtype
  });
}

Result<Tensor> CpuBackend::slice(const Tensor& x, int dim, int64_t start, int64_t count) {
  return guarded("slice", [&]() -> Result<Tensor> {
    LATENT_TRY(check("slice", "input x", x, dtype_, -1, "a tensor"));
    LATENT_TRY(resolve_dim("slice", &dim, x));
    if (start < 0 || count < 1 || start > x.dim(dim) - count)
      return Status::errorf("slice: [", start, ", ", start + count, ") is outside the ", x.dim(dim),
                            " entries of dim ", dim, " of ", shape_str(x.shape()));
    return cpu::slice(x, dim, start, count);
  });
}

// Latent packing: the 2x2 patch permutation of QwenImagePipeline, moving elements unchanged.
namespace {

// Element (b, c, y, x) of a [B, C, h, w] image <-> element (b, (y/2)(w/2) + x/2, 4c + 2(y%2) +
// x%2) of the [B, (h/2)(w/2), 4C] tokens; `pack` picks the direction.
void permute_patches(const Tensor& in, Tensor& out, int64_t b, int64_t c, int64_t h, int64_t w,
                     bool pack) {
  const size_t es = dtype_size(in.dtype());
  const char* src = static_cast<const char*>(in.data());
  char* dst = static_cast<char*>(out.data());
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          const int64_t image = ((bi * c + ci) * h + y) * w + x;
          const int64_t token = (bi * (h / 2) * (w / 2) + (y / 2) * (w / 2) + x / 2) * 4 * c +
                                4 * ci + 2 * (y % 2) + x % 2;
          const int64_t from = pack ? image : token, to = pack ? token : image;
          std::memcpy(dst + to * es, src + from * es, es);
        }
}

}  // namespace

Result<Tensor> CpuBackend::pack_latents(const Tensor& latents) {
  return guarded("pack_latents", [&]() -> Result<Tensor> {
    const char* op = "pack_latents";
    LATENT_TRY(check(op, "latents", latents, dtype_, -1, "[B, C, h, w] or [B, C, 1, h, w]"));
    const Shape& s = latents.shape();
    if (!(s.size() == 4 || (s.size() == 5 && s[2] == 1)))
      return Status::errorf(op, ": latents must be [B, C, h, w] or [B, C, 1, h, w], got ",
                            shape_str(s));
    const int64_t b = s[0], c = s[1], h = s[s.size() - 2], w = s[s.size() - 1];
    if (h % 2 || w % 2)
      return Status::errorf(op, ": latent height and width must be even, got ", h, " x ", w);
    Tensor out = Tensor::empty({b, (h / 2) * (w / 2), 4 * c}, dtype_);
    permute_patches(latents, out, b, c, h, w, true);
    return out;
  });
}

Result<Tensor> CpuBackend::unpack_latents(const Tensor& tokens, int64_t height, int64_t width) {
  return guarded("unpack_latents", [&]() -> Result<Tensor> {
    const char* op = "unpack_latents";
    LATENT_TRY(check(op, "tokens", tokens, dtype_, 3, "[B, tokens, 4C]"));
    if (tokens.dim(2) % 4 != 0)
      return Status::errorf(op, ": tokens ", shape_str(tokens.shape()),
                            " do not hold 2x2 patches (features not a multiple of 4)");
    if (height % 2 || width % 2 || height < 2 || width < 2 ||
        tokens.dim(1) != (height / 2) * (width / 2))
      return Status::errorf(op, ": ", tokens.dim(1), " tokens do not make a ", height, " x ", width,
                            " latent (even sides, (h/2)(w/2) tokens)");
    const int64_t b = tokens.dim(0), c = tokens.dim(2) / 4;
    Tensor out = Tensor::empty({b, c, height, width}, dtype_);
    permute_patches(tokens, out, b, c, height, width, false);
    return out;
  });
}

}  // namespace latent
