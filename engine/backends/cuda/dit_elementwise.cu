// Elementwise DiT kernels: bias + activation (linear's unfused epilogue, dit_activation),
// gated residual add, scaled add, and classifier-free guidance with its norm rescale (one warp
// a row). 16-byte loads and stores where every buffer is aligned and rows hold whole packs.
#include "engine/backends/cuda/dit_common.cuh"

namespace latent::cuda {
namespace {

template <typename T, int V>
__global__ void __launch_bounds__(256)
    dit_bias_act_kernel(const T* x, const T* __restrict__ bias, T* y, int64_t packs, int64_t cols,
                        DitActivation act) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < packs;
       p += int64_t{gridDim.x} * blockDim.x) {
    float v[V];
    load_floats<T, V>(x + p * V, v);
    if (bias) {
      float b[V];
      load_floats<T, V>(bias + (p * V) % cols, b);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] += b[j];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = dit_activate(v[j], act);
    store_floats<T, V>(y + p * V, v);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(256)
    dit_gated_add_kernel(const T* __restrict__ residual, const T* __restrict__ x,
                         const T* __restrict__ gate, T* __restrict__ y, int64_t packs, int64_t d,
                         const DitGroups groups) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < packs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = p * V, row = e / d, col = e - row * d;
    float r[V], v[V], g[V];
    load_floats<T, V>(residual + e, r);
    load_floats<T, V>(x + e, v);
    load_floats<T, V>(gate + dit_condition_row(groups, row) * d + col, g);
#pragma unroll
    for (int j = 0; j < V; ++j) r[j] = fmaf(g[j], v[j], r[j]);
    store_floats<T, V>(y + e, r);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(256)
    dit_scaled_add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                          int64_t packs, float alpha, float beta) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < packs;
       p += int64_t{gridDim.x} * blockDim.x) {
    float u[V], w[V];
    load_floats<T, V>(a + p * V, u);
    load_floats<T, V>(b + p * V, w);
#pragma unroll
    for (int j = 0; j < V; ++j) u[j] = fmaf(alpha, u[j], beta * w[j]);
    store_floats<T, V>(y + p * V, u);
  }
}

// One warp a row: norms of cond and of the combination, then the rescaled combination.
template <typename T, int V>
__global__ void __launch_bounds__(256)
    dit_cfg_kernel(const T* __restrict__ cond, const T* __restrict__ uncond, T* __restrict__ y,
                   int64_t rows, int cols, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t first = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  const int steps = cols / V;
  for (int64_t r = first; r < rows; r += warps) {
    const T* cr = cond + r * cols;
    const T* ur = uncond + r * cols;
    float cn = 0.f, mn = 0.f;
    for (int i = lane; i < steps; i += 32) {
      float c[V], u[V];
      load_floats<T, V>(cr + i * V, c);
      load_floats<T, V>(ur + i * V, u);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float m = fmaf(scale, c[j] - u[j], u[j]);
        cn = fmaf(c[j], c[j], cn);
        mn = fmaf(m, m, mn);
      }
    }
    // As diffusers: no guard, a zero combination gives NaN there too.
    const float ratio = sqrtf(warp_sum(cn)) / sqrtf(warp_sum(mn));
    for (int i = lane; i < steps; i += 32) {
      float c[V], u[V];
      load_floats<T, V>(cr + i * V, c);
      load_floats<T, V>(ur + i * V, u);
#pragma unroll
      for (int j = 0; j < V; ++j) c[j] = fmaf(scale, c[j] - u[j], u[j]) * ratio;
      store_floats<T, V>(y + r * cols + i * V, c);
    }
  }
}

}  // namespace

Status launch_dit_bias_act(const void* x, const void* bias, void* y, int64_t n, int64_t cols,
                           DitActivation act, DType dtype, const Launch& l) {
  if (n <= 0) return ok_status();
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    const T* px = static_cast<const T*>(x);
    const T* pb = static_cast<const T*>(bias);
    T* py = static_cast<T*>(y);
    if (n % kPack == 0 && (!bias || (cols % kPack == 0 && aligned16(bias))) && aligned16(x) &&
        aligned16(y)) {
      dit_bias_act_kernel<T, kPack>
          <<<grid_for(n / kPack, 256, l), 256, 0, l.stream>>>(px, pb, py, n / kPack, cols, act);
    } else {
      dit_bias_act_kernel<T, 1>
          <<<grid_for(n, 256, l), 256, 0, l.stream>>>(px, pb, py, n, cols, act);
    }
    LATENT_CUDA_CHECK_LAUNCH("dit_bias_act_kernel");
    return ok_status();
  });
}

Status launch_dit_gated_add(const void* residual, const void* x, const void* gate, void* y,
                            int64_t d, const DitGroups& groups, DType dtype, const Launch& l) {
  const int64_t n = groups.batch * groups.tokens * d;
  if (n <= 0) return ok_status();
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    const T* pr = static_cast<const T*>(residual);
    const T* px = static_cast<const T*>(x);
    const T* pg = static_cast<const T*>(gate);
    T* py = static_cast<T*>(y);
    if (d % kPack == 0 && aligned16(residual) && aligned16(x) && aligned16(gate) && aligned16(y)) {
      dit_gated_add_kernel<T, kPack>
          <<<grid_for(n / kPack, 256, l), 256, 0, l.stream>>>(pr, px, pg, py, n / kPack, d, groups);
    } else {
      dit_gated_add_kernel<T, 1>
          <<<grid_for(n, 256, l), 256, 0, l.stream>>>(pr, px, pg, py, n, d, groups);
    }
    LATENT_CUDA_CHECK_LAUNCH("dit_gated_add_kernel");
    return ok_status();
  });
}

Status launch_dit_scaled_add(const void* a, const void* b, void* y, int64_t n, float alpha,
                             float beta, DType dtype, const Launch& l) {
  if (n <= 0) return ok_status();
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* py = static_cast<T*>(y);
    if (n % kPack == 0 && aligned16(a) && aligned16(b) && aligned16(y)) {
      dit_scaled_add_kernel<T, kPack>
          <<<grid_for(n / kPack, 256, l), 256, 0, l.stream>>>(pa, pb, py, n / kPack, alpha, beta);
    } else {
      dit_scaled_add_kernel<T, 1>
          <<<grid_for(n, 256, l), 256, 0, l.stream>>>(pa, pb, py, n, alpha, beta);
    }
    LATENT_CUDA_CHECK_LAUNCH("dit_scaled_add_kernel");
    return ok_status();
  });
}

Status launch_dit_cfg_combine(const void* cond, const void* uncond, void* y, int64_t rows,
                              int64_t cols, float scale, DType dtype, const Launch& l) {
  if (rows <= 0 || cols <= 0) return ok_status();
  if (cols > 0x7fffffff) return Status::errorf("cfg_combine: rows of ", cols, " are too long");
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    const T* pc = static_cast<const T*>(cond);
    const T* pu = static_cast<const T*>(uncond);
    T* py = static_cast<T*>(y);
    const unsigned blocks = grid_for(rows * 32, 256, l);
    if (cols % kPack == 0 && aligned16(cond) && aligned16(uncond) && aligned16(y))
      dit_cfg_kernel<T, kPack>
          <<<blocks, 256, 0, l.stream>>>(pc, pu, py, rows, static_cast<int>(cols), scale);
    else
      dit_cfg_kernel<T, 1>
          <<<blocks, 256, 0, l.stream>>>(pc, pu, py, rows, static_cast<int>(cols), scale);
    LATENT_CUDA_CHECK_LAUNCH("dit_cfg_kernel");
    return ok_status();
  });
}

// Latent packing (QwenImagePipeline._pack_latents / _unpack_latents): one thread an element of
// the [B, C, h, w] image, which is NCHW or NHWC; element (b, c, y, x) <-> token
// (b, (y/2)(w/2) + x/2), feature 4c + 2(y%2) + x%2.
namespace {
template <typename T>
__global__ void __launch_bounds__(256)
    dit_patch_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n, int64_t c, int64_t h,
                     int64_t w, bool nhwc, bool pack) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    // i walks the image in its memory order
    int64_t b, ci, y, x, r = i;
    if (nhwc) {
      ci = r % c, r /= c;
      x = r % w, r /= w;
      y = r % h, b = r / h;
    } else {
      x = r % w, r /= w;
      y = r % h, r /= h;
      ci = r % c, b = r / c;
    }
    const int64_t token =
        (b * (h / 2) * (w / 2) + (y / 2) * (w / 2) + x / 2) * 4 * c + 4 * ci + 2 * (y % 2) + x % 2;
    if (pack)
      out[token] = in[i];
    else
      out[i] = in[token];
  }
}
}  // namespace

Status launch_dit_patch(const void* in, void* out, int64_t b, int64_t c, int64_t h, int64_t w,
                        bool nhwc, bool pack, DType dtype, const Launch& l) {
  const int64_t n = b * c * h * w;
  if (n <= 0) return ok_status();
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    dit_patch_kernel<T><<<grid_for(n, 256, l), 256, 0, l.stream>>>(
        static_cast<const T*>(in), static_cast<T*>(out), n, c, h, w, nhwc, pack);
    LATENT_CUDA_CHECK_LAUNCH("dit_patch_kernel");
    return ok_status();
  });
}

}  // namespace latent::cuda
