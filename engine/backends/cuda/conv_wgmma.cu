// Hopper implicit-GEMM convolution (see conv_wgmma.cuh): wgmma.mma_async (sm_90a) with A (input
// pixels x 64 channels of one filter tap) and B (output channels x the same 64 K) from 128B-
// swizzled shared tiles filled by cp.async, fp32 accumulators, the epilogue fused.
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
#include <cstdio>
#include <cstdlib>
#include <cstring>

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
};

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

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, wl = warp & 3;
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

  // Epilogue: acc[t][4 i + e] is row 16 wl + g (e = 0, 1) or + 8 (e = 2, 3) of this warpgroup's
  // m64 tile t, column 8 i + 2 tig + e % 2.
  const int g = lane >> 2, tig = lane & 3;
  const T* bias = static_cast<const T*>(p.bias);
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  const Activation act = static_cast<Activation>(p.act);
#pragma unroll
  for (int t = 0; t < kMt; ++t) {
    const int row0 = m0 + (wg * kMt + t) * 64 + wl * 16 + g;
#pragma unroll
    for (int i = 0; i < kBn / 8; ++i) {
      const int col = n0 + i * 8 + tig * 2;
      float b0 = 0.f, b1 = 0.f;
      if (bias) {
        b0 = to_f32(bias[col]);
        b1 = to_f32(bias[col + 1]);
      }
#pragma unroll
      for (int hrow = 0; hrow < 2; ++hrow) {
        const int row = row0 + hrow * 8;
        if (row >= p.m) continue;
        const int64_t off = static_cast<int64_t>(row) * p.k + col;
        float v0 = acc[t][4 * i + 2 * hrow] + b0, v1 = acc[t][4 * i + 2 * hrow + 1] + b1;
        if (res) {
          v0 += to_f32(res[off]);
          v1 += to_f32(res[off + 1]);
        }
        *reinterpret_cast<uint32_t*>(y + off) = pack2<T>(activate(v0, act), activate(v1, act));
      }
    }
  }
}

#else  // not sm_90a: never launched (conv_wgmma_fits checks the device), kept so the host links.

template <typename T, int kBn, int kMt, int kWg, int kSt>
__global__ void __launch_bounds__(128 * kWg, kWg == 2 && kMt == 1 && kBn <= 128 ? 2 : 1)
    conv_wgmma_kernel(const Params) {
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
  if (dtype == DType::kF32 || a.c % 8 != 0 || a.c < 8 || t.bn == 0) return false;
  if (a.r < 1 || a.s < 1 || a.r * a.s > 32 || a.kt < 1 || a.frames < 1 || a.h < 1 || a.w < 1 ||
      a.out_h < 1 || a.out_w < 1 || (a.stride != 1 && a.stride != 2) || a.pad_top < 0 ||
      a.pad_left < 0 || a.pad_top >= a.r || a.pad_left >= a.s)
    return false;
  // every output pixel's filter window starts inside the padded input
  if ((a.out_h - 1) * a.stride - a.pad_top >= a.h || (a.out_w - 1) * a.stride - a.pad_left >= a.w)
    return false;
  if (smem_for(t.bn, t.mt, t.wg, t.stages) > l.smem_optin) return false;
  const int64_t m = static_cast<int64_t>(a.frames) * a.out_h * a.out_w;
  const int64_t ktot = static_cast<int64_t>(a.kt) * a.r * a.s * a.c;
  if (m > INT32_MAX || ktot > INT32_MAX || m * a.k > (int64_t{1} << 40)) return false;
  if (!conv_frames_fit(a) || (a.y && !aligned16(a.y)) || (a.residual && !aligned16(a.residual)))
    return false;
  return current_device_runs_sm90a();
}

bool conv_wgmma_preferred(const ConvWgmmaArgs& a) {
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
  return a.k == 96 && a.kt == 3 && a.x1 != nullptr;
}

Status launch_conv_wgmma(const ConvWgmmaArgs& a, DType dtype, const Launch& l) {
  Params p;
  static_cast<ConvKernelArgs&>(p) = conv_kernel_args(a);
  p.stride = a.stride;
  p.ohw = a.out_h * a.out_w;
  p.m = a.frames * p.ohw;
  p.ktot = a.kt * a.r * a.s * a.c;
  const Tile t = tile_for(a.k, a.tile);
  if (dtype == DType::kBF16) return run_for<bf16>(p, t, l);
  if (dtype == DType::kF16) return run_for<f16>(p, t, l);
  return Status::error("conv_wgmma: bf16 or fp16 only");
}

}  // namespace latent::cuda
