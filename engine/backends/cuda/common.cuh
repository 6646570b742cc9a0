// Device-side helpers shared by the kernels (.cu files only): element conversions, 16-byte
// packs, activations, warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/launch.h"

namespace latent::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// Element i of an NHWC tensor [n][h][w][units] (a grid-stride loop's index over its units):
// its image b, row y, column x and unit u of the pixel.
struct NhwcIndex {
  int64_t b, y, x, u;
};
__device__ __forceinline__ NhwcIndex nhwc_index(int64_t i, int64_t h, int64_t w, int64_t units) {
  int64_t rest = i / units;
  const int64_t u = i - rest * units;
  const int64_t x = rest % w;
  rest /= w;
  return {rest / h, rest % h, x, u};
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(f16 v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ f16 from_f32<f16>(float v) {
  return __float2half_rn(v);
}

// 16 bytes of T: one 128-bit load or store when the address is 16-byte aligned.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& v) {
  *reinterpret_cast<Pack<T>*>(p) = v;
}

// V consecutive elements as fp32: one 16-byte pack when V is a pack's length, else one element.
template <typename T, int V>
__device__ __forceinline__ void load_floats(const T* p, float (&v)[V]) {
  static_assert(V == 1 || V == Pack<T>::kN, "a pack or a single element");
  if constexpr (V == 1) {
    v[0] = to_f32(*p);
  } else {
    const Pack<T> q = load_pack(p);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = to_f32(q.v[j]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_floats(T* p, const float (&v)[V]) {
  static_assert(V == 1 || V == Pack<T>::kN, "a pack or a single element");
  if constexpr (V == 1) {
    *p = from_f32<T>(v[0]);
  } else {
    Pack<T> q;
#pragma unroll
    for (int j = 0; j < V; ++j) q.v[j] = from_f32<T>(v[j]);
    store_pack(p, q);
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Whether the current device runs sm_90a machine code (the wgmma kernels): compute capability
// 9.0 only.
inline bool current_device_runs_sm90a() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

// The activations of backend.h, in fp32 (GELU is the exact erf form, as torch's default).
__device__ __forceinline__ float activate(float v, Activation act) {
  switch (act) {
    case Activation::kNone:
      return v;
    case Activation::kSiLU:
      // The hardware exp2 and reciprocal (~2 ulp), as conv_wgmma's epilogue has it; -v clamped
      // to 80 keeps the divisor below __fdividef's 2^126 limit. With the IEEE division and expf
      // the Wan channel norm took 138 us a 96-channel 720p call against 97 without SiLU; now
      // 100 (H200, bench_norm, session 25).
      return __fdividef(v, 1.f + __expf(fminf(-v, 80.f)));
    case Activation::kReLU:
      return fmaxf(v, 0.f);
    case Activation::kGELU:
      return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case Activation::kTanh:
      return tanhf(v);
  }
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace latent::cuda

// Instantiates a dtype switch: `F<T>` is called with T = float, bf16 or f16.
#define LATENT_DISPATCH_DTYPE(dtype, T, ...)         \
  [&]() -> ::latent::Status {                        \
    switch (dtype) {                                 \
      case ::latent::DType::kF32: {                  \
        using T = float;                             \
        return __VA_ARGS__();                        \
      }                                              \
      case ::latent::DType::kBF16: {                 \
        using T = ::latent::cuda::bf16;              \
        return __VA_ARGS__();                        \
      }                                              \
      case ::latent::DType::kF16: {                  \
        using T = ::latent::cuda::f16;               \
        return __VA_ARGS__();                        \
      }                                              \
    }                                                \
    return ::latent::Status::error("unknown dtype"); \
  }()
