// CPU kernels of the DiT ops (see dit_ops.h). Linear layers and attention products run on
// oneDNN (JIT matmul / sgemm, threaded inside); row-wise loops are split across threads with
// OpenMP, with norm statistics accumulated in double.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/backends/cpu/dit_ops.h"

namespace latent::cpu {
namespace {

// Queries per attention block: the [block, S] score matrix is the only T x S-sized buffer.
constexpr int64_t kQueryBlock = 256;

int64_t rows_of(const Tensor& x) { return x.numel() / x.dim(-1); }

// SiLU (and none) as the VAE ops map them; the tanh-approximated GELU is the DiT's own.
bool dit_eltwise(DitActivation act, dnnl::algorithm* alg, float* alpha) {
  *alpha = 0.f;
  if (act == DitActivation::kGELUTanh) {
    *alg = dnnl::algorithm::eltwise_gelu_tanh;
    return true;
  }
  return act == DitActivation::kSiLU && eltwise_algorithm(Activation::kSiLU, alg, alpha);
}

const char* dit_activation_name(DitActivation act) {
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

struct MatmulPlan {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

// The group (index into starts) of token t; starts is short (1 or 2 entries).
inline size_t group_of(const std::vector<int64_t>& starts, int64_t t) {
  size_t g = 0;
  while (g + 1 < starts.size() && t >= starts[g + 1]) ++g;
  return g;
}

}  // namespace

Result<Tensor> linear(DnnlContext& ctx, const Tensor& x, const Tensor& w, const Tensor& bias,
                      DitActivation act) {
  // x: [M, K] (leading dims flattened) . w^T [K, N] + bias -> y: [M, N]
  const int64_t k = w.dim(1), n = w.dim(0), m = rows_of(x);
  Shape out_shape = x.shape();
  out_shape.back() = n;
  Tensor y = Tensor::empty(out_shape, DType::kF32);
  if (m == 0) return y;
  try {
    dnnl::algorithm alg;
    float alpha;
    const bool fused = dit_eltwise(act, &alg, &alpha);
    const bool has_bias = bias.defined();
    auto plan = ctx.cached<MatmulPlan>(
        str_cat("dit_matmul:", m, 'x', k, 'x', n, ':', has_bias, ':', static_cast<int>(act)), [&] {
          using tag = dnnl::memory::format_tag;
          const auto f32 = dnnl::memory::data_type::f32;
          auto p = std::make_shared<MatmulPlan>();
          dnnl::memory::desc src({m, k}, f32, tag::ab);
          dnnl::memory::desc wei({k, n}, f32, tag::ba);  // [N, K] row-major read as [K, N]
          dnnl::memory::desc dst({m, n}, f32, tag::ab);
          dnnl::primitive_attr attr;
          attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
          if (fused) {
            dnnl::post_ops po;
            po.append_eltwise(1.f, alg, alpha, 0.f);
            attr.set_post_ops(po);
          }
          auto desc =
              has_bias ? dnnl::matmul::desc(src, wei, dnnl::memory::desc({1, n}, f32, tag::ab), dst)
                       : dnnl::matmul::desc(src, wei, dst);
          p->pd = dnnl::matmul::primitive_desc(desc, attr, ctx.engine());
          p->prim = dnnl::matmul(p->pd);
          return p;
        });
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, dnnl::memory(plan->pd.src_desc(), ctx.engine(), x.data())},
        {DNNL_ARG_WEIGHTS, dnnl::memory(plan->pd.weights_desc(), ctx.engine(), w.data())},
        {DNNL_ARG_DST, dnnl::memory(plan->pd.dst_desc(), ctx.engine(), y.data())}};
    if (has_bias)
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(plan->pd.bias_desc(), ctx.engine(), bias.data()));
    execute(ctx, plan->prim, plan->pd, std::move(args));
  } catch (const dnnl::error& e) {
    return Status::errorf("linear: oneDNN matmul failed for x ", shape_str(x.shape()), " and w ",
                          shape_str(w.shape()), " (", dit_activation_name(act), "): ", e.what());
  }
  return y;
}

namespace {

// y: [R, D] with row(x_r, y_r, D) run on each row of x: [R, D], rows split across threads.
template <typename F>
Tensor map_rows(const Tensor& x, F&& row) {
  const int64_t d = x.dim(-1), rows = rows_of(x);
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
#pragma omp parallel for schedule(static) if (rows * d > kGrain)
  for (int64_t r = 0; r < rows; ++r) row(px + r * d, py + r * d, d);
  return y;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const float* gamma, const float* beta, float eps) {
  // x: [R, D] -> [R, D]
  return map_rows(x, [&](const float* xr, float* yr, int64_t d) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < d; ++i) sum += xr[i];
    const double mean = sum / d;
    for (int64_t i = 0; i < d; ++i) sq += (xr[i] - mean) * (xr[i] - mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(sq / d + eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = 0; i < d; ++i) {
      float v = (xr[i] - m) * inv;
      if (gamma) v *= gamma[i];
      if (beta) v += beta[i];
      yr[i] = v;
    }
  });
}

Tensor rms_norm(const Tensor& x, const float* gamma, float eps) {
  // x: [R, D] -> [R, D]
  return map_rows(x, [&](const float* xr, float* yr, int64_t d) {
    double sq = 0;
    for (int64_t i = 0; i < d; ++i) sq += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sq / d + eps));
    for (int64_t i = 0; i < d; ++i) yr[i] = gamma ? xr[i] * inv * gamma[i] : xr[i] * inv;
  });
}

Tensor modulate(const Tensor& x, const float* shift, const float* scale,
                const std::vector<int64_t>& starts, bool normalize, float eps) {
  // x: [B, T, D]; shift, scale: [G, B, D] -> [B, T, D]
  const int64_t b = x.dim(0), t = x.dim(1), d = x.dim(2);
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
#pragma omp parallel for schedule(static) if (b * t * d > kGrain)
  for (int64_t r = 0; r < b * t; ++r) {
    const int64_t bi = r / t, ti = r % t;
    const int64_t row = static_cast<int64_t>(group_of(starts, ti)) * b + bi;
    const float* sh = shift + row * d;
    const float* sc = scale + row * d;
    const float* xr = px + r * d;
    float* yr = py + r * d;
    float m = 0.f, inv = 1.f;
    if (normalize) {
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < d; ++i) sum += xr[i];
      const double mean = sum / d;
      for (int64_t i = 0; i < d; ++i) sq += (xr[i] - mean) * (xr[i] - mean);
      m = static_cast<float>(mean);
      inv = static_cast<float>(1.0 / std::sqrt(sq / d + eps));
    }
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - m) * inv * (1.f + sc[i]) + sh[i];
  }
  return y;
}

Tensor gated_add(const Tensor& residual, const Tensor& x, const float* gate,
                 const std::vector<int64_t>& starts) {
  // residual, x: [B, T, D]; gate: [G, B, D] -> [B, T, D]
  const int64_t b = x.dim(0), t = x.dim(1), d = x.dim(2);
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const float* pr = residual.data_as<float>();
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
#pragma omp parallel for schedule(static) if (b * t * d > kGrain)
  for (int64_t r = 0; r < b * t; ++r) {
    const int64_t bi = r / t, ti = r % t;
    const float* g = gate + (static_cast<int64_t>(group_of(starts, ti)) * b + bi) * d;
    for (int64_t i = 0; i < d; ++i) py[r * d + i] = pr[r * d + i] + g[i] * px[r * d + i];
  }
  return y;
}

Tensor rope(const Tensor& x, const Tensor& freqs, int heads) {
  // x: [B, T, H * d]; freqs: [T, d/2, 2] -> [B, T, H * d]
  const int64_t b = x.dim(0), t = x.dim(1), hd = x.dim(2), d = hd / heads, half = d / 2;
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const float* px = x.data_as<float>();
  const float* pf = freqs.data_as<float>();
  float* py = y.data_as<float>();
#pragma omp parallel for schedule(static) if (b * t * hd > kGrain)
  for (int64_t r = 0; r < b * t; ++r) {
    const float* f = pf + (r % t) * half * 2;
    for (int64_t h = 0; h < heads; ++h) {
      const float* xr = px + r * hd + h * d;
      float* yr = py + r * hd + h * d;
      for (int64_t i = 0; i < half; ++i) {
        const float c = f[2 * i], s = f[2 * i + 1];
        const float re = xr[2 * i], im = xr[2 * i + 1];
        yr[2 * i] = re * c - im * s;
        yr[2 * i + 1] = re * s + im * c;
      }
    }
  }
  return y;
}

Result<Tensor> attention(DnnlContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                         int heads, const float* key_mask) {
  // q: [B, T, H * d]; k, v: [B, S, H * d] -> out: [B, T, H * d]
  //   S_blk = scale * Q_blk K^T    sgemm('N','T', nb, S', d): heads strided by H * d
  //   P = softmax_rows(S_blk)      oneDNN softmax, in place
  //   O_blk = P V                  sgemm('N','N', nb, d, S'), written straight into out
  // Padding keys (key_mask == 0) are dropped by gathering the kept keys and values of the
  // batch row first, so they take no work and need no -inf.
  const int64_t b = q.dim(0), t = q.dim(1), hd = q.dim(2), s = k.dim(1), d = hd / heads;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  Tensor out = Tensor::empty(q.shape(), DType::kF32);
  if (t == 0) return out;
  try {
    const int64_t block = std::min(kQueryBlock, t);
    std::vector<float> kept_k, kept_v;
    for (int64_t bi = 0; bi < b; ++bi) {
      const float* kb = k.data_as<float>() + bi * s * hd;
      const float* vb = v.data_as<float>() + bi * s * hd;
      int64_t sk = s;
      if (key_mask) {
        const float* mrow = key_mask + bi * s;
        sk = 0;
        for (int64_t j = 0; j < s; ++j) sk += mrow[j] != 0.f;
        if (sk < s) {
          kept_k.resize(static_cast<size_t>(sk * hd));
          kept_v.resize(static_cast<size_t>(sk * hd));
          int64_t o = 0;
          for (int64_t j = 0; j < s; ++j) {
            if (mrow[j] == 0.f) continue;
            std::memcpy(&kept_k[o * hd], kb + j * hd, static_cast<size_t>(hd) * sizeof(float));
            std::memcpy(&kept_v[o * hd], vb + j * hd, static_cast<size_t>(hd) * sizeof(float));
            ++o;
          }
          kb = kept_k.data();
          vb = kept_v.data();
        }
      }
      std::vector<float> scores(static_cast<size_t>(block * sk));  // [block, S']
      std::shared_ptr<SoftmaxPlan> full = softmax_plan(ctx, "dit_softmax:", block, sk);
      for (int64_t h = 0; h < heads; ++h) {
        const float* kh = kb + h * d;
        const float* vh = vb + h * d;
        for (int64_t t0 = 0; t0 < t; t0 += block) {
          const int64_t nb = std::min(block, t - t0);
          const float* qh = q.data_as<float>() + (bi * t + t0) * hd + h * d;
          float* oh = out.data_as<float>() + (bi * t + t0) * hd + h * d;
          dnnl::status st =
              dnnl::sgemm('N', 'T', nb, sk, d, scale, qh, hd, kh, hd, 0.f, scores.data(), sk);
          if (st != dnnl::status::success)
            return Status::errorf("attention: oneDNN sgemm (scores) failed with status ",
                                  static_cast<int>(st));
          std::shared_ptr<SoftmaxPlan> sm =
              nb == block ? full : softmax_plan(ctx, "dit_softmax:", nb, sk);
          dnnl::memory mem(sm->pd.src_desc(), ctx.engine(), scores.data());
          execute(ctx, sm->prim, sm->pd, {{DNNL_ARG_SRC, mem}, {DNNL_ARG_DST, mem}});
          st = dnnl::sgemm('N', 'N', nb, d, sk, 1.f, scores.data(), sk, vh, hd, 0.f, oh, hd);
          if (st != dnnl::status::success)
            return Status::errorf("attention: oneDNN sgemm (values) failed with status ",
                                  static_cast<int>(st));
        }
      }
    }
  } catch (const dnnl::error& e) {
    return Status::errorf("attention: oneDNN failed for q ", shape_str(q.shape()), ", k ",
                          shape_str(k.shape()), " with ", heads, " heads: ", e.what());
  }
  return out;
}

Result<Tensor> dit_activation(DnnlContext& ctx, const Tensor& x, DitActivation act) {
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const int64_t n = x.numel();
  dnnl::algorithm alg;
  float alpha;
  if (!dit_eltwise(act, &alg, &alpha) || n == 0) {
    if (n) std::memcpy(y.data(), x.data(), static_cast<size_t>(n) * sizeof(float));
    return y;
  }
  try {
    run_eltwise(ctx, str_cat("dit_eltwise:", static_cast<int>(act), ':', n), alg, alpha,
                x.data_as<float>(), y.data_as<float>(), n);
  } catch (const dnnl::error& e) {
    return Status::errorf("dit_activation ", dit_activation_name(act), ": oneDNN failed on ",
                          shape_str(x.shape()), ": ", e.what());
  }
  return y;
}

Tensor scaled_add(const Tensor& a, const Tensor& b, float alpha, float beta) {
  Tensor y = Tensor::empty(a.shape(), DType::kF32);
  const float* pa = a.data_as<float>();
  const float* pb = b.data_as<float>();
  float* py = y.data_as<float>();
  const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) py[i] = alpha * pa[i] + beta * pb[i];
  return y;
}

Tensor cfg_combine(const Tensor& cond, const Tensor& uncond, float scale) {
  // cond, uncond: [R, C] -> [R, C]
  const int64_t c = cond.dim(-1), rows = rows_of(cond);
  Tensor y = Tensor::empty(cond.shape(), DType::kF32);
  const float* pc = cond.data_as<float>();
  const float* pu = uncond.data_as<float>();
  float* py = y.data_as<float>();
#pragma omp parallel for schedule(static) if (rows * c > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const float* cr = pc + r * c;
    const float* ur = pu + r * c;
    float* yr = py + r * c;
    double cn = 0, mn = 0;
    for (int64_t i = 0; i < c; ++i) {
      const float comb = ur[i] + scale * (cr[i] - ur[i]);
      yr[i] = comb;
      cn += static_cast<double>(cr[i]) * cr[i];
      mn += static_cast<double>(comb) * comb;
    }
    // diffusers divides without a guard; a zero row of comb stays a NaN there too.
    const float ratio = static_cast<float>(std::sqrt(cn) / std::sqrt(mn));
    for (int64_t i = 0; i < c; ++i) yr[i] *= ratio;
  }
  return y;
}

Tensor concat(const std::vector<Tensor>& parts, int dim) {
  // parts: [..., n_i, ...] along dim -> [..., sum n_i, ...]
  const Tensor& first = parts.front();
  const size_t es = dtype_size(first.dtype());
  int64_t outer = 1, inner = 1, total = 0;
  for (int i = 0; i < dim; ++i) outer *= first.dim(i);
  for (int i = dim + 1; i < first.rank(); ++i) inner *= first.dim(i);
  for (const Tensor& p : parts) total += p.dim(dim);
  Shape shape = first.shape();
  shape[dim] = total;
  Tensor y = Tensor::empty(shape, first.dtype());
  char* dst = static_cast<char*>(y.data());
  const size_t out_row = static_cast<size_t>(total * inner) * es;
  size_t col = 0;
  for (const Tensor& p : parts) {
    const size_t bytes = static_cast<size_t>(p.dim(dim) * inner) * es;
    const char* src = static_cast<const char*>(p.data());
#pragma omp parallel for schedule(static) if (outer * static_cast <int64_t>(bytes) > kGrain)
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(dst + o * out_row + col, src + o * bytes, bytes);
    col += bytes;
  }
  return y;
}

Tensor slice(const Tensor& x, int dim, int64_t start, int64_t count) {
  const size_t es = dtype_size(x.dtype());
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= x.dim(i);
  for (int i = dim + 1; i < x.rank(); ++i) inner *= x.dim(i);
  Shape shape = x.shape();
  shape[dim] = count;
  const size_t in_row = static_cast<size_t>(x.dim(dim) * inner) * es;
  const size_t offset = static_cast<size_t>(start * inner) * es;
  if (outer == 1)  // one contiguous block: share the storage
    return Tensor::from_storage(x.storage(), x.byte_offset() + offset, shape, x.dtype());
  Tensor y = Tensor::empty(shape, x.dtype());
  const size_t bytes = static_cast<size_t>(count * inner) * es;
  const char* src = static_cast<const char*>(x.data()) + offset;
  char* dst = static_cast<char*>(y.data());
#pragma omp parallel for schedule(static) if (outer * static_cast <int64_t>(bytes) > kGrain)
  for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + o * bytes, src + o * in_row, bytes);
  return y;
}

}  // namespace latent::cpu
