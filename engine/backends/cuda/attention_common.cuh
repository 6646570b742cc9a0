// What the flash-attention kernels share (attention_flash.cu's mma.sync and CUDA-core kernels,
// attention_wgmma.cu's Hopper kernel): the kernel parameters, the key keep flags, the fp32
// online-softmax pieces. See attention_flash.cu for the scheme.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/backends/cuda/attention_flash.cuh"
#include "engine/backends/cuda/common.cuh"

namespace latent::cuda {
namespace {

// Everything a kernel needs, by value (dtype-erased pointers; element strides).
struct AttentionParams {
  const void* q;
  const void* k;
  const void* v;
  const void* mask;
  void* out;
  int tq, tk;
  int ld;  // elements between consecutive tokens: heads * d
  float scale_log2;
};

inline AttentionParams attention_params(const AttentionArgs& a) {
  AttentionParams p;
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.mask = a.mask;
  p.out = a.out;
  p.tq = a.tq;
  p.tk = a.tk;
  p.ld = a.heads * a.d;
  p.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(a.d)));
  return p;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The keep flags of key tile `tile` (key < tk and its mask value != 0), one bit per key, into
// keep[buf]: warp w < kBc / 32 ballots word w. `mnext` holds this thread's mask value of that
// tile and is refilled with the next tile's, one tile ahead of its use.
template <int kBc, typename T>
__device__ __forceinline__ void flag_keys(uint32_t* keep, const T* mrow, T& mnext, int tk, int tile,
                                          int buf, int tid, int warp, int lane) {
  constexpr int kWords = kBc / 32;
  if (warp < kWords) {
    const int key = tile * kBc + tid;
    const bool keep_key = key < tk && (!mrow || to_f32(mnext) != 0.f);
    const uint32_t bits = __ballot_sync(0xffffffffu, keep_key);
    if (lane == 0) keep[buf * kWords + warp] = bits;
    if (mrow && key + kBc < tk) mnext = mrow[key + kBc];
  }
}

// The keep words of one tile into registers; returns their AND (all ones: nothing to mask).
template <int kWords>
__device__ __forceinline__ uint32_t load_keep_words(uint32_t (&kw)[kWords], const uint32_t* words) {
  uint32_t all = 0xffffffffu;
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    kw[w] = words[w];
    all &= kw[w];
  }
  return all;
}

// Max and sum over the 4 lanes of a quad (the lanes holding one row of an MMA fragment).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The exponent base of a row whose running maximum is mx (raw score units). No key seen yet
// (all masked so far): base 0 gives p = 0 and alpha = 0.
__device__ __forceinline__ float softmax_base(float mx, float scale) {
  return mx == -INFINITY ? 0.f : mx * scale;
}

}  // namespace
}  // namespace latent::cuda
