// One block per row (grid-stride over rows): the row's largest magnitude (16-byte loads, a
// warp then a block reduction), then the row divided by its scale and converted pairwise by
// cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float2_to_fp8x2). Rows up to 8,192 bf16 values stay in
// registers between the two (one read of the row); longer ones are read again, from L2 (on the
// H100 a 4,096 x 12,288 input took 81 us read twice, 112 us held in 64 registers a thread).
#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/fp8_codes.cuh"
#include "engine/backends/cuda/fp8_quant.cuh"

namespace latent::cuda {
namespace {

constexpr int kThreads = 256;

// The row's scale from its largest magnitude's bits, reduced over the block; every thread gets
// it. `m`: this thread's largest |v| bits.
__device__ __forceinline__ float row_scale(unsigned m, unsigned* warp_bits, float* shared_scale) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) warp_bits[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned all = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) all = max(all, warp_bits[w]);
    *shared_scale = fp8_scale_of_bits(all);
  }
  __syncthreads();
  const float scale = *shared_scale;
  __syncthreads();  // warp_bits and shared_scale are reused by the block's next row
  return scale;
}

// P > 0: each thread keeps its (at most P) packs of the row in registers between the two
// phases, so the row is read from memory once (cols <= kThreads * V * P). P == 0: any length,
// the row read twice (the second time mostly from L2).
template <typename T, int V, int P>
__global__ void __launch_bounds__(kThreads)
    fp8_rows_kernel(const T* __restrict__ x, uint8_t* __restrict__ codes,
                    float* __restrict__ scales, int64_t rows, int cols) {
  __shared__ unsigned warp_bits[kThreads / 32];
  __shared__ float shared_scale;
  const int steps = cols / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    uint8_t* qr = codes + r * cols;
    unsigned m = 0;
    if constexpr (P > 0) {
      float v[P][V];
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int s = threadIdx.x + i * kThreads;
        if (s < steps) {
          load_floats<T, V>(xr + s * V, v[i]);
#pragma unroll
          for (int j = 0; j < V; ++j) m = max(m, fp8_magnitude_bits(v[i][j]));
        }
      }
      const float scale = row_scale(m, warp_bits, &shared_scale);
      if (threadIdx.x == 0) scales[r] = scale;
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int s = threadIdx.x + i * kThreads;
        if (s < steps) fp8_store_codes<V>(qr + s * V, v[i], scale);
      }
    } else {
      for (int s = threadIdx.x; s < steps; s += kThreads) {
        float v[V];
        load_floats<T, V>(xr + s * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) m = max(m, fp8_magnitude_bits(v[j]));
      }
      const float scale = row_scale(m, warp_bits, &shared_scale);
      if (threadIdx.x == 0) scales[r] = scale;
      for (int s = threadIdx.x; s < steps; s += kThreads) {
        float v[V];
        load_floats<T, V>(xr + s * V, v);
        fp8_store_codes<V>(qr + s * V, v, scale);
      }
    }
  }
}

template <typename T, int V>
void launch_rows(const T* x, uint8_t* codes, float* scales, int64_t rows, int cols,
                 unsigned blocks, cudaStream_t stream) {
  const int per_thread = (cols / V + kThreads - 1) / kThreads;
  if (per_thread <= 1)
    fp8_rows_kernel<T, V, 1><<<blocks, kThreads, 0, stream>>>(x, codes, scales, rows, cols);
  else if (per_thread <= 2)
    fp8_rows_kernel<T, V, 2><<<blocks, kThreads, 0, stream>>>(x, codes, scales, rows, cols);
  else if (per_thread <= 4)
    fp8_rows_kernel<T, V, 4><<<blocks, kThreads, 0, stream>>>(x, codes, scales, rows, cols);
  else
    fp8_rows_kernel<T, V, 0><<<blocks, kThreads, 0, stream>>>(x, codes, scales, rows, cols);
}

// blockIdx.y + first picks q, k or v (first 2: v alone); grid-stride over its packs of V values
// (n a multiple of V, 16-byte aligned when V > 1); one atomicMax a block.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    fp8_amax3_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     int64_t nq, int64_t nkv, unsigned* __restrict__ amax_bits, int first) {
  __shared__ unsigned warp_bits[kThreads / 32];
  const int t = static_cast<int>(blockIdx.y) + first;
  const T* x = t == 0 ? q : t == 1 ? k : v;
  const int64_t packs = (t == 0 ? nq : nkv) / V;
  unsigned m = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float f[V];
    load_floats<T, V>(x + i * V, f);
#pragma unroll
    for (int j = 0; j < V; ++j) m = max(m, fp8_magnitude_bits(f[j]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) warp_bits[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned all = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) all = max(all, warp_bits[w]);
    atomicMax(amax_bits + t, all);
  }
}

// blockIdx.y + first < 3: q, k or v coded with its tensor scale (packs of V as above); == 3: the
// scalars and the output's row scales. q_descale / k_descale: null (from their amax), or where
// q and k, coded already (first 2), keep their one scale.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    fp8_codes3_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      int64_t nq, int64_t nkv, uint8_t* __restrict__ q8, uint8_t* __restrict__ k8,
                      uint8_t* __restrict__ v8, float* __restrict__ scalars,
                      float* __restrict__ o_row_scales, int64_t o_rows, int first,
                      const float* __restrict__ q_descale, const float* __restrict__ k_descale) {
  const unsigned* amax_bits = reinterpret_cast<const unsigned*>(scalars) + kFp8AmaxQ;
  const float descale_v = fp8_scale_of_bits(amax_bits[2]);
  const float descale_o = descale_v * 1.125f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first_item = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  const int t = static_cast<int>(blockIdx.y) + first;
  if (t == 3) {
    if (first_item == 0) {
      for (int u = 0; u < 3; ++u) scalars[kFp8DescaleQ + u] = fp8_scale_of_bits(amax_bits[u]);
      if (q_descale) scalars[kFp8DescaleQ] = *q_descale;
      if (k_descale) scalars[kFp8DescaleQ + 1] = *k_descale;
      scalars[kFp8DescaleS] = 1.f / 448.f;
      scalars[kFp8ScaleS] = 448.f;
      scalars[kFp8ScaleO] = 1.f / descale_o;
      scalars[kFp8DescaleO] = descale_o;
    }
    if (o_row_scales)
      for (int64_t r = first_item; r < o_rows; r += stride) o_row_scales[r] = descale_o;
    return;
  }
  const T* x = t == 0 ? q : t == 1 ? k : v;
  uint8_t* codes = t == 0 ? q8 : t == 1 ? k8 : v8;
  const int64_t packs = (t == 0 ? nq : nkv) / V;
  const float scale = fp8_scale_of_bits(amax_bits[t]);
  for (int64_t i = first_item; i < packs; i += stride) {
    float f[V];
    load_floats<T, V>(x + i * V, f);
    fp8_store_codes<V>(codes + i * V, f, scale);
  }
}

// first 0: q, k and v; first 2: v alone (q and k coded already, their descales given).
template <typename T, int V>
Status launch_attention_inputs(const void* q, const void* k, const void* v, int64_t nq, int64_t nkv,
                               uint8_t* q8, uint8_t* k8, uint8_t* v8, float* scalars,
                               float* o_row_scales, int64_t o_rows, int first,
                               const float* q_descale, const float* k_descale, const Launch& l) {
  const int64_t packs = ((first == 0 && nq > nkv) ? nq : nkv) / V;
  const unsigned blocks = grid_for(packs, kThreads, l, 4);
  fp8_amax3_kernel<T, V><<<dim3(blocks, 3 - first), kThreads, 0, l.stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), nq, nkv,
      reinterpret_cast<unsigned*>(scalars) + kFp8AmaxQ, first);
  LATENT_CUDA_CHECK_LAUNCH("fp8 attention amax");
  fp8_codes3_kernel<T, V><<<dim3(blocks, 4 - first), kThreads, 0, l.stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), nq, nkv, q8, k8,
      v8, scalars, o_row_scales, o_rows, first, q_descale, k_descale);
  LATENT_CUDA_CHECK_LAUNCH("fp8 attention codes");
  return ok_status();
}

}  // namespace

Status launch_fp8_attention_inputs(const void* q, const void* k, const void* v, int64_t nq,
                                   int64_t nkv, DType dtype, uint8_t* q8, uint8_t* k8, uint8_t* v8,
                                   float* scalars, float* o_row_scales, int64_t o_rows,
                                   const Launch& l) {
  if (nq <= 0 || nkv <= 0) return Status::errorf("fp8 attention: ", nq, " / ", nkv, " elements");
  LATENT_CUDA_CHECK(cudaMemsetAsync(scalars, 0, kFp8Scalars * sizeof(float), l.stream));
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    const bool vec = nq % kPack == 0 && nkv % kPack == 0 && aligned16(q) && aligned16(k) &&
                     aligned16(v) && aligned16(q8) && aligned16(k8) && aligned16(v8);
    return vec ? launch_attention_inputs<T, kPack>(q, k, v, nq, nkv, q8, k8, v8, scalars,
                                                   o_row_scales, o_rows, 0, nullptr, nullptr, l)
               : launch_attention_inputs<T, 1>(q, k, v, nq, nkv, q8, k8, v8, scalars, o_row_scales,
                                               o_rows, 0, nullptr, nullptr, l);
  });
}

Status launch_fp8_attention_v(const void* v, int64_t nkv, DType dtype, uint8_t* v8,
                              const float* q_descale, const float* k_descale, float* scalars,
                              float* o_row_scales, int64_t o_rows, const Launch& l) {
  if (nkv <= 0) return Status::errorf("fp8 attention: v has ", nkv, " elements");
  LATENT_CUDA_CHECK(cudaMemsetAsync(scalars, 0, kFp8Scalars * sizeof(float), l.stream));
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    const bool vec = nkv % kPack == 0 && aligned16(v) && aligned16(v8);
    return vec ? launch_attention_inputs<T, kPack>(nullptr, nullptr, v, 0, nkv, nullptr, nullptr,
                                                   v8, scalars, o_row_scales, o_rows, 2, q_descale,
                                                   k_descale, l)
               : launch_attention_inputs<T, 1>(nullptr, nullptr, v, 0, nkv, nullptr, nullptr, v8,
                                               scalars, o_row_scales, o_rows, 2, q_descale,
                                               k_descale, l);
  });
}

namespace {

__global__ void fp8_fill_kernel(float* __restrict__ p, int64_t n, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

template <typename T>
__global__ void fp8_dequantize_kernel(const uint8_t* __restrict__ codes,
                                      const float* __restrict__ scales, int64_t n, int64_t cols,
                                      T* __restrict__ y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    __nv_fp8_e4m3 c;
    c.__x = codes[i];
    y[i] = from_f32<T>(static_cast<float>(c) * scales[i / cols]);
  }
}

template <typename T>
__global__ void fp8_gate_scales_kernel(const float* __restrict__ w_scales,
                                       const T* __restrict__ gate, const T* __restrict__ bias,
                                       int64_t n, float* __restrict__ out_scales,
                                       T* __restrict__ out_bias) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]);
    out_scales[i] = w_scales[i] * g;
    if (bias) out_bias[i] = from_f32<T>(to_f32(bias[i]) * g);
  }
}

}  // namespace

Status launch_fp8_gate_scales(const float* w_scales, const void* gate, const void* bias, int64_t n,
                              DType dtype, float* out_scales, void* out_bias, const Launch& l) {
  if (n <= 0) return ok_status();
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    fp8_gate_scales_kernel<T><<<grid_for(n, kThreads, l), kThreads, 0, l.stream>>>(
        w_scales, static_cast<const T*>(gate), static_cast<const T*>(bias), n, out_scales,
        static_cast<T*>(out_bias));
    LATENT_CUDA_CHECK_LAUNCH("fp8 gate scales");
    return ok_status();
  });
}

Status launch_fp8_fill(float* p, int64_t n, float value, const Launch& l) {
  if (n <= 0) return ok_status();
  fp8_fill_kernel<<<grid_for(n, kThreads, l), kThreads, 0, l.stream>>>(p, n, value);
  LATENT_CUDA_CHECK_LAUNCH("fp8 fill");
  return ok_status();
}

Status launch_fp8_dequantize_rows(const uint8_t* codes, const float* scales, int64_t rows,
                                  int64_t cols, DType dtype, void* y, const Launch& l) {
  const int64_t n = rows * cols;
  if (n <= 0) return ok_status();
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    fp8_dequantize_kernel<T><<<grid_for(n, kThreads, l), kThreads, 0, l.stream>>>(
        codes, scales, n, cols, static_cast<T*>(y));
    LATENT_CUDA_CHECK_LAUNCH("fp8 dequantize");
    return ok_status();
  });
}

Status launch_fp8_quantize_rows(const void* x, DType dtype, int64_t rows, int64_t cols,
                                uint8_t* codes, float* scales, const Launch& l) {
  if (rows <= 0 || cols <= 0) return ok_status();
  if (cols > 0x7fffffff) return Status::errorf("fp8_quantize_rows: ", cols, " columns");
  const int64_t cap = static_cast<int64_t>(l.sm_count) * 16;
  const unsigned blocks = static_cast<unsigned>(rows < cap ? rows : cap);
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    // Packs need 16-byte aligned rows of whole packs; the codes then land on 8- (4-) byte
    // boundaries as long as their base is 16-byte aligned.
    const bool vec = cols % kPack == 0 && aligned16(x) && aligned16(codes);
    if (vec)
      launch_rows<T, kPack>(static_cast<const T*>(x), codes, scales, rows, static_cast<int>(cols),
                            blocks, l.stream);
    else
      launch_rows<T, 1>(static_cast<const T*>(x), codes, scales, rows, static_cast<int>(cols),
                        blocks, l.stream);
    LATENT_CUDA_CHECK_LAUNCH("fp8_quantize_rows");
    return ok_status();
  });
}

}  // namespace latent::cuda
