// One block per row (grid-stride over rows): the row's largest magnitude (16-byte loads, a
// warp then a block reduction), then the row again (from L1/L2) divided by its scale and
// converted pairwise by cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float2_to_fp8x2).
#include <cuda_fp8.h>

#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/fp8_quant.cuh"

namespace latent::cuda {
namespace {

constexpr int kThreads = 256;

// The bits of |v| order like the magnitudes, and every NaN above +inf (0x7f800000).
__device__ __forceinline__ unsigned magnitude_bits(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}

template <typename T, int V>
__global__ void fp8_rows_kernel(const T* __restrict__ x, uint8_t* __restrict__ codes,
                                float* __restrict__ scales, int64_t rows, int cols) {
  __shared__ unsigned warp_max_bits[kThreads / 32];
  __shared__ float row_scale;
  const int steps = cols / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    unsigned m = 0;
    for (int s = threadIdx.x; s < steps; s += kThreads) {
      float v[V];
      load_floats<T, V>(xr + s * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) m = max(m, magnitude_bits(v[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) warp_max_bits[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned all = 0;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) all = max(all, warp_max_bits[w]);
      const float amax = __uint_as_float(all);
      const float scale = all >= 0x7f800000u ? __uint_as_float(0x7fc00000u)  // NaN / inf
                          : all == 0u        ? 1.f
                                             : __fdiv_rn(amax, 448.f);
      row_scale = scale;
      scales[r] = scale;
    }
    __syncthreads();
    const float scale = row_scale;
    uint8_t* qr = codes + r * cols;
    for (int s = threadIdx.x; s < steps; s += kThreads) {
      float v[V];
      load_floats<T, V>(xr + s * V, v);
      if constexpr (V == 1) {
        qr[s] = static_cast<uint8_t>(
            __nv_cvt_float_to_fp8(__fdiv_rn(v[0], scale), __NV_SATFINITE, __NV_E4M3));
      } else {
        static_assert(V % 2 == 0, "pairs");
        // V codes: 8 bytes (bf16 / fp16 packs) or 4 (fp32 packs).
        uint16_t pairs[V / 2];
#pragma unroll
        for (int j = 0; j < V / 2; ++j)
          pairs[j] = __nv_cvt_float2_to_fp8x2(
              make_float2(__fdiv_rn(v[2 * j], scale), __fdiv_rn(v[2 * j + 1], scale)),
              __NV_SATFINITE, __NV_E4M3);
        if constexpr (V == 8) {
          uint2 out;
          out.x = pairs[0] | (static_cast<unsigned>(pairs[1]) << 16);
          out.y = pairs[2] | (static_cast<unsigned>(pairs[3]) << 16);
          *reinterpret_cast<uint2*>(qr + s * V) = out;
        } else {
          *reinterpret_cast<unsigned*>(qr + s * V) =
              pairs[0] | (static_cast<unsigned>(pairs[1]) << 16);
        }
      }
    }
    __syncthreads();  // row_scale and warp_max_bits are reused by the next row
  }
}

}  // namespace

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
      fp8_rows_kernel<T, kPack><<<blocks, kThreads, 0, l.stream>>>(
          static_cast<const T*>(x), codes, scales, rows, static_cast<int>(cols));
    else
      fp8_rows_kernel<T, 1><<<blocks, kThreads, 0, l.stream>>>(static_cast<const T*>(x), codes,
                                                              scales, rows, static_cast<int>(cols));
    LATENT_CUDA_CHECK_LAUNCH("fp8_quantize_rows");
    return ok_status();
  });
}

}  // namespace latent::cuda
