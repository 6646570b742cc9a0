// LayerNorm / RMSNorm over the last dim, fused with the affine and the AdaLN modulation.
// Statistics take two passes over the row (mean, then squared deviations: no cancellation when
// the mean is large). Two kernels:
//  - dit_norm_rows_kernel (rows of 64 to 1,024 packs of 16 bytes, e.g. the DiT's 3,072
//    channels): one block of 128 threads a row, the row held in registers (read once), block-
//    wide reductions. A block a row keeps short tensors (the text stream's ~100 tokens) spread
//    over the GPU, where a warp a row left 12 blocks on 132 SMs (22 us for 96 rows on an H100).
//  - dit_norm_kernel (any other row): one warp a row, the passes over the row from L1.
#include <type_traits>

#include "engine/backends/cuda/dit_common.cuh"
#include "engine/backends/cuda/fp8_codes.cuh"

namespace latent::cuda {
namespace {

struct NormArgs {
  const void* x;
  void* y;
  int64_t rows;
  int d;
  DitNorm norm;
  float eps;
  const void* gamma;
  const void* beta;
  const void* shift;
  const void* scale;
  DitGroups groups;
  // With codes: the output row quantised to FP8 (fp8_codes.cuh) into codes [rows][d] and
  // scales [rows] instead of stored in T (y unused): one more pass over the row in L1 for its
  // largest magnitude.
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  // Elements from one row of y to the next (>= d; more for a wide input, Backend::
  // layer_norm_modulate_wide).
  int64_t y_pitch = 0;
};

// Pack i (V elements, already loaded into v) of a row normalised and modulated in place:
// (v - mean) * inv, then gamma, beta, (1 + scale) and shift where given; `crow` is the row's
// condition row offset (dit_condition_row * d). Both kernels below run it per element alike.
template <typename T, int V>
__device__ __forceinline__ void norm_affine_modulate(const NormArgs& a, int i, int64_t crow,
                                                     float mean, float inv, float (&v)[V]) {
  float p[V];
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = (v[j] - mean) * inv;
  if (a.gamma) {
    load_floats<T, V>(static_cast<const T*>(a.gamma) + i * V, p);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] *= p[j];
  }
  if (a.beta) {
    load_floats<T, V>(static_cast<const T*>(a.beta) + i * V, p);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] += p[j];
  }
  if (a.scale) {
    load_floats<T, V>(static_cast<const T*>(a.scale) + crow + i * V, p);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = fmaf(v[j], p[j], v[j]);  // v (1 + scale)
  }
  if (a.shift) {
    load_floats<T, V>(static_cast<const T*>(a.shift) + crow + i * V, p);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] += p[j];
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(256) dit_norm_kernel(const NormArgs a) {
  const T* __restrict__ x = static_cast<const T*>(a.x);
  T* __restrict__ y = static_cast<T*>(a.y);
  const int lane = threadIdx.x & 31;
  const int64_t first = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  const int d = a.d, steps = d / V;
  const float inv_d = 1.f / static_cast<float>(d);
  for (int64_t r = first; r < a.rows; r += warps) {
    const T* xr = x + r * d;
    T* yr = y + r * a.y_pitch;
    float mean = 0.f, inv = 1.f;
    if (a.norm == DitNorm::kLayer) {
      float s = 0.f;
      for (int i = lane; i < steps; i += 32) {
        float v[V];
        load_floats<T, V>(xr + i * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) s += v[j];
      }
      mean = warp_sum(s) * inv_d;
      float q = 0.f;
      for (int i = lane; i < steps; i += 32) {
        float v[V];
        load_floats<T, V>(xr + i * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) q = fmaf(v[j] - mean, v[j] - mean, q);
      }
      inv = rsqrtf(warp_sum(q) * inv_d + a.eps);
    } else if (a.norm == DitNorm::kRms) {
      float q = 0.f;
      for (int i = lane; i < steps; i += 32) {
        float v[V];
        load_floats<T, V>(xr + i * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) q = fmaf(v[j], v[j], q);
      }
      inv = rsqrtf(warp_sum(q) * inv_d + a.eps);
    }
    const int64_t crow = (a.shift || a.scale) ? dit_condition_row(a.groups, r) * d : 0;
    // The V outputs of pack i of the row.
    auto values = [&](int i, float (&v)[V]) {
      load_floats<T, V>(xr + i * V, v);
      norm_affine_modulate<T, V>(a, i, crow, mean, inv, v);
    };
    if (a.codes) {
      unsigned m = 0;
      for (int i = lane; i < steps; i += 32) {
        float v[V];
        values(i, v);
#pragma unroll
        for (int j = 0; j < V; ++j) m = max(m, fp8_magnitude_bits(v[j]));
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
      const float s = fp8_scale_of_bits(m);
      if (lane == 0) a.scales[r] = s;
      for (int i = lane; i < steps; i += 32) {
        float v[V];
        values(i, v);
        fp8_store_codes<V>(a.codes + r * d + i * V, v, s);
      }
    } else {
      for (int i = lane; i < steps; i += 32) {
        float v[V];
        values(i, v);
        store_floats<T, V>(yr + i * V, v);
      }
    }
  }
}

constexpr int kRowThreads = 128;
constexpr int kRowWarps = kRowThreads / 32;

// Sum / max of v over the block (kRowThreads); `sh` holds kRowWarps partials. Every thread gets
// the result. The leading barrier lets consecutive calls reuse `sh`.
__device__ __forceinline__ float row_block_sum(float v, float* sh) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < kRowWarps; ++i) t += sh[i];
  return t;
}
__device__ __forceinline__ unsigned row_block_max(unsigned m, unsigned* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = m;
  __syncthreads();
  unsigned t = 0u;
#pragma unroll
  for (int i = 0; i < kRowWarps; ++i) t = max(t, sh[i]);
  return t;
}

// One block a row; thread t holds packs t, t + 128, ... (P of them, V elements each) of the
// row in registers. The same arithmetic as dit_norm_kernel per element; the sums are taken in
// another order.
template <typename T, int V, int P>
__global__ void __launch_bounds__(kRowThreads) dit_norm_rows_kernel(const NormArgs a) {
  const T* __restrict__ x = static_cast<const T*>(a.x);
  T* __restrict__ y = static_cast<T*>(a.y);
  __shared__ float shf[kRowWarps];
  __shared__ unsigned shu[kRowWarps];
  const int tid = threadIdx.x, d = a.d, packs = d / V;
  const float inv_d = 1.f / static_cast<float>(d);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* xr = x + r * d;
    float v[P][V];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int i = tid + k * kRowThreads;
      if (i < packs) {
        load_floats<T, V>(xr + i * V, v[k]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = 0.f;
      }
    }
    float mean = 0.f, inv = 1.f;
    if (a.norm == DitNorm::kLayer) {
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < P; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) s += v[k][j];
      mean = row_block_sum(s, shf) * inv_d;
      float q = 0.f;
#pragma unroll
      for (int k = 0; k < P; ++k) {
        if (tid + k * kRowThreads >= packs) continue;
#pragma unroll
        for (int j = 0; j < V; ++j) q = fmaf(v[k][j] - mean, v[k][j] - mean, q);
      }
      inv = rsqrtf(row_block_sum(q, shf) * inv_d + a.eps);
    } else if (a.norm == DitNorm::kRms) {
      float q = 0.f;
#pragma unroll
      for (int k = 0; k < P; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) q = fmaf(v[k][j], v[k][j], q);
      inv = rsqrtf(row_block_sum(q, shf) * inv_d + a.eps);
    }
    const int64_t crow = (a.shift || a.scale) ? dit_condition_row(a.groups, r) * d : 0;
    unsigned m = 0u;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int i = tid + k * kRowThreads;
      if (i >= packs) continue;
      norm_affine_modulate<T, V>(a, i, crow, mean, inv, v[k]);
      if (a.codes) {
#pragma unroll
        for (int j = 0; j < V; ++j) m = max(m, fp8_magnitude_bits(v[k][j]));
      } else {
        store_floats<T, V>(y + r * a.y_pitch + i * V, v[k]);
      }
    }
    if (a.codes) {
      const float s = fp8_scale_of_bits(row_block_max(m, shu));
      if (tid == 0) a.scales[r] = s;
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const int i = tid + k * kRowThreads;
        if (i < packs) fp8_store_codes<V>(a.codes + r * d + i * V, v[k], s);
      }
    }
  }
}

}  // namespace

Status launch_dit_norm(const void* x, void* y, int64_t rows, int64_t d, DitNorm norm, float eps,
                       const void* gamma, const void* beta, const void* shift, const void* scale,
                       const DitGroups& groups, DType dtype, const Launch& l, uint8_t* codes,
                       float* scales, int64_t y_pitch) {
  if (rows <= 0 || d <= 0) return ok_status();
  if (d > 0x7fffffff) return Status::errorf("dit norm: rows of ", d, " elements are too long");
  if (y_pitch == 0) y_pitch = d;
  if (y_pitch < d)
    return Status::errorf("dit norm: output rows ", y_pitch, " apart overlap rows of ", d);
  const NormArgs args{
      x,     y,      rows,   static_cast<int>(d), norm, eps, gamma, beta, shift, scale, groups,
      codes, scales, y_pitch};
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    // Packs of codes (V bytes) need their row starts V-aligned: d % V == 0 and codes 16-aligned.
    const bool vec = d % kPack == 0 && y_pitch % kPack == 0 && aligned16(x) &&
                     (codes ? aligned16(codes) : aligned16(y)) && (!gamma || aligned16(gamma)) &&
                     (!beta || aligned16(beta)) && (!shift || aligned16(shift)) &&
                     (!scale || aligned16(scale));
    const int64_t packs = d / kPack;
    if (vec && packs >= 64 && packs <= 8 * kRowThreads) {
      const int64_t cap = static_cast<int64_t>(l.sm_count) * 16;
      const unsigned blocks = static_cast<unsigned>(rows < cap ? rows : cap);
      const int per = static_cast<int>((packs + kRowThreads - 1) / kRowThreads);
      auto go = [&](auto p) {
        dit_norm_rows_kernel<T, kPack, decltype(p)::value><<<blocks, kRowThreads, 0, l.stream>>>(
            args);
      };
      switch (per) {
        case 1: go(std::integral_constant<int, 1>{}); break;
        case 2: go(std::integral_constant<int, 2>{}); break;
        case 3: go(std::integral_constant<int, 3>{}); break;
        case 4: go(std::integral_constant<int, 4>{}); break;
        case 5:
        case 6: go(std::integral_constant<int, 6>{}); break;
        default: go(std::integral_constant<int, 8>{}); break;
      }
      LATENT_CUDA_CHECK_LAUNCH("dit_norm_rows_kernel");
      return ok_status();
    }
    const unsigned blocks = grid_for(rows * 32, 256, l);
    if (vec)
      dit_norm_kernel<T, kPack><<<blocks, 256, 0, l.stream>>>(args);
    else
      dit_norm_kernel<T, 1><<<blocks, 256, 0, l.stream>>>(args);
    LATENT_CUDA_CHECK_LAUNCH("dit_norm_kernel");
    return ok_status();
  });
}

}  // namespace latent::cuda
