// Device helpers of the FP8 quantisation (backend.h, Fp8Matrix): a row's scale from its
// largest magnitude and its values as e4m3 codes. CUDA code only (the .cu kernels).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace latent::cuda {

// The bits of |v| order like the magnitudes, and every NaN above +inf (0x7f800000).
__device__ __forceinline__ unsigned fp8_magnitude_bits(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}

// A row's scale from the largest magnitude's bits: amax / 448 (IEEE division, as the host's
// fp8_e4m3_quantize_row), 1 for a zero row, NaN when the row held a NaN or an infinity.
__device__ __forceinline__ float fp8_scale_of_bits(unsigned amax_bits) {
  return amax_bits >= 0x7f800000u ? __uint_as_float(0x7fc00000u)
         : amax_bits == 0u        ? 1.f
                                  : __fdiv_rn(__uint_as_float(amax_bits), 448.f);
}

// V values of a row as e4m3 codes at q (V = 1, 4 or 8): e4m3(v / scale), round to nearest
// even, saturating.
template <int V>
__device__ __forceinline__ void fp8_store_codes(uint8_t* q, const float (&v)[V], float scale) {
  if constexpr (V == 1) {
    *q = static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(__fdiv_rn(v[0], scale), __NV_SATFINITE, __NV_E4M3));
  } else {
    static_assert(V == 4 || V == 8, "a 16-byte pack of fp32 or of bf16 / fp16");
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
      *reinterpret_cast<uint2*>(q) = out;
    } else {
      *reinterpret_cast<unsigned*>(q) = pairs[0] | (static_cast<unsigned>(pairs[1]) << 16);
    }
  }
}

}  // namespace latent::cuda
