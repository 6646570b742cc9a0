// Hopper implicit-GEMM convolution (see conv_wgmma.cuh): wgmma.mma_async (sm_90a) with A (input
// pixels x 64 channels of one filter tap) and B (output channels x the same 64 K) from 128B-
// swizzled shared tiles filled by cp.async, fp32 accumulators, the epilogue fused (staged through
// shared memory: store_staged).
//
// A block: kWg warpgroups (2, or 4 for a 256-pixel tile that loads each step's filter rows once
// for twice the pixels) of 64 x kMt output pixels each (a tile of 64 kWg kMt pixels) by kBn
// output channels. The K loop walks K = kt * r * s * c in steps of 64 (a step may span two
// taps when c is not a multiple of 64: every 16-byte chunk of 8 channels finds its own tap; K is
// zero-filled to a multiple of 64). kStages shared buffers; the step kc + kStages - 2 is requested
// while step kc multiplies, and a buffer is refilled only after every warpgroup's wgmmas that read
// it are complete (wait_group 1 before the next step's barrier).
//
// Output pixel (y, x) reads input (y * stride - pad_top + dy, x * stride - pad_left + dx): any zero
// padding, stride 1 or 2.
//
// Shared tile layout (rows of 64 channels = 128 bytes): chunk j of row r at r * 128 + ((j ^ (r %
// 8)) * 16), tiles 1024-byte aligned: the 128B-swizzle K-major layout of the wgmma descriptors
// (SBO 1024 = 8 rows; a k16 step advances the start address by 32 bytes). Out-of-image taps and
// rows past M are zero-filled by cp.async's source size 0.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/conv_wgmma.cuh"
#include "engine/backends/cuda/mma.cuh"
#include "engine/core/log.h"

namespace latent::cuda {
namespace {

constexpr int kBk = 64;  // K elements a step: one 128-byte row
constexpr int kStages = 4;  // shared buffers (5 for the 4-warpgroup tile with "s5")

struct Params : ConvKernelArgs {
  int m = 0, ktot = 0;      // output pixels of the call, K = kt * r * s * c
  int ohw = 0, stride = 1;  // output pixels a frame, spatial stride
  // The channel RMS norm of the output in the epilogue (ConvWgmmaArgs::norm_gamma), or null;
  // norm_sqrt_c = sqrt(k).
  const void* norm_gamma = nullptr;
  float norm_sqrt_c = 0.f;
};

// The halo tile's output rows a block for c input and bn output channels.
__host__ __device__ constexpr int halo_rows(int bn, int c) { return bn == 64 && c == 64 ? 4 : 2; }
// Halo pixels, padded so that every plane is a whole number of 1024-byte swizzle patterns.
__host__ __device__ constexpr int halo_pixels(int rows) { return ((rows + 2) * 66 + 15) / 16 * 16; }
constexpr int kHaloStages = 3;  // filter buffers

// The TMA halo kernel's tensor maps (conv_halo_tma_kernel).
struct HaloMaps {
  CUtensorMap in[3][2];  // input segment x0 / x1 / x2; plane of 64 channels (128B) / of 32 (64B)
  CUtensorMap w[2];      // the filter [k][ktot]: boxes of 64 / 32 K
};
// The strip kernel's (conv_strip64_kernel): the input [frames][h][w][64] as boxes of
// [1][3][130][64], the filter [64][9 * 64] as boxes of [64][64].
struct StripMaps {
  CUtensorMap in;
  CUtensorMap w;
};
// conv_strip64_t_kernel's: those two, and y and the residual [frames * h][w][64] as boxes of
// [1][128][64].
struct StripTMaps {
  CUtensorMap in;
  CUtensorMap w;
  CUtensorMap y;
  CUtensorMap res;
};
constexpr int kStripPx = 128, kStripHw = kStripPx + 2;
constexpr uint32_t kStripHaloBytes = 3u * kStripHw * 128u;                      // 49,920
constexpr uint32_t kStripBufBytes = (kStripHaloBytes + 1023u) / 1024u * 1024u;  // 50,176
constexpr int kStripBufs = 3;
constexpr uint32_t kStripTapBytes = 64u * 128u;              // one tap of the filter
constexpr uint32_t kStripFilterBytes = 9u * kStripTapBytes;  // 73,728
constexpr size_t kStripSmem =
    1024 + kStripFilterBytes + kStripBufs * kStripBufBytes + 8 * (1 + 2 * kStripBufs);
// conv_strip64_t_kernel's: two halo buffers, two consumers' output rows.
constexpr int kStripTBufs = 2;
constexpr uint32_t kStripOutBytes = kStripPx * 128u;  // [128 px][64] b16, 128B-swizzled
constexpr size_t kStripTSmem = 1024 + kStripFilterBytes + kStripTBufs * kStripBufBytes +
                               2 * kStripOutBytes + 8 * (1 + 2 * kStripTBufs + 2);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

#include "engine/backends/cuda/wgmma_ss.inc"

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(float (&c)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(c[i])::"memory");
}
// 16 bytes, or 16 zero bytes when `bytes` is 0 (src is then not read).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);  // 128B swizzle
}

// The staged epilogue of both kernels. The block's fp32 accumulators go to shared memory (the
// pipeline buffers, free by then) in rows of kBn + 4 floats, one row an output pixel; then every
// thread moves 16-byte chunks of 8 channels: the residual read in whole rows, all of a thread's
// reads issued before its first store, bias and activation, one 16-byte store a chunk. Writing
// each accumulator pair straight to global memory instead (session 21's halo tile, and the
// default tile before session 22) issues 4-byte reads of the residual that the compiler cannot
// move ahead of the stores, one global latency each: with one block an SM that took the halo
// tile's 720p 96-channel 3x3x3 convolution from 0.63 ms of wgmmas to 1.73 ms.
constexpr int stage_stride(int bn) { return bn + 4; }

template <typename T>
__device__ __forceinline__ void add_packed(float* v, uint32_t u) {
  T h[2];
  memcpy(h, &u, sizeof(u));
  v[0] += to_f32(h[0]);
  v[1] += to_f32(h[1]);
}

// Channels c8 * 8 .. c8 * 8 + 7 of staged pixel px (rows of stage_stride(kBn) floats), the
// bias (or nothing) added.
template <typename T, int kBn>
__device__ __forceinline__ void staged_chunk(const float* stile, int px, int c8, const T* bias,
                                             int n0, float (&v)[8]) {
  const float* src = stile + px * stage_stride(kBn) + c8 * 8;
  const float4 a = *reinterpret_cast<const float4*>(src);
  const float4 b = *reinterpret_cast<const float4*>(src + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  if (!bias) return;
  const uint4 bb = *reinterpret_cast<const uint4*>(bias + n0 + c8 * 8);
  add_packed<T>(v, bb.x);
  add_packed<T>(v + 2, bb.y);
  add_packed<T>(v + 4, bb.z);
  add_packed<T>(v + 6, bb.w);
}

// Thread's share of the accumulators: acc[t][4 i + e] is row 16 wl + g (e = 0, 1) or + 8 (e = 2,
// 3) of the block's m64 tile `tile0 + t`, column 8 i + 2 tig + e % 2.
template <int kBn, int kMt>
__device__ __forceinline__ void stage_acc(float* stile, const float (&acc)[kMt][kBn / 2],
                                          int tile0) {
  const int lane = threadIdx.x & 31, wl = (threadIdx.x >> 5) & 3, g = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int t = 0; t < kMt; ++t)
#pragma unroll
    for (int i = 0; i < kBn / 8; ++i)
#pragma unroll
      for (int hrow = 0; hrow < 2; ++hrow) {
        const int px = (tile0 + t) * 64 + wl * 16 + g + hrow * 8;
        *reinterpret_cast<float2*>(stile + px * stage_stride(kBn) + i * 8 + tig * 2) =
            make_float2(acc[t][4 * i + 2 * hrow], acc[t][4 * i + 2 * hrow + 1]);
      }
}

// The block's kPx staged pixels to global memory: pixel_offset(px) is the element offset of
// the pixel's channel 0 in y and the residual, or -1 outside the output. kNorm: the channel RMS
// norm's form, y = act(round(v) * scale(pixel) * gamma) with v = accumulators + bias (no
// residual) rounded to T first, as the unfused path's stored output is (the scales staged by
// stage_norm_scales).
template <typename T, int kBn, int kPx, int kThreads, Activation kAct, bool kNorm = false,
          typename PixelOffset>
__device__ __forceinline__ void store_staged(const float* stile, const Params& p, int n0,
                                             PixelOffset pixel_offset, int tid) {
  constexpr int kC8 = kBn / 8, kChunks = kPx * kC8;
  constexpr int kIters = (kChunks + kThreads - 1) / kThreads;
  const T* bias = static_cast<const T*>(p.bias);
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  // The chunk's element offset in y and the residual, -1 outside the output (computed again
  // for the store rather than kept: 2 registers a chunk).
  auto offset = [&](int it) -> int64_t {
    const int l = tid + it * kThreads, px = l / kC8, c8 = l - px * kC8;
    if (kChunks % kThreads != 0 && l >= kChunks) return -1;
    const int64_t o = pixel_offset(px);
    return o < 0 ? -1 : o + n0 + c8 * 8;
  };
  uint4 r[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    r[it] = make_uint4(0u, 0u, 0u, 0u);
    const int64_t o = offset(it);
    if (!kNorm && res && o >= 0) r[it] = *reinterpret_cast<const uint4*>(res + o);
  }
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int64_t o = offset(it);
    if (o < 0) continue;
    const int l = tid + it * kThreads, px = l / kC8, c8 = l - px * kC8;
    float v[8];
    staged_chunk<T, kBn>(stile, px, c8, bias, n0, v);
    if constexpr (kNorm) {
      const float scale = stile[px * stage_stride(kBn) + kBn];
      const uint4 gg =
          *reinterpret_cast<const uint4*>(static_cast<const T*>(p.norm_gamma) + n0 + c8 * 8);
      float g[8] = {};
      add_packed<T>(g, gg.x);
      add_packed<T>(g + 2, gg.y);
      add_packed<T>(g + 4, gg.z);
      add_packed<T>(g + 6, gg.w);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = fmaf(to_f32(from_f32<T>(v[i])) * scale, g[i], 0.f);
    } else {
      add_packed<T>(v, r[it].x);  // zeros without a residual
      add_packed<T>(v + 2, r[it].y);
      add_packed<T>(v + 4, r[it].z);
      add_packed<T>(v + 6, r[it].w);
    }
    uint4 out;
    out.x = pack2<T>(activate(v[0], kAct), activate(v[1], kAct));
    out.y = pack2<T>(activate(v[2], kAct), activate(v[3], kAct));
    out.z = pack2<T>(activate(v[4], kAct), activate(v[5], kAct));
    out.w = pack2<T>(activate(v[6], kAct), activate(v[7], kAct));
    *reinterpret_cast<uint4*>(y + o) = out;
  }
}

// store_staged with the activation a constant (one switch a block, not one an element: the
// per-element switch made the epilogue ~150 instructions a chunk).
// `tid`: the thread's index among the kThreads that store (threadIdx.x for a whole block).
template <typename T, int kBn, int kPx, int kThreads, typename PixelOffset>
__device__ __forceinline__ void store_staged_act(const float* stile, const Params& p, int n0,
                                                 PixelOffset pixel_offset, int tid) {
  switch (static_cast<Activation>(p.act)) {
    case Activation::kSiLU:
      return store_staged<T, kBn, kPx, kThreads, Activation::kSiLU>(stile, p, n0, pixel_offset,
                                                                    tid);
    case Activation::kReLU:
      return store_staged<T, kBn, kPx, kThreads, Activation::kReLU>(stile, p, n0, pixel_offset,
                                                                    tid);
    case Activation::kGELU:
      return store_staged<T, kBn, kPx, kThreads, Activation::kGELU>(stile, p, n0, pixel_offset,
                                                                    tid);
    case Activation::kTanh:
      return store_staged<T, kBn, kPx, kThreads, Activation::kTanh>(stile, p, n0, pixel_offset,
                                                                    tid);
    default:
      return store_staged<T, kBn, kPx, kThreads, Activation::kNone>(stile, p, n0, pixel_offset,
                                                                    tid);
  }
}

// The channel RMS norm in the epilogue (ConvWgmmaArgs::norm_gamma; the block holds all kBn == k
// output channels of its pixels, no residual): each staged pixel's factor
// sqrt(k) / max(||v||, 1e-12), v its channels with the bias added and rounded to T (the values
// the unfused path stores and rms_norm.cu reads back), into the row's first spare float (column
// kBn of the kBn + 4). kThreads / kPx threads a pixel (adjacent lanes), or one.
//
// kPair: the block holds half of the output channels and the other half is the other block of a
// cluster of 2 (the same pixels, blockIdx.y ^ 1): each block puts its partial sum in column
// kBn + 1, and after a cluster barrier adds the other block's, read through distributed shared
// memory. The caller then keeps the cluster together until both have read (cluster_arrive()
// here, cluster_wait() before the block ends: finish_tile).
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The float at shared address `addr` of this block, in the cluster's block of rank `rank`.
__device__ __forceinline__ float ld_cluster_f32(const float* addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(smem_addr(addr)), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

template <typename T, int kBn, int kPx, int kThreads, bool kPair = false>
__device__ __forceinline__ void stage_norm_scales(float* stile, const Params& p, int n0, int tid) {
  constexpr int kTpp = kThreads > kPx ? kThreads / kPx : 1;
  constexpr int kPer = kBn / kTpp, kPxStep = kThreads / kTpp;
  static_assert(kTpp <= 32 && (kTpp & (kTpp - 1)) == 0 && kPer % 4 == 0 && kPx % kPxStep == 0,
                "whole pixels, 4-channel reads");
  const T* bias = static_cast<const T*>(p.bias);
  const int part = tid % kTpp, c0 = part * kPer;
  for (int px = tid / kTpp; px < kPx; px += kPxStep) {
    const float* row = stile + px * stage_stride(kBn) + c0;
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < kPer; c += 4) {
      const float4 a = *reinterpret_cast<const float4*>(row + c);
      const float v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float r = to_f32(from_f32<T>(v[j] + (bias ? to_f32(bias[n0 + c0 + c + j]) : 0.f)));
        ss = fmaf(r, r, ss);
      }
    }
#pragma unroll
    for (int o = kTpp / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (part != 0) continue;
    if constexpr (kPair)
      stile[px * stage_stride(kBn) + kBn + 1] = ss;
    else
      stile[px * stage_stride(kBn) + kBn] = p.norm_sqrt_c / fmaxf(sqrtf(ss), 1e-12f);
  }
  if constexpr (kPair) {
    cluster_arrive();  // this block's partial sums are written (release)
    cluster_wait();    // and the other block's (acquire)
    const uint32_t other = cluster_rank() ^ 1u;
    for (int px = tid; px < kPx; px += kThreads) {
      float* row = stile + px * stage_stride(kBn);
      const float ss = row[kBn + 1] + ld_cluster_f32(row + kBn + 1, other);
      row[kBn] = p.norm_sqrt_c / fmaxf(sqrtf(ss), 1e-12f);
    }
    cluster_arrive();  // this block has read the other's sums (waited on in finish_tile)
  }
}

// The tiled kernels' end, once every wgmma (and every load) of the block is complete: the
// accumulators (m64 tiles tile0 .. tile0 + kMt - 1 of the block's kPx pixels) staged from
// `base` in the pipeline buffers (kFreeBytes, free by then), then stored by all kThreads; with
// the channel RMS norm (p.norm_gamma: SiLU or no activation) its factors first.
// kPair: the norm's sums met across a cluster of 2 blocks (stage_norm_scales; p.norm_gamma is
// then always set).
template <typename T, int kBn, int kMt, int kPx, int kThreads, uint32_t kFreeBytes,
          bool kPair = false, typename PixelOffset>
__device__ __forceinline__ void finish_tile(unsigned char* smem_raw, uint32_t base,
                                            const float (&acc)[kMt][kBn / 2], int tile0,
                                            const Params& p, int n0, PixelOffset pixel_offset) {
  static_assert(kPx * stage_stride(kBn) * 4 <= kFreeBytes, "the staged tile fits");
  __syncthreads();  // every warpgroup's wgmmas complete: the shared buffers are free
  float* stile = reinterpret_cast<float*>(smem_raw + (base - smem_addr(smem_raw)));
  stage_acc<kBn, kMt>(stile, acc, tile0);
  __syncthreads();
  if (kPair || p.norm_gamma) {
    stage_norm_scales<T, kBn, kPx, kThreads, kPair>(stile, p, n0, threadIdx.x);
    __syncthreads();
    if (static_cast<Activation>(p.act) == Activation::kSiLU)
      store_staged<T, kBn, kPx, kThreads, Activation::kSiLU, true>(stile, p, n0, pixel_offset,
                                                                   threadIdx.x);
    else
      store_staged<T, kBn, kPx, kThreads, Activation::kNone, true>(stile, p, n0, pixel_offset,
                                                                   threadIdx.x);
    if constexpr (kPair) cluster_wait();  // the other block has read this one's sums
    return;
  }
  store_staged_act<T, kBn, kPx, kThreads>(stile, p, n0, pixel_offset, threadIdx.x);
}

// Output pixel px (row px / 64, column px % 64) of a halo block's tile at (f, oy0, ox0): its
// element offset in y, -1 outside the output.
struct HaloPixel {
  const Params& p;
  int f, oy0, ox0;
  __device__ __forceinline__ int64_t operator()(int px) const {
    const int oy = oy0 + (px >> 6), ox = ox0 + (px & 63);
    if (oy >= p.out_h || ox >= p.out_w) return -1;
    return ((static_cast<int64_t>(f) * p.out_h + oy) * p.out_w + ox) * p.k;
  }
};

template <typename T, int kBn, int kMt, int kWg, int kSt>
__global__ void __launch_bounds__(128 * kWg, kWg == 2 && kMt == 1 && kBn <= 128 ? 2 : 1)
    conv_wgmma_kernel(const Params p) {
  constexpr int kThreads = 128 * kWg;
  constexpr int kRowStep = kThreads / 8;  // rows a pass of the block's threads loads
  constexpr int kBm = 64 * kWg * kMt;
  constexpr int kRowsA = kBm / kRowStep;  // A rows a thread loads a step (chunk column tid % 8)
  constexpr int kRowsB = (kBn + kRowStep - 1) / kRowStep;  // B rows (the last pass may be partial)
  constexpr uint32_t kABytes = kBm * 128, kBBytes = kBn * 128, kStageBytes = kABytes + kBBytes;
  constexpr int kAcc = kBn / 2;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;

  const int tid = threadIdx.x, wg = tid >> 7;
  const int m0 = blockIdx.x * kBm, n0 = blockIdx.y * kBn;
  const T* x0 = static_cast<const T*>(p.in.x0);
  const T* x1 = static_cast<const T*>(p.in.x1);
  const T* wt = static_cast<const T*>(p.weight);

  // This thread's A rows (r = tid / 8 + kRowStep i, 16-byte chunk column jc = tid % 8 of every
  // step): element offset, from x0's start, of the input pixel under the filter's top-left tap
  // (frame * frame_elems + (iy0 * w + ix0) * c; negative or past the frame where that tap is
  // padding), the output pixel's frame, and which of the r * s spatial taps stay inside the image
  // (bit dy * s + dx; 0 for rows past M, whose chunks are zero-filled).
  const int jc = tid & 7;
  int64_t roff[kRowsA];
  int rframe[kRowsA];
  uint32_t rmask[kRowsA];
#pragma unroll
  for (int i = 0; i < kRowsA; ++i) {
    const int m = m0 + (tid >> 3) + kRowStep * i;
    rmask[i] = 0;
    rframe[i] = 0;
    roff[i] = 0;
    if (m < p.m) {
      const int f = m / p.ohw, rem = m - f * p.ohw, y = rem / p.out_w, x = rem - y * p.out_w;
      // the input pixel under the filter's top-left tap (may lie in the padding)
      const int iy0 = y * p.stride - p.pad_h, ix0 = x * p.stride - p.pad_w;
      rframe[i] = f;
      roff[i] = static_cast<int64_t>(f) * p.in.frame_elems +
                (static_cast<int64_t>(iy0) * p.w + ix0) * p.c;
      for (int dy = 0; dy < p.r; ++dy)
        for (int dx = 0; dx < p.s; ++dx) {
          const int iy = iy0 + dy, ix = ix0 + dx;
          if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w) rmask[i] |= 1u << (dy * p.s + dx);
        }
    }
  }
  // This thread's position in K, advanced by 64 a step (steps are loaded in order): channel ch
  // of spatial tap (dy, dx) = sp of temporal tap dt.
  int ch = 0, sp = 0, dy = 0, dx = 0, dt = 0;
  auto advance_k = [&](int elems) {
    ch += elems;
    while (ch >= p.c) {
      ch -= p.c;
      ++sp;
      if (++dx == p.s) {
        dx = 0;
        if (++dy == p.r) dy = 0, sp = 0, ++dt;
      }
    }
  };
  advance_k(jc * 8);
  // The thread's B chunk rows n = tid / 8 + kRowStep it, column jc: weight pointers of step 0.
  const T* bptr = wt + static_cast<int64_t>(n0 + (tid >> 3)) * p.ktot + jc * 8;
  const uint32_t swz = (jc ^ ((tid >> 3) & 7)) << 4;  // r % 8 == (tid / 8) % 8 for every row
  const uint32_t row_dst = (tid >> 3) * 128 + swz;
  // Input frames past x0 continue in x1, those past x1 in x2: pointers to where x1's frame -n0
  // and x2's frame -n1 would be.
  const T* x1_shifted = x1 - static_cast<int64_t>(p.in.n0) * p.in.frame_elems;
  const T* x2_shifted =
      static_cast<const T*>(p.in.x2) - static_cast<int64_t>(p.in.n1) * p.in.frame_elems;

  auto load_step = [&](int kc, int slot) {
    const uint32_t as = base + slot * kStageBytes + row_dst,
                   bs = base + slot * kStageBytes + kABytes + row_dst;
    const bool kin = dt < p.kt;
    // This step's offset from an output pixel to the input element it reads, for either
    // segment of frames.
    const int64_t delta = static_cast<int64_t>(dt) * p.in.frame_elems +
                          static_cast<int64_t>(dy * p.w + dx) * p.c + ch;
    const T* base0 = x0 + delta;
    const T* base1 = x1_shifted + delta;
    const T* base2 = x2_shifted + delta;
#pragma unroll
    for (int i = 0; i < kRowsA; ++i) {
      const bool ok = kin && ((rmask[i] >> sp) & 1u);
      const int f = rframe[i] + dt;
      const T* src = (f < p.in.n0 ? base0 : f < p.in.n1 ? base1 : base2) + roff[i];
      cp_async16_zfill(as + i * kRowStep * 128, src, ok ? 16 : 0);
    }
#pragma unroll
    for (int it = 0; it < kRowsB; ++it)
      if (kBn % kRowStep == 0 || (tid >> 3) + it * kRowStep < kBn)
        cp_async16_zfill(bs + it * kRowStep * 128,
                         bptr + static_cast<int64_t>(it) * kRowStep * p.ktot,
                         kc * kBk + jc * 8 < p.ktot ? 16 : 0);
    bptr += kBk;
    advance_k(kBk);
  };

  float acc[kMt][kAcc];
#pragma unroll
  for (int t = 0; t < kMt; ++t)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[t][i] = 0.f;

  const int steps = (p.ktot + kBk - 1) / kBk;
  constexpr int kAhead = kSt - 2;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < steps) load_step(s, s);
    cp_async_commit();
  }
  for (int kc = 0; kc < steps; ++kc) {
    cp_async_wait<kAhead - 1>();
    fence_proxy_async();
    __syncthreads();  // step kc resident; step kc - 2's wgmmas done in every warpgroup
    if (kc + kAhead < steps) load_step(kc + kAhead, (kc + kAhead) % kSt);
    cp_async_commit();
    const uint32_t as = base + (kc % kSt) * kStageBytes, bs = as + kABytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      const uint64_t db = smem_desc(bs + kk * 32);
#pragma unroll
      for (int t = 0; t < kMt; ++t)
        wgmma_ss<T, kBn>(acc[t], smem_desc(as + (wg * kMt + t) * 64 * 128 + kk * 32), db);
    }
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int t = 0; t < kMt; ++t) fence_regs(acc[t]);

  cp_async_wait<0>();
  finish_tile<T, kBn, kMt, kBm, kThreads, kSt * kStageBytes>(
      smem_raw, base, acc, wg * kMt, p, n0, [&](int px) -> int64_t {
        const int m = m0 + px;
        return m < p.m ? static_cast<int64_t>(m) * p.k : -1;
      });
}

// === the halo tile (LATENT_CONV_WGMMA_TILE=halo) ===
// 3x3 (x kt) filters, stride 1. A block computes kR output rows x 64 output columns of one frame
// by kBn channels: warpgroup g rows kMt g .. kMt g + kMt - 1, one m64 tile a row (kR 4 for 64
// channels in and out, else 2). For each temporal tap the block loads the input under its tile
// once, a halo of kR + 2 rows x 66 pixels x all kC channels, and every spatial tap reads its A
// from that halo in place: tap (dy, dx) of output row j is the 64 consecutive halo pixels from
// (j + dy, dx). The default tile's im2col loads each input value 9 times from L2 a temporal tap;
// the halo (kR + 2) x 66 / (kR x 64) times (1.55 / 2.06).
// Shared layout: the channels in planes, 64 channels a plane with 128-byte rows in the
// 128B-swizzle layout, and for 96 channels a last plane of 32 with 64-byte rows in the 64B-swizzle
// layout; a row is one pixel (the halo) or one output channel (the filter), plane bases 1024-byte
// aligned. Chunk c (16 bytes) of row q of a plane sits at o ^ (((o >> 7) & mask) << 4), o =
// q * row_bytes + 16 c (mask 7 for 128B, 3 for 64B): the layout the default tile uses, so a
// window that starts at any pixel is again a swizzled tile whose rows' phase is its start
// address's bits 7-9: the descriptors' "matrix base offset" stays 0 (tested on an H200: the PTX
// ISA's (start >> 7) & 7 there gives wrong results, so the hardware takes the phase from the
// address itself). Session 21's first form, without swizzle, ran 2x slower than the default tile.
// A K step is one spatial tap (kC / 16 wgmmas a row tile); kSt filter buffers, the next step's
// filter loaded during this one. One halo buffer, reloaded between temporal taps once every
// wgmma of the last tap is complete; with it a block takes at most ~106 KiB, so two blocks share
// an SM and one's loads, barriers and epilogue overlap the other's wgmmas (session 22: with one
// block an SM, double-buffered halos, those phases took as long as the wgmmas).
template <int kRowBytes>
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  const uint32_t o = static_cast<uint32_t>(row * kRowBytes + chunk * 16);
  return o ^ (((o >> 7) & (kRowBytes == 128 ? 7u : 3u)) << 4);
}
template <int kRowBytes>
__device__ __forceinline__ uint64_t swizzled_desc(uint32_t addr) {
  constexpr uint64_t kMode = kRowBytes == 128 ? 1 : 2;  // 128B / 64B swizzle
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (1ull << 16) |
         (static_cast<uint64_t>(kRowBytes * 8 / 16) << 32) | (kMode << 62);
}

// One step (filter tap) of the halo kernels: the kMt m64 row tiles' wgmmas over all kC input
// channels, A the halo window from pixel q0 (64-channel planes with 128B swizzle, a last
// 32-channel plane with 64B swizzle; kNp pixels a plane), B the step's filter buffer at bb;
// fenced before and committed as one group.
template <typename T, int kBn, int kC, int kMt, int kNp>
__device__ __forceinline__ void halo_step_wgmmas(float (&acc)[kMt][kBn / 2], uint32_t base,
                                                 uint32_t bb, int q0) {
  constexpr int kHw = 66, kWide = kC / 64, kWideK = kWide * 4;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk) {
    if (kk < kWideK) {
      const uint32_t plane = (kk >> 2) * 128u, k32 = (kk & 3) * 32u;
      const uint64_t db = swizzled_desc<128>(bb + plane * kBn + k32);
#pragma unroll
      for (int m = 0; m < kMt; ++m)
        wgmma_ss<T, kBn>(acc[m],
                         swizzled_desc<128>(base + plane * kNp + (q0 + m * kHw) * 128u + k32), db);
    } else {
      const uint32_t k32 = (kk - kWideK) * 32u;
      const uint64_t db = swizzled_desc<64>(bb + kWide * kBn * 128u + k32);
#pragma unroll
      for (int m = 0; m < kMt; ++m)
        wgmma_ss<T, kBn>(
            acc[m], swizzled_desc<64>(base + kWide * kNp * 128u + (q0 + m * kHw) * 64u + k32), db);
    }
  }
  wgmma_commit();
}

template <typename T, int kBn, int kC>
__global__ void __launch_bounds__(256, 2) conv_halo_kernel(const Params p) {
  constexpr int kR = halo_rows(kBn, kC), kMt = kR / 2, kAcc = kBn / 2, kTaps = 9;
  constexpr int kSt = kHaloStages, kAhead = kSt - 2;
  constexpr int kHw = 66, kHh = kR + 2, kNp = halo_pixels(kR);
  constexpr int kC8 = kC / 8;                                 // 16-byte chunks a pixel
  constexpr int kWide = kC / 64;                              // planes of 64 channels
  constexpr int kWideChunks = kWide * 8;                      // their chunks
  static_assert(kC % 32 == 0 && kWide >= 1 && kBn % 16 == 0, "64 + 32 n channels");
  constexpr uint32_t kHaloBytes = kNp * kC * 2u, kBBytes = kBn * kC * 2u;
  static_assert(kHaloBytes % 1024 == 0 && kBBytes % 1024 == 0, "plane bases 1024-byte aligned");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t b_base = base + kHaloBytes;
  const int tid = threadIdx.x, wg = tid >> 7;
  // this block's tile
  const int tiles_x = (p.out_w + 63) >> 6, tiles_y = (p.out_h + kR - 1) / kR;
  int t = blockIdx.x;
  const int tx = t % tiles_x;
  t /= tiles_x;
  const int ty = t % tiles_y, f = t / tiles_y;
  const int oy0 = ty * kR, ox0 = tx * 64, n0 = blockIdx.y * kBn;
  const int steps = p.kt * kTaps;

  // Shared offset of chunk j of row q in a region of `rows` rows (planes one after another).
  auto chunk_at = [](int q, int j, int rows) -> uint32_t {
    if (j < kWideChunks) return (j >> 3) * rows * 128u + swizzled<128>(q, j & 7);
    return kWide * rows * 128u + swizzled<64>(q, j - kWideChunks);
  };
  // Chunks in order (pixel, then channel): a warp reads 512 contiguous global bytes where the
  // pixels are neighbours in the image.
  auto load_halo = [&](int dt) {
    const int fi = f + dt;  // input frame
    const T* src = static_cast<const T*>(fi < p.in.n0 ? p.in.x0 : fi < p.in.n1 ? p.in.x1 : p.in.x2);
    const int64_t fo = fi < p.in.n0 ? fi : fi < p.in.n1 ? fi - p.in.n0 : fi - p.in.n1;
    src += fo * p.in.frame_elems;
    constexpr int kChunks = kHh * kHw * kC8;
#pragma unroll 4
    for (int l = tid; l < kChunks; l += 256) {
      const int q = l / kC8, j = l - q * kC8;
      const int hy = q / kHw, hx = q - hy * kHw;
      const int iy = oy0 - p.pad_h + hy, ix = ox0 - p.pad_w + hx;
      const bool ok = iy >= 0 && iy < p.h && ix >= 0 && ix < p.w;
      const T* g = ok ? src + (static_cast<int64_t>(iy) * p.w + ix) * kC + j * 8 : src;
      cp_async16_zfill(base + chunk_at(q, j, kNp), g, ok ? 16 : 0);
    }
  };
  const T* wt = static_cast<const T*>(p.weight) + static_cast<int64_t>(n0) * p.ktot;
  auto load_b = [&](int step) {
    constexpr int kChunks = kBn * kC8;
    const uint32_t dst = b_base + (step % kSt) * kBBytes;
#pragma unroll
    for (int l = tid; l < kChunks; l += 256) {
      const int n = l / kC8, j = l - n * kC8;
      cp_async16_zfill(dst + chunk_at(n, j, kBn),
                       wt + static_cast<int64_t>(n) * p.ktot + step * kC + j * 8, 16);
    }
  };

  float acc[kMt][kAcc];
#pragma unroll
  for (int m = 0; m < kMt; ++m)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[m][i] = 0.f;
      // Pin the zeros in registers before the first wgmma: otherwise ptxas materialises acc[1]'s
      // between acc[0]'s wgmmas and serialises every wgmma of the kernel (its warning C7515;
      // session 21's halo tile ran so).
#pragma unroll
  for (int m = 0; m < kMt; ++m) fence_regs(acc[m]);

  // Group g (issued at step g - kAhead, waited for at step g): the filter of step g, and with
  // g = 0 the halo of temporal tap 0.
  load_halo(0);
#pragma unroll
  for (int g = 0; g < kAhead; ++g) {
    if (g < steps) load_b(g);
    cp_async_commit();
  }
  for (int kc = 0; kc < steps; ++kc) {
    const int dt = kc / kTaps, sp = kc - dt * kTaps, dy = sp / 3, dx = sp - dy * 3;
    if (sp == 0 && dt > 0) {
      // The next temporal tap's halo, once every wgmma that reads the buffer is complete.
      wgmma_wait<0>();
      __syncthreads();
      load_halo(dt);
      cp_async_commit();
      cp_async_wait<0>();
    }
    cp_async_wait<kAhead - 1>();
    fence_proxy_async();
    __syncthreads();  // step kc resident; step kc - 2's wgmmas done in every warpgroup
    if (kc + kAhead < steps) load_b(kc + kAhead);
    cp_async_commit();
    const uint32_t bb = b_base + (kc % kSt) * kBBytes;
    // the first pixel of each row tile's window
    const int q0 = (wg * kMt + dy) * kHw + dx;
    halo_step_wgmmas<T, kBn, kC, kMt, kNp>(acc, base, bb, q0);
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int m = 0; m < kMt; ++m) fence_regs(acc[m]);

  cp_async_wait<0>();
  finish_tile<T, kBn, kMt, kR * 64, 256, kHaloBytes + kSt * kBBytes>(
      smem_raw, base, acc, wg * kMt, p, n0, HaloPixel{p, f, oy0, ox0});
}

// === the halo tile with TMA loads (the default where halo_kind() picks it; session 23) ===
// The halo tile above with its loads done by the Tensor Memory Accelerator: one thread issues,
// per temporal tap, one box load a channel plane ([1, rows + 2, 66, 64 or 32] of the input
// frame, out-of-image pixels zero-filled by the TMA, written in the 128B / 64B swizzle the
// descriptors read) and per step one box of the filter ([bn, 64 or 32] of K); completion is
// counted on mbarriers (bytes), so the warps spend no instructions on address math (the halo's
// index math was ~1,250 instructions a warp before the main loop, session 22's ncu). On an H200:
// 0.94 ms at 720p 96-channel 3x3x3 (the cp.async halo tile 1.37, cuDNN's fused graph 1.01).

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// kR output rows a block (2 or 4), kSt filter buffers (2: a step's buffer is refilled once its
// wgmmas are complete, so each step waits for all of its own; 3-4: kSt - 2 steps ahead).
// kPair: launched as clusters of the 2 blocks of a pixel tile (blockIdx.y 0 and 1, kBn = k / 2)
// with the channel norm in the epilogue (finish_tile).
template <typename T, int kBn, int kC, int kR = halo_rows(kBn, kC), int kSt = kHaloStages,
          bool kPair = false>
__global__ void __launch_bounds__(256, (kR == 4 && kC == 96) || kSt > 3 || kC > 96 ? 1 : 2)
    conv_halo_tma_kernel(const Params p, const __grid_constant__ HaloMaps maps) {
  constexpr int kMt = kR / 2, kAcc = kBn / 2, kTaps = 9;
  constexpr int kAhead = kSt >= 3 ? kSt - 2 : 1;
  static_assert(kSt >= 2 && (kR == 2 || kR == 4), "2 or 4 rows, 2 or more filter buffers");
  constexpr int kHw = 66, kNp = halo_pixels(kR);
  constexpr int kWide = kC / 64;
  static_assert(kC % 32 == 0 && kWide >= 1 && kBn % 16 == 0, "64 + 32 n channels");
  constexpr uint32_t kHaloBytes = kNp * kC * 2u, kBBytes = kBn * kC * 2u;
  constexpr uint32_t kHaloTx = (kR + 2) * kHw * kC * 2u;  // bytes a halo's boxes write
  static_assert(kHaloBytes % 1024 == 0 && kBBytes % 1024 == 0, "plane bases 1024-byte aligned");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t b_base = base + kHaloBytes;
  const uint32_t halo_bar = b_base + kSt * kBBytes;  // then kSt filter barriers, 8 bytes each
  auto full_bar = [&](int s) { return halo_bar + 8u * (1 + s); };
  const int tid = threadIdx.x, wg = tid >> 7;
  const int tiles_x = (p.out_w + 63) >> 6, tiles_y = (p.out_h + kR - 1) / kR;
  int t = blockIdx.x;
  const int tx = t % tiles_x;
  t /= tiles_x;
  const int ty = t % tiles_y, f = t / tiles_y;
  const int oy0 = ty * kR, ox0 = tx * 64, n0 = blockIdx.y * kBn;
  const int steps = p.kt * kTaps;

  if (tid == 0) {
    mbar_init(halo_bar, 1);
    for (int s = 0; s < kSt; ++s) mbar_init(full_bar(s), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // Thread 0 only.
  auto tma_halo = [&](int dt) {
    const int fi = f + dt, seg = fi < p.in.n0 ? 0 : fi < p.in.n1 ? 1 : 2;
    const int fo = seg == 0 ? fi : seg == 1 ? fi - p.in.n0 : fi - p.in.n1;
    mbar_expect_tx(halo_bar, kHaloTx);
#pragma unroll
    for (int pl = 0; pl < kWide; ++pl)
      tma_load_4d(base + pl * kNp * 128u, &maps.in[seg][0], halo_bar, pl * 64, ox0 - p.pad_w,
                  oy0 - p.pad_h, fo);
    if (kC % 64 != 0)
      tma_load_4d(base + kWide * kNp * 128u, &maps.in[seg][1], halo_bar, kWide * 64, ox0 - p.pad_w,
                  oy0 - p.pad_h, fo);
  };
  auto tma_b = [&](int step) {
    const int s = step % kSt;
    const uint32_t dst = b_base + s * kBBytes;
    mbar_expect_tx(full_bar(s), kBBytes);
#pragma unroll
    for (int pl = 0; pl < kWide; ++pl)
      tma_load_2d(dst + pl * kBn * 128u, &maps.w[0], full_bar(s), step * kC + pl * 64, n0);
    if (kC % 64 != 0)
      tma_load_2d(dst + kWide * kBn * 128u, &maps.w[1], full_bar(s), step * kC + kWide * 64, n0);
  };

  float acc[kMt][kAcc];
#pragma unroll
  for (int m = 0; m < kMt; ++m)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[m][i] = 0.f;
#pragma unroll
  for (int m = 0; m < kMt; ++m) fence_regs(acc[m]);  // see conv_halo_kernel

  if (tid == 0) {
    tma_halo(0);
    for (int g = 0; g < kAhead && g < steps; ++g) tma_b(g);
  }
  for (int kc = 0; kc < steps; ++kc) {
    const int dt = kc / kTaps, sp = kc - dt * kTaps, dy = sp / 3, dx = sp - dy * 3;
    if (sp == 0 && dt > 0) {
      // The next temporal tap's halo, once every wgmma that reads the buffer is complete.
      wgmma_wait<0>();
      __syncthreads();
      if (tid == 0) tma_halo(dt);
    }
    if (sp == 0) mbar_wait(halo_bar, dt & 1);
    mbar_wait(full_bar(kc % kSt), (kc / kSt) & 1);
    // Step kc - kSt + kAhead's wgmmas are done in every warpgroup: its buffer is refilled next.
    __syncthreads();
    if (tid == 0 && kc + kAhead < steps) tma_b(kc + kAhead);
    const uint32_t bb = b_base + (kc % kSt) * kBBytes;
    const int q0 = (wg * kMt + dy) * kHw + dx;
    halo_step_wgmmas<T, kBn, kC, kMt, kNp>(acc, base, bb, q0);
    if constexpr (kSt == 2)
      wgmma_wait<0>();
    else
      wgmma_wait<1>();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int m = 0; m < kMt; ++m) fence_regs(acc[m]);

  // (every box loaded too: the staged tile stays below the barriers)
  finish_tile<T, kBn, kMt, kR * 64, 256, kHaloBytes + kSt * kBBytes, kPair>(
      smem_raw, base, acc, wg * kMt, p, n0, HaloPixel{p, f, oy0, ox0});
}

// === 64 -> 64 channels, 2-D 3x3: the strip kernel, session 23's form (fp32 staging; now where
// conv_strip64_t_kernel below cannot run, or forced by LATENT_CONV_WGMMA_TILE=strip64s) ===
// The TAESD family's convolutions. With 64 output channels as wgmma's N (the kernels above) a
// m64n64k16 reads 4 KiB of shared memory for 32 cycles of tensor work: shared memory's 128
// bytes a cycle are the limit, and those kernels' wgmmas alone reach only half the FLOP rate.
// Here the 64 output channels are M and 128 output pixels of one row are N: a m64n128k16 reads
// 6 KiB for 64 cycles. The whole filter (9 taps x 64 x 64, 72 KiB) stays in shared memory for the
// block's life (A: tap t's [64 out][64 in], 128B-swizzled, K-major); a tile is a strip of 128
// output pixels of one row, its halo 3 input rows of 130 pixels loaded by one TMA box (zero fill
// out of the image), and the window of tap (dy, dx) is the halo's 128 pixels from row dy, pixel
// dx (B, K-major, any start pixel: the swizzle phase comes from the address).
//
// Persistent and warp-specialised: one block an SM (3 warpgroups). Warpgroup 0's first thread
// loads the filter once, then the halos of the block's strips (blockIdx.x, + gridDim.x, ...)
// into 3 buffers, each buffer's reuse waiting for its "empty" barrier. Warpgroups 1 and 2 take
// alternate strips: wait for the halo ("full"), 36 wgmmas, then the epilogue staged through the
// halo buffer just read (fp32 [128 px][68], 34 KiB), and release the buffer. One consumer's
// epilogue runs while the other's wgmmas do.

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The strip kernels' shared parts. Strip i of a block (blockIdx.x + i * gridDim.x, x fastest,
// then output row, then frame), and how many the block takes.
struct StripAt {
  const Params& p;
  int tiles_x;
  __device__ __forceinline__ explicit StripAt(const Params& params)
      : p(params), tiles_x((params.out_w + kStripPx - 1) / kStripPx) {}
  __device__ __forceinline__ int count() const {
    const int ntiles = p.frames * p.out_h * tiles_x;  // < INT32_MAX (strip64_fits)
    const int b = static_cast<int>(blockIdx.x);
    return ntiles > b ? (ntiles - 1 - b) / static_cast<int>(gridDim.x) + 1 : 0;
  }
  __device__ __forceinline__ void operator()(int i, int* f, int* oy, int* x0) const {
    int t = static_cast<int>(blockIdx.x) + i * static_cast<int>(gridDim.x);
    *x0 = (t % tiles_x) * kStripPx;
    t /= tiles_x;
    *oy = t % p.out_h;
    *f = t / p.out_h;
  }
};

// The producer (one thread): the filter once (9 taps on filter_bar), then the halo of each of the
// block's strips into kBufs buffers, a buffer's reuse waiting for its "empty" barrier (full and
// empty barriers of buffer b at full0 + 8 b, empty0 + 8 b).
template <int kBufs>
__device__ __forceinline__ void strip_produce(const Params& p, const CUtensorMap* in,
                                              const CUtensorMap* w, uint32_t fbase, uint32_t hbase,
                                              uint32_t filter_bar, uint32_t full0, uint32_t empty0,
                                              const StripAt& at) {
  mbar_expect_tx(filter_bar, kStripFilterBytes);
  for (int tap = 0; tap < 9; ++tap)
    tma_load_2d(fbase + tap * kStripTapBytes, w, filter_bar, tap * 64, 0);
  const int n = at.count();
  for (int i = 0; i < n; ++i) {
    const int b = i % kBufs;
    if (i >= kBufs) mbar_wait(empty0 + 8u * b, ((i / kBufs) - 1) & 1);
    int f, oy, x0;
    at(i, &f, &oy, &x0);
    mbar_expect_tx(full0 + 8u * b, kStripHaloBytes);
    tma_load_4d(hbase + b * kStripBufBytes, in, full0 + 8u * b, 0, x0 - p.pad_w, oy - p.pad_h, f);
  }
}

// A strip's 36 wgmmas (9 taps x 4 K steps of 16 channels): the filter resident from fbase, the
// halo buffer at hb; fenced before, committed as one group.
template <typename T>
__device__ __forceinline__ void strip_wgmmas(float (&acc)[64], uint32_t fbase, uint32_t hb) {
  wgmma_fence();
#pragma unroll
  for (int tap = 0; tap < 9; ++tap) {
    const int dy = tap / 3, dx = tap - dy * 3;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_ss<T, kStripPx>(acc, swizzled_desc<128>(fbase + tap * kStripTapBytes + kk * 32u),
                            swizzled_desc<128>(hb + (dy * kStripHw + dx) * 128u + kk * 32u));
  }
  wgmma_commit();
}

template <typename T>
__global__ void __launch_bounds__(384, 1)
    conv_strip64_kernel(const Params p, const __grid_constant__ StripMaps maps) {
  static_assert(kStripPx * stage_stride(64) * 4 <= kStripBufBytes, "a strip stages in its halo");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t fbase = base, hbase = base + kStripFilterBytes;
  const uint32_t bars = hbase + kStripBufs * kStripBufBytes;
  const uint32_t filter_bar = bars;
  auto full_bar = [&](int b) { return bars + 8u * (1 + b); };
  auto empty_bar = [&](int b) { return bars + 8u * (1 + kStripBufs + b); };
  const int tid = threadIdx.x, wg = tid >> 7;
  const StripAt strip(p);
  const int tiles_here = strip.count();
  if (tid == 0) {
    mbar_init(filter_bar, 1);
    for (int b = 0; b < kStripBufs; ++b) {
      mbar_init(full_bar(b), 1);
      mbar_init(empty_bar(b), 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 0) {  // the producer
    if (tid == 0)
      strip_produce<kStripBufs>(p, &maps.in, &maps.w, fbase, hbase, filter_bar, full_bar(0),
                                empty_bar(0), strip);
    return;
  }
  const int c = wg - 1, lt = tid - 128 * wg;
  const int lane = tid & 31, wl = (tid >> 5) & 3, g = lane >> 2, tig = lane & 3;
  mbar_wait(filter_bar, 0);
  for (int i = c; i < tiles_here; i += 2) {
    const int b = i % kStripBufs;
    const uint32_t hb = hbase + b * kStripBufBytes;
    float acc[64];
#pragma unroll
    for (int e = 0; e < 64; ++e) acc[e] = 0.f;
    fence_regs(acc);
    mbar_wait(full_bar(b), (i / kStripBufs) & 1);
    strip_wgmmas<T>(acc, fbase, hb);
    wgmma_wait<0>();
    fence_regs(acc);
    named_sync(1 + c, 128);  // every warp's wgmmas have read the halo: it becomes the staging
    float* stile = reinterpret_cast<float*>(smem_raw + (hb - smem_addr(smem_raw)));
    // acc[4 j + 2 h + e]: output channel 16 wl + g + 8 h, pixel 8 j + 2 tig + e.
#pragma unroll
    for (int j = 0; j < kStripPx / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          stile[(8 * j + 2 * tig + e) * stage_stride(64) + 16 * wl + g + 8 * h] =
              acc[4 * j + 2 * h + e];
    named_sync(1 + c, 128);
    int f, oy, x0;
    strip(i, &f, &oy, &x0);
    store_staged_act<T, 64, kStripPx, 128>(
        stile, p, 0,
        [&](int px) -> int64_t {
          const int ox = x0 + px;
          if (ox >= p.out_w) return -1;
          return ((static_cast<int64_t>(f) * p.out_h + oy) * p.out_w + ox) * p.k;
        },
        lt);
    fence_proxy_async();     // these generic accesses before the TMA writes the buffer again
    named_sync(1 + c, 128);  // every thread done with the staging
    if (lt == 0) mbar_arrive(empty_bar(b));
  }
}

// === the strip kernel with a register epilogue and TMA stores (the default where the strip
// kernel runs; session 24) ===
// ncu on conv_strip64_kernel (H200, 1080p ReLU, session 24): the tensor pipe 54 % busy; of the
// consumer warps' samples 45 % fall in the epilogue (fp32 staging in shared memory, then one
// pixel offset, bounds check and residual predicate a 16-byte chunk), 43 % in issuing and waiting
// for the wgmmas. Here the epilogue stays in registers: bias (two output channels a thread),
// residual (a TMA box [1][128][64] loaded while the wgmmas run, read with ldmatrix.trans into
// the accumulators' layout), activation, then stmatrix.trans packs bf16 rows [pixel][64] into a
// 16 KiB buffer a consumer that one TMA store writes to y (the image's right edge clipped by the
// TMA). A halo buffer is released as soon as its wgmmas are complete, so two suffice. The
// consumers issue their strips' wgmmas in turn (each waits on a named barrier until the other has
// issued the strip before), so one's epilogue runs under the other's wgmmas instead of both
// drifting into lockstep (without the turns: 0.263 against 0.231 ms at 1080p ReLU). ncu: the
// tensor pipe 82 % busy; bench_conv at 1080p 0.23-0.25 ms against 0.32-0.34 (no activation /
// ReLU, with or without a residual) and 0.31 against 0.52 with a residual and SiLU.

__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void stsm_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
      "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read() {  // this thread's stores have read their source
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait() {  // and are complete
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
template <Activation kAct>
__device__ __forceinline__ float strip_act(float v) {
  if constexpr (kAct == Activation::kReLU) return fmaxf(v, 0.f);
  // exp of at most 80: finite, so the fast division stays exact enough (bf16 output)
  if constexpr (kAct == Activation::kSiLU) return __fdividef(v, 1.f + __expf(fminf(-v, 80.f)));
  return v;
}

template <typename T, Activation kAct>
__global__ void __launch_bounds__(384, 1)
    conv_strip64_t_kernel(const Params p, const __grid_constant__ StripTMaps maps) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t fbase = base, hbase = base + kStripFilterBytes;
  const uint32_t obase = hbase + kStripTBufs * kStripBufBytes;  // two consumers' output rows
  const uint32_t bars = obase + 2 * kStripOutBytes;
  const uint32_t filter_bar = bars;
  auto full_bar = [&](int b) { return bars + 8u * (1 + b); };
  auto empty_bar = [&](int b) { return bars + 8u * (1 + kStripTBufs + b); };
  auto res_bar = [&](int c) { return bars + 8u * (1 + 2 * kStripTBufs + c); };
  const int tid = threadIdx.x, wg = tid >> 7;
  const StripAt strip(p);
  const int tiles_here = strip.count();
  if (tid == 0) {
    mbar_init(filter_bar, 1);
    for (int b = 0; b < kStripTBufs; ++b) {
      mbar_init(full_bar(b), 1);
      mbar_init(empty_bar(b), 1);
    }
    mbar_init(res_bar(0), 1);
    mbar_init(res_bar(1), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 0) {  // the producer
    if (tid == 0)
      strip_produce<kStripTBufs>(p, &maps.in, &maps.w, fbase, hbase, filter_bar, full_bar(0),
                                 empty_bar(0), strip);
    return;
  }
  const int c = wg - 1, lt = tid - 128 * wg;
  const int lane = tid & 31, wl = (tid >> 5) & 3, g = lane >> 2;
  const bool has_res = p.residual != nullptr;
  // this thread's two output channels' bias: 16 wl + g (h = 0) and + 8 (h = 1)
  float bias[2] = {0.f, 0.f};
  if (p.bias) {
    const T* b = static_cast<const T*>(p.bias);
    bias[0] = to_f32(b[16 * wl + g]);
    bias[1] = to_f32(b[16 * wl + g + 8]);
  }
  // ldmatrix / stmatrix lane address of matrix (j + (m >> 1), h = m & 1), row lane & 7: output
  // pixel 8 (j + (m >> 1)) + (lane & 7), channels 16 wl + 8 h .. + 7, the 128B swizzle the TMA
  // writes and reads (16-byte chunk index XOR pixel % 8).
  const uint32_t ob = obase + c * kStripOutBytes;
  const int m = lane >> 3, r8 = lane & 7, chunk = 2 * wl + (m & 1);
  auto lane_addr = [&](int j) {
    const int px = 8 * (j + (m >> 1)) + r8;
    return ob + px * 128u + ((chunk ^ (px & 7)) << 4);
  };
  mbar_wait(filter_bar, 0);
  int res_phase = 0;
  for (int i = c; i < tiles_here; i += 2) {
    int f, oy, x0;
    strip(i, &f, &oy, &x0);
    const int row = f * p.out_h + oy;
    if (lt == 0) {
      bulk_wait_read();  // the previous strip's store has read this consumer's output buffer
      if (has_res) {
        mbar_expect_tx(res_bar(c), kStripOutBytes);
        tma_load_3d(ob, &maps.res, res_bar(c), 0, x0, row);
      }
    }
    const int b = i % kStripTBufs;
    const uint32_t hb = hbase + b * kStripBufBytes;
    float acc[64];
#pragma unroll
    for (int e = 0; e < 64; ++e) acc[e] = 0.f;
    fence_regs(acc);
    if (i > 0) named_sync(3 + c, 256);  // the other consumer has issued strip i - 1
    mbar_wait(full_bar(b), (i / kStripTBufs) & 1);
    strip_wgmmas<T>(acc, fbase, hb);
    if (i + 1 < tiles_here) named_arrive(4 - c, 256);  // strip i + 1 may issue
    wgmma_wait<0>();
    fence_regs(acc);
    named_sync(1 + c, 128);  // every warp's wgmmas are complete; the output buffer is free
    if (lt == 0) mbar_arrive(empty_bar(b));
    if (has_res) mbar_wait(res_bar(c), res_phase), res_phase ^= 1;
      // acc[4 j + 2 h + e]: output channel 16 wl + g + 8 h, pixel 8 j + 2 tig + e; ldmatrix.trans /
      // stmatrix.trans register q of an x4 holds matrix q: (j + (q >> 1), h = q & 1), e in its
      // halves.
#pragma unroll
    for (int j = 0; j < kStripPx / 8; j += 2) {
      const uint32_t addr = lane_addr(j);
      uint32_t rr[4] = {0u, 0u, 0u, 0u};
      if (has_res) ldsm_x4_trans(addr, rr);
      uint32_t out[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int a = 4 * (j + (q >> 1)) + 2 * (q & 1);
        float v[2] = {acc[a] + bias[q & 1], acc[a + 1] + bias[q & 1]};
        add_packed<T>(v, rr[q]);
        out[q] = pack2<T>(strip_act<kAct>(v[0]), strip_act<kAct>(v[1]));
      }
      stsm_x4_trans(addr, out);
    }
    fence_proxy_async();     // the rows written, before the TMA store reads them
    named_sync(1 + c, 128);  // every warp's rows
    if (lt == 0) tma_store_3d(&maps.y, ob, 0, x0, row);
  }
  if (lt == 0) bulk_wait();
}

#else  // not sm_90a: never launched (conv_wgmma_fits checks the device), kept so the host links.

template <typename T, int kBn, int kMt, int kWg, int kSt>
__global__ void __launch_bounds__(128 * kWg, kWg == 2 && kMt == 1 && kBn <= 128 ? 2 : 1)
    conv_wgmma_kernel(const Params) {
  __trap();
}

template <typename T, int kBn, int kC>
__global__ void __launch_bounds__(256, 2) conv_halo_kernel(const Params) {
  __trap();
}

template <typename T, int kBn, int kC, int kR = halo_rows(kBn, kC), int kSt = kHaloStages,
          bool kPair = false>
__global__ void __launch_bounds__(256, (kR == 4 && kC == 96) || kSt > 3 || kC > 96 ? 1 : 2)
    conv_halo_tma_kernel(const Params, const __grid_constant__ HaloMaps) {
  __trap();
}

template <typename T>
__global__ void __launch_bounds__(384, 1)
    conv_strip64_kernel(const Params, const __grid_constant__ StripMaps) {
  __trap();
}

template <typename T, Activation kAct>
__global__ void __launch_bounds__(384, 1)
    conv_strip64_t_kernel(const Params, const __grid_constant__ StripTMaps) {
  __trap();
}

#endif

constexpr size_t smem_for(int bn, int mt, int wg = 2, int stages = kStages) {
  return 1024 /* alignment slack */ + static_cast<size_t>(stages) * (64 * wg * mt + bn) * 128;
}

// A block's tile: 64 wg mt output pixels by bn output channels. wg = 2, mt = 1 with bn <= 128
// fits two blocks an SM (16 warps hide the gather's latency: 1.7x the one-block 256 x 96 tile of
// 2 warpgroups at the Wan VAE's full-resolution 96-channel convolutions, bench_conv on the H100).
// wg = 4, mt = 1 (bn <= 128): one block of the same 16 warps over 256 pixels, which loads each
// step's filter rows once where two blocks load them twice (~40 % of the bytes the 96-channel
// 3x3x3 convolutions move from L2); measured 5-8 % slower a call than two blocks (likely one
// barrier a step holding all 16 warps; bench/NOTES.md, session 20), so only
// LATENT_CONV_WGMMA_TILE picks it.
using Tile = ConvWgmmaTile;

// `forced` where its bn divides k; else the default: the narrowest of 96, 128, 64 that divides
// k, else the widest of 256, 192; two blocks an SM where bn <= 128. bn 0: no tile divides k.
Tile tile_for(int k, const Tile& forced) {
  if (forced.bn && k % forced.bn == 0) return forced;
  Tile t;
  for (int bn : {96, 128, 64, 256, 192})
    if (k % bn == 0) {
      t.bn = bn;
      return t;
    }
  return t;
}

template <typename T, int kBn, int kMt, int kWg, int kSt = kStages>
Status run_tile(const Params& p, const Launch& l) {
  constexpr size_t kSmem = smem_for(kBn, kMt, kWg, kSt);
  constexpr int kBm = 64 * kWg * kMt;
  auto kernel = conv_wgmma_kernel<T, kBn, kMt, kWg, kSt>;
  LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem)));
  const dim3 grid((p.m + kBm - 1) / kBm, p.k / kBn);
  kernel<<<grid, 128 * kWg, kSmem, l.stream>>>(p);
  LATENT_CUDA_CHECK_LAUNCH("conv_wgmma_kernel");
  return ok_status();
}

template <typename T, int kBn>
Status run(const Params& p, const Tile& t, const Launch& l) {
  if constexpr (kBn <= 128) {
    if (t.wg == 4 && t.stages == 5) return run_tile<T, kBn, 1, 4, 5>(p, l);
    if (t.wg == 4) return run_tile<T, kBn, 1, 4>(p, l);
    if (t.mt == 2) return run_tile<T, kBn, 2, 2>(p, l);
  }
  return run_tile<T, kBn, 1, 2>(p, l);
}

// The halo kernel's shared memory: one halo of halo_pixels(rows) x c, and kHaloStages filter
// buffers of bn x c (one spatial tap each), 1024-byte aligned. Two blocks an SM where it is at
// most ~113 KiB (64 -> 64 and 96 -> 96 channels).
size_t halo_smem(int bn, int c) {
  return 1024 + static_cast<size_t>(halo_pixels(halo_rows(bn, c))) * c * 2 +
         static_cast<size_t>(kHaloStages) * bn * c * 2;
}

// The halo kernel's channel tile: the narrowest of 96, 128, 64 that divides k (0: none).
int halo_bn(int k) {
  for (int bn : {96, 128, 64})
    if (k % bn == 0) return bn;
  return 0;
}

int64_t halo_tiles(int frames, int out_h, int out_w, int rows) {
  return static_cast<int64_t>(frames) * ((out_h + rows - 1) / rows) * ((out_w + 63) / 64);
}

// Whether a halo kernel can run this call: 3x3 (x kt) filters, stride 1, 64 or 96 input
// channels, an output-channel tile, its shared memory, the tile count in range.
bool halo_shape_fits(const ConvWgmmaArgs& a, const Launch& l) {
  if (a.stride != 1 || a.r != 3 || a.s != 3) return false;
  // 192 input channels: the TMA halo tile only (its 192 -> 192 form, session 24)
  if (a.c != 64 && a.c != 96 && !(a.c == 192 && a.k % 96 == 0)) return false;
  const int bn = halo_bn(a.k);
  if (bn == 0 || halo_smem(bn, a.c) + 64 > l.smem_optin) return false;
  return halo_tiles(a.frames, a.out_h, a.out_w, halo_rows(bn, a.c)) < INT32_MAX;
}

Result<PFN_cuTensorMapEncodeTiled_v12000> encode_tiled();
// Whether the driver encodes tensor maps (the TMA kernels' defaults need it); asked once.
bool tma_available() {
  static const bool ok = encode_tiled().ok();
  return ok;
}

// Which kernel runs a call the halo kernels fit: LATENT_CONV_WGMMA_TILE=halo / halotma: that one;
// "implicit" or another tile: none; the default: the TMA one where it beat cuDNN's fused graphs
// per call (bench_conv, H200, 2026-11-28 session 23: 96 -> 96 channels 0.94 (0.86 with 2 filter
// buffers, session 24) against 1.01 ms at 720p 3x3x3, 0.43 against 0.52 at 720p 3x3; 64 -> 64 with
// a residual 0.46-0.52 against 0.50-0.54 at 1080p; behind it at 64 -> 64 without a residual,
// 0.41-0.42 against 0.32-0.33, and at 96 -> 192, 0.19 against 0.15). Session 24: 192 -> 192
// 3x3x3 at 360p 0.949 against the fused graph's 1.046 (cuDNN unfused with its separate epilogue
// pass 0.873-0.902; the Wan 2.1 720p streams +2-3 %); 2-D 192 -> 192 stays on cuDNN (0.415 against
// 0.383-0.404).
enum class HaloKind { kNone, kCpAsync, kTma };
HaloKind halo_kind(const ConvWgmmaArgs& a, const Launch& l) {
  if (!halo_shape_fits(a, l)) return HaloKind::kNone;
  if (a.c == 192 && (a.tile.halo || !tma_available())) return HaloKind::kNone;
  if (a.tile.halo) return HaloKind::kCpAsync;
  if (a.tile.halo_tma) return HaloKind::kTma;
  if (a.tile.no_halo || a.tile.bn != 0) return HaloKind::kNone;
  const bool wins = (a.c == 96 && a.k == 96) || (a.c == 192 && a.k == 192 && a.kt == 3) ||
                    (a.c == 64 && a.k == 64 && a.residual);
  return wins && tma_available() ? HaloKind::kTma : HaloKind::kNone;
}
bool halo_fits(const ConvWgmmaArgs& a, const Launch& l) {
  return halo_kind(a, l) != HaloKind::kNone;
}

template <typename T, int kBn, int kC>
Status run_halo_tile(const Params& p, const Launch& l) {
  const size_t smem = halo_smem(kBn, kC);
  auto kernel = conv_halo_kernel<T, kBn, kC>;
  LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(halo_tiles(p.frames, p.out_h, p.out_w, halo_rows(kBn, kC))),
                  p.k / kBn);
  kernel<<<grid, 256, smem, l.stream>>>(p);
  LATENT_CUDA_CHECK_LAUNCH("conv_halo_kernel");
  return ok_status();
}

// The TMA halo kernel's tensor maps: the input frames' segments as [frames][h][w][c] boxes of
// [1][rows + 2][66][64 | 32], the filter [k][ktot] as boxes of [bn][64 | 32].
using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

Result<EncodeTiled> encode_tiled() {
  static void* fn = nullptr;
  static cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  static const cudaError_t rc = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn,
                                                                 12000, cudaEnableDefault, &found);
  if (rc != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn)
    return Status::errorf("conv_wgmma: the driver has no cuTensorMapEncodeTiled (",
                          cudaGetErrorString(rc), ", query result ", static_cast<int>(found), ")");
  return reinterpret_cast<EncodeTiled>(fn);
}

Status encode_map(EncodeTiled encode, CUtensorMap* map, bool bf16, const void* base, int rank,
                  const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                  int inner_bytes) {
  const cuuint32_t ones[4] = {1, 1, 1, 1};
  const CUresult rc =
      encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, box, ones,
             CU_TENSOR_MAP_INTERLEAVE_NONE,
             inner_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS)
    return Status::errorf("conv_wgmma: cuTensorMapEncodeTiled failed (CUresult ",
                          static_cast<int>(rc), ", rank ", rank, ", box of ", inner_bytes,
                          " bytes)");
  return ok_status();
}

Status make_halo_maps(const Params& p, int bn, int rows, bool bf16, HaloMaps* maps) {
  Result<EncodeTiled> encode = encode_tiled();
  if (!encode.ok()) return encode.status();
  const int total = p.frames + p.kt - 1;  // input frames
  const void* seg[3] = {p.in.x0, p.in.x1, p.in.x2};
  const int first[3] = {0, p.in.n0, p.in.n1};
  const int end[3] = {std::min(p.in.n0, total), std::min(p.in.n1, total), total};
  for (int s = 0; s < 3; ++s) {
    const cuuint64_t frames = static_cast<cuuint64_t>(std::max(1, end[s] - first[s]));
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(p.c), static_cast<cuuint64_t>(p.w),
                                static_cast<cuuint64_t>(p.h), frames};
    const cuuint64_t strides[3] = {static_cast<cuuint64_t>(p.c) * 2,
                                   static_cast<cuuint64_t>(p.w) * p.c * 2,
                                   static_cast<cuuint64_t>(p.in.frame_elems) * 2};
    for (int pl = 0; pl < 2; ++pl) {
      const cuuint32_t box[4] = {pl == 0 ? 64u : 32u, 66u, static_cast<cuuint32_t>(rows + 2), 1u};
      LATENT_TRY(encode_map(encode.value(), &maps->in[s][pl], bf16, seg[s], 4, dims, strides, box,
                            pl == 0 ? 128 : 64));
    }
  }
  const cuuint64_t wdims[2] = {static_cast<cuuint64_t>(p.ktot), static_cast<cuuint64_t>(p.k)};
  const cuuint64_t wstrides[1] = {static_cast<cuuint64_t>(p.ktot) * 2};
  for (int pl = 0; pl < 2; ++pl) {
    const cuuint32_t box[2] = {pl == 0 ? 64u : 32u, static_cast<cuuint32_t>(bn)};
    LATENT_TRY(encode_map(encode.value(), &maps->w[pl], bf16, p.weight, 2, wdims, wstrides, box,
                          pl == 0 ? 128 : 64));
  }
  return ok_status();
}

constexpr size_t halo_tma_smem(int bn, int c, int rows, int stages) {
  return 1024 + static_cast<size_t>(halo_pixels(rows)) * c * 2 +
         static_cast<size_t>(stages) * bn * c * 2 + 8 * (1 + stages);  // + the mbarriers
}

template <typename T, int kBn, int kC, int kR = halo_rows(kBn, kC), int kSt = kHaloStages,
          bool kPair = false>
Status run_halo_tma_tile(const Params& p, const Launch& l) {
  HaloMaps maps;
  LATENT_TRY(make_halo_maps(p, kBn, kR, std::is_same_v<T, bf16>, &maps));
  const size_t smem = halo_tma_smem(kBn, kC, kR, kSt);
  if (smem > l.smem_optin)
    return Status::errorf("conv_wgmma: the halo tile of ", kR, " rows and ", kSt,
                          " filter buffers needs ", smem, " bytes of shared memory, the device ",
                          l.smem_optin);
  auto kernel = conv_halo_tma_kernel<T, kBn, kC, kR, kSt, kPair>;
  LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(halo_tiles(p.frames, p.out_h, p.out_w, kR)), p.k / kBn);
  if constexpr (kPair) {
    if (p.k != 2 * kBn || !p.norm_gamma)
      return Status::errorf("conv_wgmma: the paired halo tile takes ", 2 * kBn,
                            " output channels and the channel norm (got ", p.k, ")");
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(256);
    config.dynamicSmemBytes = smem;
    config.stream = l.stream;
    cudaLaunchAttribute cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1;
    cluster.val.clusterDim.y = 2;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    LATENT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, maps));
  } else {
    kernel<<<grid, 256, smem, l.stream>>>(p, maps);
  }
  LATENT_CUDA_CHECK_LAUNCH("conv_halo_tma_kernel");
  return ok_status();
}

// Whether the strip kernel can run this call: 64 -> 64 channels, a 2-D 3x3 filter, stride 1,
// the input in one tensor, its shared memory, the strip count in range.
bool strip64_fits(const ConvWgmmaArgs& a, const Launch& l) {
  if (a.c != 64 || a.k != 64 || a.kt != 1 || a.x1 || a.stride != 1 || a.r != 3 || a.s != 3)
    return false;
  if (std::max(kStripSmem, kStripTSmem) > l.smem_optin) return false;
  const int64_t strips =
      static_cast<int64_t>(a.frames) * a.out_h * ((a.out_w + kStripPx - 1) / kStripPx);
  return strips < INT32_MAX;
}

Status make_strip_maps(const Params& p, bool bf16, int box_rows, StripMaps* maps) {
  Result<EncodeTiled> encode = encode_tiled();
  if (!encode.ok()) return encode.status();
  const cuuint64_t dims[4] = {64, static_cast<cuuint64_t>(p.w), static_cast<cuuint64_t>(p.h),
                              static_cast<cuuint64_t>(p.frames)};
  const cuuint64_t strides[3] = {64 * 2, static_cast<cuuint64_t>(p.w) * 64 * 2,
                                 static_cast<cuuint64_t>(p.in.frame_elems) * 2};
  const cuuint32_t box[4] = {64, kStripHw, static_cast<cuuint32_t>(box_rows), 1};
  LATENT_TRY(encode_map(encode.value(), &maps->in, bf16, p.in.x0, 4, dims, strides, box, 128));
  const cuuint64_t wdims[2] = {static_cast<cuuint64_t>(p.ktot), 64};
  const cuuint64_t wstrides[1] = {static_cast<cuuint64_t>(p.ktot) * 2};
  const cuuint32_t wbox[2] = {64, 64};
  return encode_map(encode.value(), &maps->w, bf16, p.weight, 2, wdims, wstrides, wbox, 128);
}

// Whether conv_strip64_t_kernel can run a call the strip kernel fits: no activation, ReLU or SiLU,
// y and the residual 16-byte aligned (the TMA's global addresses).
bool strip64_t_fits(const void* y, const void* residual, int act_id) {
  const auto act = static_cast<Activation>(act_id);
  if (act != Activation::kNone && act != Activation::kReLU && act != Activation::kSiLU)
    return false;
  return ((reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(residual)) & 15) == 0;
}

// Whether the strip kernel runs this call: LATENT_CONV_WGMMA_TILE=strip64 / strip64s wherever it
// fits; by default (no tile named) where it beat cuDNN's fused graph per call: 64 -> 64 2-D 3x3
// with no activation, ReLU or SiLU (bench_conv, H200, session 24, conv_strip64_t_kernel: 0.23-0.25
// ms at 1080p against 0.32-0.47; 0.31 against 0.54 with a residual and SiLU).
bool use_strip64(const ConvWgmmaArgs& a, const Launch& l) {
  if (!strip64_fits(a, l)) return false;
  if (a.tile.strip64 || a.tile.strip64_staged) return true;
  if (a.tile.bn != 0 || a.tile.halo || a.tile.halo_tma || a.tile.no_halo) return false;
  const auto act = static_cast<Activation>(a.act);
  // with SiLU only on the new kernel (the staged one took 0.58 against cuDNN's 0.54 ms)
  return tma_available() && (act == Activation::kNone || act == Activation::kReLU ||
                             strip64_t_fits(a.y, a.residual, static_cast<int>(a.act)));
}

template <typename T>
Status run_strip64(const Params& p, const Launch& l) {
  StripMaps maps;
  LATENT_TRY(make_strip_maps(p, std::is_same_v<T, bf16>, 3, &maps));
  auto kernel = conv_strip64_kernel<T>;
  LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kStripSmem)));
  const int64_t strips =
      static_cast<int64_t>(p.frames) * p.out_h * ((p.out_w + kStripPx - 1) / kStripPx);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(strips, std::max(1, l.sm_count)));
  kernel<<<grid, 384, kStripSmem, l.stream>>>(p, maps);
  LATENT_CUDA_CHECK_LAUNCH("conv_strip64_kernel");
  return ok_status();
}

Status make_strip_t_maps(const Params& p, bool bf16, StripTMaps* maps) {
  StripMaps in;
  LATENT_TRY(make_strip_maps(p, bf16, 3, &in));
  maps->in = in.in;
  maps->w = in.w;
  Result<EncodeTiled> encode = encode_tiled();
  if (!encode.ok()) return encode.status();
  const cuuint64_t dims[3] = {64, static_cast<cuuint64_t>(p.out_w),
                              static_cast<cuuint64_t>(p.frames) * p.out_h};
  const cuuint64_t strides[2] = {64 * 2, static_cast<cuuint64_t>(p.out_w) * 64 * 2};
  const cuuint32_t box[3] = {64, kStripPx, 1};
  LATENT_TRY(encode_map(encode.value(), &maps->y, bf16, p.y, 3, dims, strides, box, 128));
  if (p.residual)
    LATENT_TRY(
        encode_map(encode.value(), &maps->res, bf16, p.residual, 3, dims, strides, box, 128));
  return ok_status();
}

template <typename T, Activation kAct>
Status run_strip64_t_act(const Params& p, const Launch& l) {
  StripTMaps maps;
  LATENT_TRY(make_strip_t_maps(p, std::is_same_v<T, bf16>, &maps));
  auto kernel = conv_strip64_t_kernel<T, kAct>;
  LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kStripTSmem)));
  const int64_t strips =
      static_cast<int64_t>(p.frames) * p.out_h * ((p.out_w + kStripPx - 1) / kStripPx);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(strips, std::max(1, l.sm_count)));
  kernel<<<grid, 384, kStripTSmem, l.stream>>>(p, maps);
  LATENT_CUDA_CHECK_LAUNCH("conv_strip64_t_kernel");
  return ok_status();
}

template <typename T>
Status run_strip64_t(const Params& p, const Launch& l) {
  switch (static_cast<Activation>(p.act)) {
    case Activation::kReLU:
      return run_strip64_t_act<T, Activation::kReLU>(p, l);
    case Activation::kSiLU:
      return run_strip64_t_act<T, Activation::kSiLU>(p, l);
    default:
      return run_strip64_t_act<T, Activation::kNone>(p, l);
  }
}

// The TMA halo tile with 96 output channels a block, from 96 or 192 input channels, and its
// variants (LATENT_CONV_WGMMA_TILE=halotma r4 / s2 / s3 / s4): rows a block and filter buffers.
// At 96 -> 96 by default 2 rows and 2 filter buffers: on an H200 (session 24,
// bench_conv) 0.859 ms at 720p 3x3x3 against 0.924 with 3 buffers, 1.063-1.068 with 4 rows,
// 1.237 with 4 buffers; 0.427 against 0.439 at 720p 3x3.
constexpr int kHalo96Stages = 2;
template <typename T>
Status run_halo_tma_96(const Params& p, const ConvWgmmaTile& t, const Launch& l) {
  const int r = t.halo_rows ? t.halo_rows : 2, st = t.halo_stages ? t.halo_stages : kHalo96Stages;
  if (p.c == 192) {  // 2 rows only (4 would need 150 KiB of halo); 3 filter buffers or 2
    // (H200, session 24: 0.949 against 0.975 ms at 360p 3x3x3, 0.415 against 0.446 at 3x3)
    if (t.halo_stages == 2) return run_halo_tma_tile<T, 96, 192, 2, 2>(p, l);
    // 192 -> 192 with the channel norm: the pixel tile's 2 blocks as a cluster
    if (p.norm_gamma && p.k == 192) return run_halo_tma_tile<T, 96, 192, 2, 3, true>(p, l);
    return run_halo_tma_tile<T, 96, 192, 2, 3>(p, l);
  }
  if (r == 4 && st == 2) return run_halo_tma_tile<T, 96, 96, 4, 2>(p, l);
  if (r == 4 && st == 3) return run_halo_tma_tile<T, 96, 96, 4, 3>(p, l);
  if (r == 4 && st == 4) return run_halo_tma_tile<T, 96, 96, 4, 4>(p, l);
  if (r == 2 && st == 3) return run_halo_tma_tile<T, 96, 96, 2, 3>(p, l);
  if (r == 2 && st == 4) return run_halo_tma_tile<T, 96, 96, 2, 4>(p, l);
  return run_halo_tma_tile<T, 96, 96, 2, 2>(p, l);
}

template <typename T, int kC>
Status run_halo_c(const Params& p, bool tma, const ConvWgmmaTile& t, const Launch& l) {
  switch (halo_bn(p.k)) {
    case 96:
      if (tma && kC == 96) return run_halo_tma_96<T>(p, t, l);
      return tma ? run_halo_tma_tile<T, 96, kC>(p, l) : run_halo_tile<T, 96, kC>(p, l);
    case 128:
      return tma ? run_halo_tma_tile<T, 128, kC>(p, l) : run_halo_tile<T, 128, kC>(p, l);
    case 64:
      return tma ? run_halo_tma_tile<T, 64, kC>(p, l) : run_halo_tile<T, 64, kC>(p, l);
    default:
      return Status::errorf("conv_wgmma: no halo channel tile for ", p.k, " output channels");
  }
}

template <typename T>
Status run_halo(const Params& p, bool tma, const ConvWgmmaTile& t, const Launch& l) {
  if (p.c == 192) {  // the TMA tile only, 96 output channels a block (halo_shape_fits, halo_kind)
    if (!tma || halo_bn(p.k) != 96)
      return Status::errorf(
          "conv_wgmma: 192 input channels need the TMA halo tile and output "
          "channels a multiple of 96 (got ",
          p.k, ")");
    return run_halo_tma_96<T>(p, t, l);
  }
  return p.c == 64 ? run_halo_c<T, 64>(p, tma, t, l) : run_halo_c<T, 96>(p, tma, t, l);
}

template <typename T>
Status run_for(const Params& p, const Tile& t, const Launch& l) {
  switch (t.bn) {
    case 256:
      return run<T, 256>(p, t, l);
    case 192:
      return run<T, 192>(p, t, l);
    case 128:
      return run<T, 128>(p, t, l);
    case 96:
      return run<T, 96>(p, t, l);
    case 64:
      return run<T, 64>(p, t, l);
    default:
      return Status::errorf("conv_wgmma: no channel tile divides ", p.k, " output channels");
  }
}

}  // namespace

bool conv_wgmma_fits(const ConvWgmmaArgs& a, DType dtype, const Launch& l) {
  const Tile t = tile_for(a.k, a.tile);
  if (dtype == DType::kF32 || a.c % 8 != 0 || a.c < 8 || (t.bn == 0 && !halo_fits(a, l)))
    return false;
  if (a.r < 1 || a.s < 1 || a.r * a.s > 32 || a.kt < 1 || a.frames < 1 || a.h < 1 || a.w < 1 ||
      a.out_h < 1 || a.out_w < 1 || (a.stride != 1 && a.stride != 2) || a.pad_top < 0 ||
      a.pad_left < 0 || a.pad_top >= a.r || a.pad_left >= a.s)
    return false;
  // every output pixel's filter window starts inside the padded input
  if ((a.out_h - 1) * a.stride - a.pad_top >= a.h || (a.out_w - 1) * a.stride - a.pad_left >= a.w)
    return false;
  if (!halo_fits(a, l) && smem_for(t.bn, t.mt, t.wg, t.stages) > l.smem_optin) return false;
  const int64_t m = static_cast<int64_t>(a.frames) * a.out_h * a.out_w;
  const int64_t ktot = static_cast<int64_t>(a.kt) * a.r * a.s * a.c;
  if (m > INT32_MAX || ktot > INT32_MAX || m * a.k > (int64_t{1} << 40)) return false;
  if (!conv_frames_fit(a) || (a.y && !aligned16(a.y)) || (a.residual && !aligned16(a.residual)))
    return false;
  return current_device_runs_sm90a();
}

bool conv_wgmma_preferred(const ConvWgmmaArgs& a, const Launch& l) {
  // bench_conv, H100, bf16 (2026-11-24, bench/NOTES.md): per call the kernel is ahead of cuDNN +
  // its epilogue pass at 3x3x3 with 96 output channels (720p, the Wan VAEs' full-resolution
  // convolutions: 1.31 against 2.26 ms), at 2-D 3x3 / 1x1 convolutions with 192 output channels
  // at 360p (0.29 against 0.45-0.56 ms) and at every stride-2 shape (1.3-2.9x); behind it at
  // 3x3x3 192 / 384 (by 10-15%) and at 2-D 3x3 with 64 / 96 / 128 output channels (short K: by
  // 10-50%). Whole models disagree with the per-call numbers outside the first case: with the
  // 2-D 192-channel and stride-2 shapes on the kernel as well, the Qwen-Image VAE's image mode at
  // 1024^2 ran 31.2 ms a frame against 29.9 all-cuDNN and the Wan streams gained nothing more,
  // so only the first case is the default, and only where the kernel reads the past frames in
  // place (x1: a causal cache in separate tensors). Over one tensor of frames (a frame ring,
  // engine/models/vae/qwen_image.cpp) cuDNN's fused operation graph is ahead at that shape too
  // (bench_conv, 2026-11-28: 1.01 against 1.39 ms on an H200; H100 session 12: 1.17 against 1.40).
  // LATENT_CONV_WGMMA_TILE=halo (measuring it): every call the halo kernel fits.
  // The halo kernels where halo_kind() picks one (by default the TMA one where it beat cuDNN).
  return (a.k == 96 && a.kt == 3 && a.x1 != nullptr) || halo_fits(a, l) || use_strip64(a, l);
}

bool conv_wgmma_norm_fits(const ConvWgmmaArgs& a, DType dtype, const Launch& l) {
  if (!a.norm_gamma || a.residual || !aligned16(a.norm_gamma) || !conv_wgmma_fits(a, dtype, l))
    return false;
  if (a.act != Activation::kNone && a.act != Activation::kSiLU) return false;
  if (use_strip64(a, l)) return false;  // its own epilogue
  if (const HaloKind h = halo_kind(a, l); h != HaloKind::kNone) {
    if (halo_bn(a.k) == a.k) return true;
    // 192 -> 192 on the TMA tile with 3 filter buffers (the default): 2 blocks a pixel tile,
    // their sums met in a cluster (conv_halo_tma_kernel's kPair)
    return h == HaloKind::kTma && a.c == 192 && a.k == 192 && a.tile.halo_stages != 2;
  }
  return tile_for(a.k, a.tile).bn == a.k;
}

Status launch_conv_wgmma(const ConvWgmmaArgs& a, DType dtype, const Launch& l) {
  Params p;
  static_cast<ConvKernelArgs&>(p) = conv_kernel_args(a);
  p.stride = a.stride;
  p.ohw = a.out_h * a.out_w;
  p.m = a.frames * p.ohw;
  p.ktot = a.kt * a.r * a.s * a.c;
  if (a.norm_gamma) {
    if (!conv_wgmma_norm_fits(a, dtype, l))
      return Status::errorf(
          "conv_wgmma: the channel norm cannot run in the epilogue of this call (", a.k,
          " output channels, ", a.residual ? "a residual" : "no residual",
          "; conv_wgmma_norm_fits)");
    p.norm_gamma = a.norm_gamma;
    p.norm_sqrt_c = std::sqrt(static_cast<float>(a.k));
  }
  if (use_strip64(a, l)) {
    if (!a.tile.strip64_staged && strip64_t_fits(p.y, p.residual, p.act)) {
      if (dtype == DType::kBF16) return run_strip64_t<bf16>(p, l);
      if (dtype == DType::kF16) return run_strip64_t<f16>(p, l);
    }
    if (dtype == DType::kBF16) return run_strip64<bf16>(p, l);
    if (dtype == DType::kF16) return run_strip64<f16>(p, l);
  }
  if (const HaloKind h = halo_kind(a, l); h != HaloKind::kNone) {
    if (dtype == DType::kBF16) return run_halo<bf16>(p, h == HaloKind::kTma, a.tile, l);
    if (dtype == DType::kF16) return run_halo<f16>(p, h == HaloKind::kTma, a.tile, l);
  }
  const Tile t = tile_for(a.k, a.tile);
  if (dtype == DType::kBF16) return run_for<bf16>(p, t, l);
  if (dtype == DType::kF16) return run_for<f16>(p, t, l);
  return Status::error("conv_wgmma: bf16 or fp16 only");
}

}  // namespace latent::cuda
