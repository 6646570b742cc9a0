// Spatial self-attention without the T x T score matrix (T = H*W tokens).
//
// NCHW keeps each head's channels as a row-major [d, T] matrix, which is Q^T, K^T, V^T of the
// usual [T, d] token layout, so every product is one sgemm with transposes and no copies:
//   S = scale * Q[b:b+B] K^T      sgemm('T','N', B, T, d): Q^T stored [d, T], K^T stored [d, T]
//   P = softmax_rows(S)           oneDNN softmax on [B, T] (max-subtracted), in place
//   O^T[:, b:b+B] = V^T P^T       sgemm('N','T', d, B, T), written straight into the output
// Only the [B, T] block lives at a time (B = 256 queries: 16 MiB at T = 16384).
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/backends/cpu/cpu_ops.h"

namespace latent::cpu {
namespace {

constexpr int64_t kQueryBlock = 256;

}  // namespace

std::shared_ptr<SoftmaxPlan> softmax_plan(DnnlContext& ctx, const char* key_prefix, int64_t rows,
                                          int64_t cols) {
  return ctx.cached<SoftmaxPlan>(str_cat(key_prefix, rows, 'x', cols), [&] {
    auto p = std::make_shared<SoftmaxPlan>();
    dnnl::memory::desc md({rows, cols}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    p->pd = dnnl::softmax_forward::primitive_desc(
        dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, md, 1), attr, ctx.engine());
    p->prim = dnnl::softmax_forward(p->pd);
    return p;
  });
}

Result<Tensor> spatial_attention(DnnlContext& ctx, const Tensor& q, const Tensor& k,
                                 const Tensor& v, int heads) {
  // q, k, v: [N, C, H, W] -> out: [N, C, H, W]
  const int64_t n = q.dim(0), c = q.dim(1), t = q.dim(2) * q.dim(3), d = c / heads;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const int64_t block = std::min(kQueryBlock, t);
  Tensor out = Tensor::empty(q.shape(), DType::kF32);
  if (t == 0 || d == 0) return out;
  try {
    std::vector<float> scores(static_cast<size_t>(block * t));  // S: [block, T]
    std::shared_ptr<SoftmaxPlan> full = softmax_plan(ctx, "softmax:", block, t);
    for (int64_t ni = 0; ni < n; ++ni) {
      for (int64_t hi = 0; hi < heads; ++hi) {
        const int64_t off = (ni * c + hi * d) * t;  // this head's [d, T] matrices
        const float* qh = q.data_as<float>() + off;
        const float* kh = k.data_as<float>() + off;
        const float* vh = v.data_as<float>() + off;
        float* oh = out.data_as<float>() + off;
        for (int64_t b0 = 0; b0 < t; b0 += block) {
          const int64_t nb = std::min(block, t - b0);
          // S[nb, T] = scale * (Q^T[:, b0:b0+nb])^T K^T
          dnnl::status st =
              dnnl::sgemm('T', 'N', nb, t, d, scale, qh + b0, t, kh, t, 0.f, scores.data(), t);
          if (st != dnnl::status::success)
            return Status::errorf("spatial_attention: oneDNN sgemm (scores) failed with status ",
                                  static_cast<int>(st));
          std::shared_ptr<SoftmaxPlan> sm =
              nb == block ? full : softmax_plan(ctx, "softmax:", nb, t);
          dnnl::memory mem(sm->pd.src_desc(), ctx.engine(), scores.data());
          execute(ctx, sm->prim, sm->pd, {{DNNL_ARG_SRC, mem}, {DNNL_ARG_DST, mem}});
          // O^T[:, b0:b0+nb] = V^T [d, T] x P^T [T, nb]
          st = dnnl::sgemm('N', 'T', d, nb, t, 1.f, vh, t, scores.data(), t, 0.f, oh + b0, t);
          if (st != dnnl::status::success)
            return Status::errorf("spatial_attention: oneDNN sgemm (values) failed with status ",
                                  static_cast<int>(st));
        }
      }
    }
  } catch (const dnnl::error& e) {
    return Status::errorf("spatial_attention: oneDNN failed for q ", shape_str(q.shape()), " with ",
                          heads, " heads: ", e.what());
  }
  return out;
}

}  // namespace latent::cpu
