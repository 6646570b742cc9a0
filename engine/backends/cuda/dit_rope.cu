// Rotary embedding on interleaved pairs (diffusers' apply_rotary_emb_qwen, use_real=False): a
// thread rotates the V / 2 pairs of one 16-byte pack (or a single pair where rows are not
// pack-aligned) with the fp32 (cos, sin) of its token.
#include <cmath>
#include <type_traits>

#include "engine/backends/cuda/dit_common.cuh"
#include "engine/backends/cuda/fp8_codes.cuh"

namespace latent::cuda {
namespace {

// x, y: [rows][channels]; freqs: [tokens][half][2]; V elements (V / 2 pairs) a thread.
template <typename T, int V>
__global__ void __launch_bounds__(256)
    dit_rope_kernel(const T* __restrict__ x, const float* __restrict__ freqs, T* __restrict__ y,
                    int64_t packs, int64_t tokens, int64_t channels, int64_t d) {
  static_assert(V % 2 == 0, "whole pairs");
  const int64_t half = d / 2;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < packs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = p * V;
    const int64_t row = e / channels, col = e - row * channels;
    const int64_t t = row % tokens, i0 = (col % d) / 2;  // first pair of the pack
    const float2* f = reinterpret_cast<const float2*>(freqs) + t * half + i0;
    float v[V];
    if constexpr (V == 2) {
      v[0] = to_f32(x[e]);
      v[1] = to_f32(x[e + 1]);
    } else {
      load_floats<T, V>(x + e, v);
    }
#pragma unroll
    for (int j = 0; j < V / 2; ++j) {
      const float2 cs = f[j];
      const float re = v[2 * j], im = v[2 * j + 1];
      v[2 * j] = re * cs.x - im * cs.y;
      v[2 * j + 1] = re * cs.y + im * cs.x;
    }
    if constexpr (V == 2) {
      y[e] = from_f32<T>(v[0]);
      y[e + 1] = from_f32<T>(v[1]);
    } else {
      store_floats<T, V>(y + e, v);
    }
  }
}

// The joint q (or k) of the dual-stream attention in one pass (Backend::joint_qk): one warp a
// (joint row, head); lane j takes pairs j, j + 32, ... of the head. The row's source is the
// image stream for joint tokens t < t_img, else the text stream; per-head RMS norm with that
// stream's gamma, then the rotation of each pair with freqs[t], stored once.
// kCodes: y holds e4m3 codes (one byte each) of the values divided by `descale`
// (Backend::joint_qk_fp8), else values of T.
template <typename T, bool kCodes>
__global__ void __launch_bounds__(256)
    dit_joint_qk_kernel(const T* __restrict__ img, const T* __restrict__ txt,
                        const T* __restrict__ gamma_img, const T* __restrict__ gamma_txt,
                        const float* __restrict__ freqs, void* __restrict__ y, int64_t batch,
                        int64_t t_img, int64_t t_txt, int heads, int d, float eps, float descale) {
  const int lane = threadIdx.x & 31;
  const int64_t t_all = t_img + t_txt;
  const int64_t items = batch * t_all * heads;
  const int64_t first = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  const int half = d / 2;
  const int64_t channels = int64_t{heads} * d;
  for (int64_t w = first; w < items; w += warps) {
    const int h = static_cast<int>(w % heads);
    const int64_t row = w / heads;  // b * t_all + t
    const int64_t b = row / t_all, t = row - b * t_all;
    const bool image = t < t_img;
    const T* src = image ? img + (b * t_img + t) * channels : txt + (b * t_txt + t - t_img) * channels;
    src += int64_t{h} * d;
    const T* gamma = image ? gamma_img : gamma_txt;
    float q = 0.f;
    for (int p = lane; p < half; p += 32) {
      const float a = to_f32(src[2 * p]), c = to_f32(src[2 * p + 1]);
      q = fmaf(a, a, fmaf(c, c, q));
    }
    const float inv = rsqrtf(warp_sum(q) / static_cast<float>(d) + eps);
    const float2* f = reinterpret_cast<const float2*>(freqs) + t * half;
    const int64_t at = row * channels + int64_t{h} * d;
    for (int p = lane; p < half; p += 32) {
      const float re = to_f32(src[2 * p]) * inv * to_f32(gamma[2 * p]);
      const float im = to_f32(src[2 * p + 1]) * inv * to_f32(gamma[2 * p + 1]);
      const float2 cs = f[p];
      const float a = re * cs.x - im * cs.y, b = re * cs.y + im * cs.x;
      if constexpr (kCodes) {
        uint8_t* out = static_cast<uint8_t*>(y) + at;
        const float fa[1] = {a}, fb[1] = {b};
        fp8_store_codes<1>(out + 2 * p, fa, descale);
        fp8_store_codes<1>(out + 2 * p + 1, fb, descale);
      } else {
        T* out = static_cast<T*>(y) + at;
        out[2 * p] = from_f32<T>(a);
        out[2 * p + 1] = from_f32<T>(b);
      }
    }
  }
}

// The same as dit_joint_qk_kernel with the head held in registers: L lanes a (joint row, head),
// lane s holding the 16-byte pack s of the head (d = L x V), which it reads once, reduces over
// its L lanes and writes once. A warp takes 32 / L (row, head) items a step, all lanes stepping
// together so the shuffles see the whole warp. For d = 128 in bf16 (L = 16) this reads and
// writes each element once with 16-byte accesses, where the warp-a-head kernel made two passes
// of 2-byte accesses (58 us a call at 4,224 x 3,072 on an H100, ~0.9 TB/s).
template <typename T, int L, bool kCodes>
__global__ void __launch_bounds__(256)
    dit_joint_qk_vec_kernel(const T* __restrict__ img, const T* __restrict__ txt,
                            const T* __restrict__ gamma_img, const T* __restrict__ gamma_txt,
                            const float* __restrict__ freqs, void* __restrict__ y, int64_t batch,
                            int64_t t_img, int64_t t_txt, int heads, float eps, float descale) {
  constexpr int V = Pack<T>::kN;
  constexpr int kPerWarp = 32 / L;
  constexpr int d = L * V, half = d / 2;
  const int lane = threadIdx.x & 31, s = lane % L;
  const int64_t t_all = t_img + t_txt;
  const int64_t items = batch * t_all * heads;
  const int64_t channels = int64_t{heads} * d;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t base = warp * kPerWarp; base < items; base += warps * kPerWarp) {
    const int64_t w = base + lane / L;
    const bool valid = w < items;
    const int64_t ww = valid ? w : items - 1;
    const int h = static_cast<int>(ww % heads);
    const int64_t row = ww / heads;  // b * t_all + t
    const int64_t b = row / t_all, t = row - b * t_all;
    const bool image = t < t_img;
    const T* src = (image ? img + (b * t_img + t) * channels
                          : txt + (b * t_txt + t - t_img) * channels) +
                   int64_t{h} * d + s * V;
    float v[V], g[V];
    load_floats<T, V>(src, v);
    load_floats<T, V>((image ? gamma_img : gamma_txt) + s * V, g);
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) q = fmaf(v[j], v[j], q);
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    const float inv = rsqrtf(q / static_cast<float>(d) + eps);
    const float2* f = reinterpret_cast<const float2*>(freqs) + t * half + s * (V / 2);
#pragma unroll
    for (int j = 0; j < V / 2; ++j) {
      const float re = v[2 * j] * inv * g[2 * j];
      const float im = v[2 * j + 1] * inv * g[2 * j + 1];
      const float2 cs = f[j];
      v[2 * j] = re * cs.x - im * cs.y;
      v[2 * j + 1] = re * cs.y + im * cs.x;
    }
    if (valid) {
      const int64_t at = row * channels + int64_t{h} * d + s * V;
      if constexpr (kCodes)
        fp8_store_codes<V>(static_cast<uint8_t*>(y) + at, v, descale);
      else
        store_floats<T, V>(static_cast<T*>(y) + at, v);
    }
  }
}

}  // namespace

Status launch_dit_rope(const void* x, const float* freqs, void* y, int64_t rows, int64_t tokens,
                       int heads, int64_t d, DType dtype, const Launch& l) {
  const int64_t channels = heads * d, n = rows * channels;
  if (n <= 0) return ok_status();
  if (d % 2 != 0) return Status::errorf("rope: odd head size ", d);
  if (reinterpret_cast<uintptr_t>(freqs) % 8 != 0)
    return Status::error("rope: freqs are not 8-byte aligned (a view at an odd offset?)");
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    // With d a multiple of the pack length, a pack's pairs lie in one head: consecutive freqs.
    if (d % kPack == 0 && aligned16(x) && aligned16(y)) {
      const int64_t packs = n / kPack;
      dit_rope_kernel<T, kPack><<<grid_for(packs, 256, l), 256, 0, l.stream>>>(
          static_cast<const T*>(x), freqs, static_cast<T*>(y), packs, tokens, channels, d);
    } else {
      const int64_t packs = n / 2;
      dit_rope_kernel<T, 2><<<grid_for(packs, 256, l), 256, 0, l.stream>>>(
          static_cast<const T*>(x), freqs, static_cast<T*>(y), packs, tokens, channels, d);
    }
    LATENT_CUDA_CHECK_LAUNCH("dit_rope_kernel");
    return ok_status();
  });
}

namespace {

template <bool kCodes>
Status joint_qk(const void* img, const void* txt, const void* gamma_img, const void* gamma_txt,
                const float* freqs, void* y, int64_t batch, int64_t t_img, int64_t t_txt, int heads,
                int64_t d, float eps, float descale, DType dtype, const Launch& l) {
  const int64_t items = batch * (t_img + t_txt) * heads;
  if (items <= 0) return ok_status();
  if (d % 2 != 0 || d > 0x7fffffff) return Status::errorf("joint_qk: head size ", d);
  if (reinterpret_cast<uintptr_t>(freqs) % 8 != 0)
    return Status::error("joint_qk: freqs are not 8-byte aligned (a view at an odd offset?)");
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    const bool vec = d % kPack == 0 && aligned16(img) && aligned16(txt) && aligned16(y) &&
                     aligned16(gamma_img) && aligned16(gamma_txt);
    auto go = [&](auto lanes) {
      constexpr int L = decltype(lanes)::value;
      dit_joint_qk_vec_kernel<T, L, kCodes><<<grid_for(items * L, 256, l), 256, 0, l.stream>>>(
          static_cast<const T*>(img), static_cast<const T*>(txt), static_cast<const T*>(gamma_img),
          static_cast<const T*>(gamma_txt), freqs, y, batch, t_img, t_txt, heads, eps, descale);
      LATENT_CUDA_CHECK_LAUNCH("dit_joint_qk_vec_kernel");
      return ok_status();
    };
    if (vec) {
      switch (d / kPack) {  // lanes a head: a power of two up to a warp
        case 4: return go(std::integral_constant<int, 4>{});
        case 8: return go(std::integral_constant<int, 8>{});
        case 16: return go(std::integral_constant<int, 16>{});
        case 32: return go(std::integral_constant<int, 32>{});
        default: break;
      }
    }
    dit_joint_qk_kernel<T, kCodes><<<grid_for(items * 32, 256, l), 256, 0, l.stream>>>(
        static_cast<const T*>(img), static_cast<const T*>(txt), static_cast<const T*>(gamma_img),
        static_cast<const T*>(gamma_txt), freqs, y, batch, t_img, t_txt, heads, static_cast<int>(d),
        eps, descale);
    LATENT_CUDA_CHECK_LAUNCH("dit_joint_qk_kernel");
    return ok_status();
  });
}

}  // namespace

Status launch_dit_joint_qk(const void* img, const void* txt, const void* gamma_img,
                           const void* gamma_txt, const float* freqs, void* y, int64_t batch,
                           int64_t t_img, int64_t t_txt, int heads, int64_t d, float eps,
                           DType dtype, const Launch& l) {
  return joint_qk<false>(img, txt, gamma_img, gamma_txt, freqs, y, batch, t_img, t_txt, heads, d,
                         eps, 1.f, dtype, l);
}

Status launch_dit_joint_qk_codes(const void* img, const void* txt, const void* gamma_img,
                                 const void* gamma_txt, const float* freqs, uint8_t* codes,
                                 float descale, int64_t batch, int64_t t_img, int64_t t_txt,
                                 int heads, int64_t d, float eps, DType dtype, const Launch& l) {
  if (!(descale > 0.f) || !std::isfinite(descale))
    return Status::errorf("joint_qk_fp8: scale ", descale, " is not a positive number");
  return joint_qk<true>(img, txt, gamma_img, gamma_txt, freqs, codes, batch, t_img, t_txt, heads, d,
                        eps, descale, dtype, l);
}

}  // namespace latent::cuda
