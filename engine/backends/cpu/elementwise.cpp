// Elementwise and data-movement ops. Activations run on oneDNN's eltwise primitive (JIT,
// vectorised exp/erf/tanh for the machine's ISA); the rest are plain loops the compiler
// vectorises, split across threads with OpenMP.
#include <algorithm>
#include <cstring>

#include "engine/backends/cpu/cpu_ops.h"

namespace latent::cpu {

namespace {
struct EltwisePlan {
  dnnl::eltwise_forward::primitive_desc pd;
  dnnl::eltwise_forward prim;
};
}  // namespace

void run_eltwise(DnnlContext& ctx, const std::string& key, dnnl::algorithm alg, float alpha,
                 const float* src, float* dst, int64_t n) {
  auto plan = ctx.cached<EltwisePlan>(key, [&] {
    auto p = std::make_shared<EltwisePlan>();
    dnnl::memory::desc md({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    p->pd = dnnl::eltwise_forward::primitive_desc(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, alg, md, alpha, 0.f), attr,
        ctx.engine());
    p->prim = dnnl::eltwise_forward(p->pd);
    return p;
  });
  dnnl::memory in(plan->pd.src_desc(), ctx.engine(), const_cast<float*>(src));
  dnnl::memory out(plan->pd.dst_desc(), ctx.engine(), dst);
  execute(ctx, plan->prim, plan->pd, {{DNNL_ARG_SRC, in}, {DNNL_ARG_DST, out}});
}

void execute(DnnlContext& ctx, const dnnl::primitive& p, const dnnl::primitive_desc_base& pd,
             std::unordered_map<int, dnnl::memory> args) {
  dnnl::stream stream(ctx.engine());
  dnnl::memory scratch(pd.scratchpad_desc(), ctx.engine());
  args.emplace(DNNL_ARG_SCRATCHPAD, scratch);
  p.execute(stream, args);
  stream.wait();
}

bool eltwise_algorithm(Activation act, dnnl::algorithm* alg, float* alpha) {
  *alpha = 0.f;
  switch (act) {
    case Activation::kNone:
      return false;
    case Activation::kSiLU:
      *alg = dnnl::algorithm::eltwise_swish;
      *alpha = 1.f;
      return true;
    case Activation::kReLU:
      *alg = dnnl::algorithm::eltwise_relu;
      return true;
    case Activation::kGELU:
      *alg = dnnl::algorithm::eltwise_gelu_erf;
      return true;
    case Activation::kTanh:
      *alg = dnnl::algorithm::eltwise_tanh;
      return true;
  }
  return false;
}

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::kNone:
      return "none";
    case Activation::kSiLU:
      return "silu";
    case Activation::kReLU:
      return "relu";
    case Activation::kGELU:
      return "gelu";
    case Activation::kTanh:
      return "tanh";
  }
  return "?";
}

Status activation(DnnlContext& ctx, const float* src, float* dst, int64_t n, Activation act) {
  dnnl::algorithm alg;
  float alpha;
  if (n == 0) return ok_status();
  if (!eltwise_algorithm(act, &alg, &alpha)) {
    if (src != dst) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return ok_status();
  }
  try {
    run_eltwise(ctx, str_cat("eltwise:", static_cast<int>(act), ':', n), alg, alpha, src, dst, n);
    return ok_status();
  } catch (const dnnl::error& e) {
    return Status::errorf("activation ", activation_name(act), ": oneDNN failed on ", n,
                          " elements: ", e.what());
  }
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = Tensor::empty(a.shape(), DType::kF32);
  const float* pa = a.data_as<float>();
  const float* pb = b.data_as<float>();
  float* py = y.data_as<float>();
  const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
  return y;
}

Tensor affine(const Tensor& x, float scale, float shift) {
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) py[i] = px[i] * scale + shift;
  return y;
}

Tensor channel_affine(const Tensor& x, const float* scale, const float* shift) {
  // x: [N, C, H, W]
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const int64_t c = x.dim(1), planes = x.dim(0) * c, hw = x.dim(2) * x.dim(3);
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kGrain)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float s = scale[pl % c], t = shift[pl % c];
    const float* src = px + pl * hw;
    float* dst = py + pl * hw;
    for (int64_t i = 0; i < hw; ++i) dst[i] = src[i] * s + t;
  }
  return y;
}

Tensor clamp(const Tensor& x, float lo, float hi) {
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) py[i] = std::min(std::max(px[i], lo), hi);
  return y;
}

namespace {
template <typename T>
void upsample_rows(const T* src, T* dst, int64_t rows, int64_t w) {
  // src: rows x w (rows = N*C*H) -> dst: 2*rows x 2*w
#pragma omp parallel for schedule(static) if (rows * w > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * w;
    T* d0 = dst + 2 * r * (2 * w);
    for (int64_t i = 0; i < w; ++i) d0[2 * i] = d0[2 * i + 1] = s[i];
    std::memcpy(d0 + 2 * w, d0, static_cast<size_t>(2 * w) * sizeof(T));
  }
}
}  // namespace

Tensor upsample_nearest2x(const Tensor& x) {
  // x: [N, C, H, W] -> [N, C, 2H, 2W]
  Tensor y = Tensor::empty({x.dim(0), x.dim(1), 2 * x.dim(2), 2 * x.dim(3)}, x.dtype());
  const int64_t rows = x.dim(0) * x.dim(1) * x.dim(2), w = x.dim(3);
  if (dtype_size(x.dtype()) == 4)
    upsample_rows(x.data_as<uint32_t>(), y.data_as<uint32_t>(), rows, w);
  else
    upsample_rows(x.data_as<uint16_t>(), y.data_as<uint16_t>(), rows, w);
  return y;
}

namespace {
template <typename T>
void interleave_phases(const T* z, T* y, int64_t n, int64_t c, int64_t h, int64_t w) {
  // z: [n][4c][h + 1][w + 1] -> y: [n][c][2h][2w]
  const int64_t zh = h + 1, zw = w + 1, planes = n * c;
#pragma omp parallel for schedule(static) if (planes * h * w > kGrain)
  for (int64_t pc = 0; pc < planes; ++pc) {
    const int64_t b = pc / c, ch = pc % c;
    T* out = y + pc * (2 * h) * (2 * w);
    for (int a = 0; a < 2; ++a)
      for (int64_t i = 0; i < h; ++i) {
        T* row = out + (2 * i + a) * (2 * w);
        for (int bb = 0; bb < 2; ++bb) {
          const T* src = z + ((b * 4 + 2 * a + bb) * c + ch) * zh * zw + (i + a) * zw + bb;
          for (int64_t j = 0; j < w; ++j) row[2 * j + bb] = src[j];
        }
      }
  }
}
}  // namespace

Tensor interleave_phases2x(const Tensor& z) {
  const int64_t n = z.dim(0), c = z.dim(1) / 4, h = z.dim(2) - 1, w = z.dim(3) - 1;
  Tensor y = Tensor::empty({n, c, 2 * h, 2 * w}, z.dtype());
  if (dtype_size(z.dtype()) == 4)
    interleave_phases(z.data_as<uint32_t>(), y.data_as<uint32_t>(), n, c, h, w);
  else
    interleave_phases(z.data_as<uint16_t>(), y.data_as<uint16_t>(), n, c, h, w);
  return y;
}

Tensor slice_channels(const Tensor& x, int64_t start, int64_t count) {
  // x: [N, C, H, W] -> [N, count, H, W]
  const int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
  Tensor y = Tensor::empty({n, count, x.dim(2), x.dim(3)}, x.dtype());
  const size_t es = dtype_size(x.dtype());
  const size_t block = static_cast<size_t>(count * hw) * es;
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(static_cast<char*>(y.data()) + i * block,
                static_cast<const char*>(x.data()) + static_cast<size_t>((i * c + start) * hw) * es,
                block);
  return y;
}

Tensor swap_clip_planes(const Tensor& x, const Shape& out_shape) {
  // x: [1, A, B, H, W] or [B, A, H, W] read as A x B planes of H*W -> B x A planes
  const bool clip = x.rank() == 5;
  const int64_t a = x.dim(1), b = clip ? x.dim(2) : x.dim(0);
  const int64_t hw = x.dim(-1) * x.dim(-2);
  Tensor y = Tensor::empty(out_shape, x.dtype());
  const size_t plane = static_cast<size_t>(hw) * dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.data());
  char* dst = static_cast<char*>(y.data());
  if (clip) {  // [A = C][B = T] -> [T][C]
#pragma omp parallel for schedule(static) if (a * b * static_cast<int64_t>(plane) > kGrain)
    for (int64_t i = 0; i < a * b; ++i) {
      const int64_t c = i / b, t = i % b;
      std::memcpy(dst + (t * a + c) * plane, src + i * plane, plane);
    }
  } else {  // [B = T][A = C] -> [C][T]
#pragma omp parallel for schedule(static) if (a * b * static_cast<int64_t>(plane) > kGrain)
    for (int64_t i = 0; i < a * b; ++i) {
      const int64_t t = i / a, c = i % a;
      std::memcpy(dst + (c * b + t) * plane, src + i * plane, plane);
    }
  }
  return y;
}

namespace {
// bf16 <-> fp32 as branch-free bit operations the compiler vectorises; the same rounding
// (nearest even, NaN kept quiet) as f32_to_bf16 in engine/core/dtype.cpp.
void bf16_to_f32_run(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

void f32_to_bf16_run(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + i, 4);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nan = (bits >> 16) | 0x40u;
    dst[i] = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}
}  // namespace

Tensor convert(const Tensor& x, DType dtype) {
  Tensor y = Tensor::empty(x.shape(), dtype);
  const int64_t n = x.numel();
  const size_t si = dtype_size(x.dtype()), so = dtype_size(dtype);
  const int64_t chunk = kGrain;
  const int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t ci = 0; ci < chunks; ++ci) {
    const int64_t b = ci * chunk, e = std::min(n, b + chunk);
    const void* src = static_cast<const char*>(x.data()) + b * si;
    void* dst = static_cast<char*>(y.data()) + b * so;
    if (x.dtype() == DType::kBF16 && dtype == DType::kF32)
      bf16_to_f32_run(static_cast<const uint16_t*>(src), static_cast<float*>(dst), e - b);
    else if (x.dtype() == DType::kF32 && dtype == DType::kBF16)
      f32_to_bf16_run(static_cast<const float*>(src), static_cast<uint16_t*>(dst), e - b);
    else
      convert_elements(src, x.dtype(), dst, dtype, static_cast<size_t>(e - b));
  }
  return y;
}

}  // namespace latent::cpu
