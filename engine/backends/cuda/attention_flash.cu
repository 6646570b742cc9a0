// Flash attention (see attention_flash.cuh): scores one key tile at a time with an fp32 online
// softmax, never the whole tq x tk matrix. Scores stay raw (q.k); the scale log2(e) / sqrt(d)
// is folded into the exponent, p = 2^(s * scale - m * scale), one FFMA and one ex2.approx.
//
// attention_mma_kernel<T, Config> (bf16/fp16, mma.sync m16n8k16, fp32 accumulators):
//   A block takes kBr = 16 * kMTiles * kRowGroups queries. Warps form kRowGroups row groups x
//   kSplit channel slices of DW = D / kSplit. A warp owns kMTiles m16 tiles of queries (32 rows
//   for kMTiles = 2: every K and V fragment read from shared memory feeds two MMAs, which halves
//   the shared-memory traffic per FLOP, the limit of the 16-row form).
//   d <= 128: kSplit = 1, K and V tiles of kBc = 64 keys, double-buffered: tile t + 1 is
//   requested by cp.async when tile t's wait ends, so a whole step hides its latency.
//   d > 128 (VAE): a 16 x 512 fp32 O tile is 256 registers a thread, so the warps of a row group
//   split the channels, compute partial Q K^T over their slice, sum the partial scores through
//   shared memory (same order in every warp: identical scores, identical softmax), and keep O
//   for their own slice. 32-key tiles, one buffer each for K and V (shared memory is full).
//   P never leaves registers: the accumulator layout of two adjacent n8 tiles is the A layout
//   of one k16 step of the P V product.
//   Key keep flags (mask value != 0 and key < tk) go to shared memory as one bit per key,
//   computed by a ballot of the warps that load them; each mask value is fetched into a
//   register one tile ahead, so its latency is off the critical path. A tile whose flags are
//   all set skips the masking. A tile with every key masked leaves the running maximum at
//   -inf; the exponent base is then 0, so p = alpha = 0 and no NaN arises; a row that never saw
//   a key ends with l = 0 and is written as zeros.
//
// attention_simple_kernel<T, kMaxD> (any dtype, d <= 512): CUDA cores, 4 warps x 4 queries a
//   block; lane j scores key j of a 32-key tile, then each lane accumulates channels lane + 32 i.
//
// attention_wgmma.cu holds the Hopper (sm_90a) kernel for d = 128, launched from here only when
// the shape fits on a compute capability 9.0 device (the default there; LATENT_ATTENTION_KERNEL=
// mma|mma16|mma32|simple forces another kernel).
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/backends/cuda/attention_common.cuh"
#include "engine/backends/cuda/attention_flash.cuh"
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/mma.cuh"
#include "engine/core/env.h"
#ifdef LATENT_ATTENTION_WGMMA
#include "engine/backends/cuda/attention_wgmma.cuh"
#endif

namespace latent::cuda {
namespace {

// ---- tensor-core kernel ------------------------------------------------------------------

template <int D_, int kSplit_, int kRowGroups_, int kMTiles_, int kBc_, int kStages_,
          int kMinBlocks_>
struct MmaConfig {
  static constexpr int D = D_;
  static constexpr int kSplit = kSplit_;  // warps sharing a row group, one channel slice each
  static constexpr int DW = D / kSplit;   // channels of a warp's slice
  static constexpr int kRowGroups = kRowGroups_;
  static constexpr int kMTiles = kMTiles_;  // m16 tiles of queries per warp
  static constexpr int kBr = 16 * kMTiles * kRowGroups;
  static constexpr int kBc = kBc_;
  static constexpr int kStages = kStages_;  // buffers each of K and V
  static constexpr int kWarps = kRowGroups * kSplit;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kLd = D + 8;  // shared row: 16 bytes of padding, ldmatrix conflict-free
  static constexpr size_t kTileBytes = static_cast<size_t>(kBc) * kLd * 2;
  static constexpr size_t kSmem =
      static_cast<size_t>(kBr) * kLd * 2 + 2 * kStages * kTileBytes + 2 * (kBc / 32) * 4 +
      (kSplit > 1 ? static_cast<size_t>(kWarps) * 16 * kBc * sizeof(float) : 0);
  static_assert(D % (16 * kSplit) == 0 && kBc % 32 == 0 && (kStages == 1 || kStages == 2));
  static_assert(kSplit == 1 || kMTiles == 1, "the partial-score exchange handles one m16 tile");
  static_assert(kBc / 32 <= kWarps, "one warp per 32 keep flags");
};

// d <= 128: 8 warps x 16 queries or 4 warps x 32 queries; 64 keys, K/V double-buffered.
template <int D>
using Mma16 = MmaConfig<D, 1, 8, 1, 64, 2, 2>;
template <int D>
using Mma32 = MmaConfig<D, 1, 4, 2, 64, 2, 2>;
// d > 128: 4 row groups of 16 queries x d / 128 channel slices, 32 keys, single buffers.
template <int D>
using MmaSplit = MmaConfig<D, D / 128 * 128 == D ? D / 128 : D / 64, 4, 1, 32, 1, 1>;

// kRows rows of D elements from global (row stride ld) into shared (row stride D + 8); rows at
// or past `limit` are zero-filled: their scores are masked and V must not hold NaN.
template <int kRows, int kThreads, int D, typename T>
__device__ __forceinline__ void load_rows(T* dst, const T* src, int row0, int limit, int ld) {
  constexpr int kChunks = D / 8, kTotal = kRows * kChunks;
#pragma unroll
  for (int it = 0; it < (kTotal + kThreads - 1) / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    if (kTotal % kThreads == 0 || i < kTotal) {
      const int r = i / kChunks, c = (i - r * kChunks) * 8;
      T* s = dst + r * (D + 8) + c;
      if (row0 + r < limit)
        cp_async16(smem_addr(s), src + static_cast<int64_t>(row0 + r) * ld + c);
      else
        *reinterpret_cast<uint4*>(s) = make_uint4(0, 0, 0, 0);
    }
  }
}

// grid (ceil(tq / kBr), heads, n): consecutive blocks share one head's K and V (L2 reuse).
template <typename T, class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    attention_mma_kernel(const AttentionParams p) {
  constexpr int D = C::D, DW = C::DW, MT = C::kMTiles, Bc = C::kBc, ld = C::kLd;
  constexpr int kWords = Bc / 32;  // keep-flag words per tile
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);                                   // [kBr][ld]
  T* ks = qs + C::kBr * ld;                                                 // [kStages][Bc][ld]
  T* vs = ks + C::kStages * Bc * ld;                                        // [kStages][Bc][ld]
  uint32_t* keep = reinterpret_cast<uint32_t*>(vs + C::kStages * Bc * ld);  // [2][kWords]
  float* xbuf = reinterpret_cast<float*>(keep + 2 * kWords);  // [warps][Bc / 2][32] (split)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rg = warp % C::kRowGroups, ds = warp / C::kRowGroups;
  const int tq = p.tq, tk = p.tk, gld = p.ld;
  const int q0 = blockIdx.x * C::kBr;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * D;
  const T* qg = static_cast<const T*>(p.q) + static_cast<int64_t>(blockIdx.z) * tq * gld + head;
  const T* kg = static_cast<const T*>(p.k) + static_cast<int64_t>(blockIdx.z) * tk * gld + head;
  const T* vg = static_cast<const T*>(p.v) + static_cast<int64_t>(blockIdx.z) * tk * gld + head;
  const T* mrow =
      p.mask ? static_cast<const T*>(p.mask) + static_cast<int64_t>(blockIdx.z) * tk : nullptr;
  const float scale = p.scale_log2;
  const int tiles = (tk + Bc - 1) / Bc;

  // Keep flags: warps 0 .. kWords - 1 own one 32-key word of each tile. `mnext` holds this
  // thread's mask value for the tile after the one being flagged.
  T mnext = from_f32<T>(0.f);
  auto flag_tile = [&](int tile, int buf) {
    flag_keys<Bc>(keep, mrow, mnext, tk, tile, buf, tid, warp, lane);
  };

  load_rows<C::kBr, C::kThreads, D>(qs, qg, q0, tq, gld);
  load_rows<Bc, C::kThreads, D>(ks, kg, 0, tk, gld);
  cp_async_commit();
  load_rows<Bc, C::kThreads, D>(vs, vg, 0, tk, gld);
  cp_async_commit();
  if (warp < kWords && mrow && tid < tk) mnext = mrow[tid];
  flag_tile(0, 0);

  // ldmatrix row addresses of this lane (see the PTX fragment layouts of m16n8k16).
  const int g = lane >> 2, tig = lane & 3;
  const int row_base = rg * 16 * MT;
  const uint32_t q_addr = smem_addr(qs + (row_base + (lane & 7) + ((lane >> 3) & 1) * 8) * ld +
                                    ds * DW + (lane >> 4) * 8);
  const uint32_t k_addr =
      smem_addr(ks + ((lane & 7) + (lane >> 4) * 8) * ld + ds * DW + ((lane >> 3) & 1) * 8);
  const uint32_t v_addr =
      smem_addr(vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + ds * DW + (lane >> 4) * 8);
  constexpr uint32_t kTileBytes = static_cast<uint32_t>(C::kTileBytes);

  float o[MT][DW / 8][4];
  float m[MT][2], l[MT][2];  // rows g and g + 8 of each m16 tile; m in raw score units
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int i = 0; i < DW / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  }

  for (int t = 0; t < tiles; ++t) {
    const int buf = C::kStages == 2 ? (t & 1) : 0;
    cp_async_wait_all_but_one();
    __syncthreads();  // K tile t (and Q), keep flags of tile t resident
    if constexpr (C::kStages == 2) {
      // The other buffers held tile t - 1, consumed before the barrier above.
      if (t + 1 < tiles) {
        load_rows<Bc, C::kThreads, D>(ks + (buf ^ 1) * Bc * ld, kg, (t + 1) * Bc, tk, gld);
        flag_tile(t + 1, (t + 1) & 1);
      }
      cp_async_commit();
    }

    // s = Q K^T over this warp's channel slice: 16 * MT queries x Bc keys.
    float s[MT][Bc / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < Bc / 8; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
    const uint32_t kb = k_addr + buf * kTileBytes;
#pragma unroll
    for (int kk = 0; kk < DW / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], q_addr + (mt * 16 * ld + kk * 16) * 2);
#pragma unroll
      for (int np = 0; np < Bc / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, kb + (np * 16 * ld + kk * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(s[mt][2 * np], a[mt], b[0], b[1]);
          mma16816<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
    if constexpr (C::kSplit > 1) {
      float* mine = xbuf + warp * 16 * Bc;
#pragma unroll
      for (int i = 0; i < Bc / 2; ++i) mine[i * 32 + lane] = s[0][i / 4][i % 4];
    }
    if constexpr (C::kStages == 1 || C::kSplit > 1) __syncthreads();  // K tile t consumed
    if constexpr (C::kStages == 1) {
      if (t + 1 < tiles) {
        load_rows<Bc, C::kThreads, D>(ks, kg, (t + 1) * Bc, tk, gld);
        flag_tile(t + 1, (t + 1) & 1);
      }
      cp_async_commit();
    }
    if constexpr (C::kSplit > 1) {
#pragma unroll
      for (int i = 0; i < Bc / 2; ++i) {
        float acc = 0.f;
        for (int j = 0; j < C::kSplit; ++j)
          acc += xbuf[(j * C::kRowGroups + rg) * 16 * Bc + i * 32 + lane];
        s[0][i / 4][i % 4] = acc;
      }
    }

    // Masking; lane holds rows g (c0, c1) and g + 8 (c2, c3), keys nt*8 + 2*tig + {0, 1}.
    uint32_t kw[kWords];
    if (load_keep_words(kw, keep + (t & 1) * kWords) != 0xffffffffu) {  // same in every thread
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt) {
        const uint32_t bits = kw[nt / 4] >> ((nt % 4) * 8 + tig * 2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (!(bits & 1u)) s[mt][nt][0] = s[mt][nt][2] = -INFINITY;
          if (!(bits & 2u)) s[mt][nt][1] = s[mt][nt][3] = -INFINITY;
        }
      }
    }

    // Online softmax.
    uint32_t pa[MT][Bc / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx0 = m[mt][0], mx1 = m[mt][1];
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt) {
        mx0 = fmaxf(mx0, fmaxf(s[mt][nt][0], s[mt][nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[mt][nt][2], s[mt][nt][3]));
      }
      mx0 = quad_max(mx0);
      mx1 = quad_max(mx1);
      const float base0 = softmax_base(mx0, scale), base1 = softmax_base(mx1, scale);
      const float alpha0 = fast_exp2(fmaf(m[mt][0], scale, -base0));
      const float alpha1 = fast_exp2(fmaf(m[mt][1], scale, -base1));
      m[mt][0] = mx0;
      m[mt][1] = mx1;
      float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt) {
        const float p0 = fast_exp2(fmaf(s[mt][nt][0], scale, -base0));
        const float p1 = fast_exp2(fmaf(s[mt][nt][1], scale, -base0));
        const float p2 = fast_exp2(fmaf(s[mt][nt][2], scale, -base1));
        const float p3 = fast_exp2(fmaf(s[mt][nt][3], scale, -base1));
        rs0 += p0 + p1;
        rs1 += p2 + p3;
        pa[mt][nt / 2][(nt % 2) * 2 + 0] = pack2<T>(p0, p1);
        pa[mt][nt / 2][(nt % 2) * 2 + 1] = pack2<T>(p2, p3);
      }
      l[mt][0] = l[mt][0] * alpha0 + rs0;  // per-lane partial sums; the quad is summed at the end
      l[mt][1] = l[mt][1] * alpha1 + rs1;
#pragma unroll
      for (int i = 0; i < DW / 8; ++i) {
        o[mt][i][0] *= alpha0;
        o[mt][i][1] *= alpha0;
        o[mt][i][2] *= alpha1;
        o[mt][i][3] *= alpha1;
      }
    }

    cp_async_wait_all_but_one();
    __syncthreads();  // V tile t resident (K tile t + 1 may still be arriving)
    if constexpr (C::kStages == 2) {
      if (t + 1 < tiles)
        load_rows<Bc, C::kThreads, D>(vs + (buf ^ 1) * Bc * ld, vg, (t + 1) * Bc, tk, gld);
      cp_async_commit();
    }
    const uint32_t vb = v_addr + buf * kTileBytes;
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < DW / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vb + (kk * 16 * ld + np * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(o[mt][2 * np], pa[mt][kk], b[0], b[1]);
          mma16816<T>(o[mt][2 * np + 1], pa[mt][kk], b[2], b[3]);
        }
      }
    }
    if constexpr (C::kStages == 1) {
      __syncthreads();  // V tile t no longer read
      if (t + 1 < tiles) load_rows<Bc, C::kThreads, D>(vs, vg, (t + 1) * Bc, tk, gld);
      cp_async_commit();
    }
  }

  T* og = static_cast<T*>(p.out) + static_cast<int64_t>(blockIdx.z) * tq * gld + head;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const float l0 = quad_sum(l[mt][0]), l1 = quad_sum(l[mt][1]);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    const int r0 = q0 + row_base + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
    for (int i = 0; i < DW / 8; ++i) {
      const int c = ds * DW + i * 8 + tig * 2;
      if (r0 < tq)
        *reinterpret_cast<uint32_t*>(og + static_cast<int64_t>(r0) * gld + c) =
            pack2<T>(o[mt][i][0] * inv0, o[mt][i][1] * inv0);
      if (r1 < tq)
        *reinterpret_cast<uint32_t*>(og + static_cast<int64_t>(r1) * gld + c) =
            pack2<T>(o[mt][i][2] * inv1, o[mt][i][3] * inv1);
    }
  }
}

// ---- CUDA-core kernel ---------------------------------------------------------------------

constexpr int kSimpleWarps = 4;
constexpr int kSimpleRows = 4;  // queries per warp
constexpr int kSimpleQueries = kSimpleWarps * kSimpleRows;
constexpr int kSimpleKeys = 32;
constexpr int kSimpleMaxD = 512;

size_t simple_smem_bytes(int d) {
  const int dp = (d + 3) / 4 * 4;
  return (static_cast<size_t>(kSimpleQueries) * dp + static_cast<size_t>(kSimpleKeys) * (dp + 4) +
          kSimpleQueries * kSimpleKeys) *
         sizeof(float);
}

// grid (ceil(tq / 16), heads, n); block 128 threads. kMaxD: 256 or 512 (o in registers).
template <typename T, int kMaxD>
__global__ void __launch_bounds__(32 * kSimpleWarps)
    attention_simple_kernel(const AttentionParams p, int d) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int dp = (d + 3) / 4 * 4;        // rows padded to whole float4s (zeros past d)
  const int kv_ld = dp + 4;              // K/V rows one float4 longer: lanes hit different banks
  float* qs = smem;                      // [16][dp], pre-scaled
  float* kv = qs + kSimpleQueries * dp;  // [32][kv_ld], K then V of one tile
  float* ps = kv + kSimpleKeys * kv_ld;  // [16][32] probabilities

  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const int tq = p.tq, tk = p.tk, ld = p.ld;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q0 = blockIdx.x * kSimpleQueries;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * d;
  const int64_t qbase = static_cast<int64_t>(blockIdx.z) * tq * ld + head;
  const int64_t kbase = static_cast<int64_t>(blockIdx.z) * tk * ld + head;
  const T* mrow =
      p.mask ? static_cast<const T*>(p.mask) + static_cast<int64_t>(blockIdx.z) * tk : nullptr;

  for (int i = threadIdx.x; i < kSimpleQueries * dp; i += blockDim.x) {
    const int r = i / dp, c = i - r * dp;
    qs[i] = (q0 + r < tq && c < d)
                ? to_f32(q[qbase + static_cast<int64_t>(q0 + r) * ld + c]) * p.scale_log2
                : 0.f;
  }

  float o[kSimpleRows][kMaxD / 32];
  float m[kSimpleRows], l[kSimpleRows];
#pragma unroll
  for (int r = 0; r < kSimpleRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxD / 32; ++i) o[r][i] = 0.f;
  }

  auto load_tile = [&](const T* src, int row0) {
    for (int i = threadIdx.x; i < kSimpleKeys * dp; i += blockDim.x) {
      const int r = i / dp, c = i - r * dp;
      kv[r * kv_ld + c] = (row0 + r < tk && c < d)
                              ? to_f32(src[kbase + static_cast<int64_t>(row0 + r) * ld + c])
                              : 0.f;
    }
  };

  for (int k0 = 0; k0 < tk; k0 += kSimpleKeys) {
    __syncthreads();  // the previous V tile is consumed (and Q is loaded)
    load_tile(k, k0);
    __syncthreads();

    float s[kSimpleRows];
#pragma unroll
    for (int r = 0; r < kSimpleRows; ++r) s[r] = 0.f;
    const float4* krow = reinterpret_cast<const float4*>(kv + lane * kv_ld);
    for (int c4 = 0; c4 < dp / 4; ++c4) {
      const float4 kk = krow[c4];
#pragma unroll
      for (int r = 0; r < kSimpleRows; ++r) {
        const float4 qq = reinterpret_cast<const float4*>(qs + (warp * kSimpleRows + r) * dp)[c4];
        s[r] = fmaf(qq.x, kk.x, fmaf(qq.y, kk.y, fmaf(qq.z, kk.z, fmaf(qq.w, kk.w, s[r]))));
      }
    }
    const int key = k0 + lane;
    const bool valid = key < tk && (!mrow || to_f32(mrow[key]) != 0.f);
#pragma unroll
    for (int r = 0; r < kSimpleRows; ++r) {
      const float sr = valid ? s[r] : -INFINITY;
      const float mn = fmaxf(m[r], warp_max(sr));
      const float base = mn == -INFINITY ? 0.f : mn;  // no key seen yet: p = alpha = 0
      const float alpha = exp2f(m[r] - base);
      const float pr = exp2f(sr - base);
      l[r] = l[r] * alpha + warp_sum(pr);
      m[r] = mn;
#pragma unroll
      for (int i = 0; i < kMaxD / 32; ++i) o[r][i] *= alpha;
      ps[(warp * kSimpleRows + r) * kSimpleKeys + lane] = pr;
    }
    __syncthreads();  // K consumed, probabilities written
    load_tile(v, k0);
    __syncthreads();

    for (int j = 0; j < kSimpleKeys; ++j) {
      float pj[kSimpleRows];
#pragma unroll
      for (int r = 0; r < kSimpleRows; ++r) pj[r] = ps[(warp * kSimpleRows + r) * kSimpleKeys + j];
      const float* vrow = kv + j * kv_ld;
#pragma unroll
      for (int i = 0; i < kMaxD / 32; ++i) {
        const int c = lane + 32 * i;
        if (c < d) {
          const float vv = vrow[c];
#pragma unroll
          for (int r = 0; r < kSimpleRows; ++r) o[r][i] = fmaf(pj[r], vv, o[r][i]);
        }
      }
    }
  }

  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int r = 0; r < kSimpleRows; ++r) {
    const int row = q0 + warp * kSimpleRows + r;
    if (row >= tq) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    T* orow = out + qbase + static_cast<int64_t>(row) * ld;
#pragma unroll
    for (int i = 0; i < kMaxD / 32; ++i) {
      const int c = lane + 32 * i;
      if (c < d) orow[c] = from_f32<T>(o[r][i] * inv);
    }
  }
}

// ---- launchers ---------------------------------------------------------------------------

template <typename T, class C>
Status run_mma(const AttentionParams& p, const AttentionArgs& a, const char* op, const Launch& l) {
  auto kernel = attention_mma_kernel<T, C>;
  if (C::kSmem > l.smem_optin)
    return Status::errorf(op, ": head size ", a.d, " needs ", C::kSmem,
                          " bytes of shared memory, the device allows ", l.smem_optin);
  if (C::kSmem > 48 * 1024)
    LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(C::kSmem)));
  const dim3 grid((a.tq + C::kBr - 1) / C::kBr, a.heads, static_cast<unsigned>(a.n));
  kernel<<<grid, C::kThreads, C::kSmem, l.stream>>>(p);
  LATENT_CUDA_CHECK_LAUNCH("attention_mma_kernel");
  return ok_status();
}

template <typename T>
Status run_mma_for(const AttentionParams& p, const AttentionArgs& a, AttentionKernel kernel,
                   const char* op, const Launch& l) {
  const bool m16 = kernel == AttentionKernel::kMma16;
  switch (a.d) {
    case 64:
      return m16 ? run_mma<T, Mma16<64>>(p, a, op, l) : run_mma<T, Mma32<64>>(p, a, op, l);
    case 128:
      return m16 ? run_mma<T, Mma16<128>>(p, a, op, l) : run_mma<T, Mma32<128>>(p, a, op, l);
    case 192:
      return run_mma<T, MmaSplit<192>>(p, a, op, l);
    case 256:
      return run_mma<T, MmaSplit<256>>(p, a, op, l);
    case 384:
      return run_mma<T, MmaSplit<384>>(p, a, op, l);
    case 512:
      return run_mma<T, MmaSplit<512>>(p, a, op, l);
  }
  return Status::errorf(op, ": no tensor-core kernel for head size ", a.d);
}

template <typename T>
Status run_simple(const AttentionParams& p, const AttentionArgs& a, const char* op,
                  const Launch& l) {
  const size_t smem = simple_smem_bytes(a.d);
  if (smem > l.smem_optin)
    return Status::errorf(op, ": head size ", a.d, " needs ", smem,
                          " bytes of shared memory, the device allows ", l.smem_optin);
  auto kernel = a.d <= 256 ? attention_simple_kernel<T, 256> : attention_simple_kernel<T, 512>;
  if (smem > 48 * 1024)
    LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  const dim3 grid((a.tq + kSimpleQueries - 1) / kSimpleQueries, a.heads,
                  static_cast<unsigned>(a.n));
  kernel<<<grid, 32 * kSimpleWarps, smem, l.stream>>>(p, a.d);
  LATENT_CUDA_CHECK_LAUNCH("attention_simple_kernel");
  return ok_status();
}

bool mma_head_size(int64_t d) {
  return d == 64 || d == 128 || d == 192 || d == 256 || d == 384 || d == 512;
}

}  // namespace

AttentionKernel attention_kernel_from_env() {
  static constexpr AttentionKernel kinds[] = {AttentionKernel::kDefault, AttentionKernel::kMma32,
                                              AttentionKernel::kMma16,   AttentionKernel::kMma32,
                                              AttentionKernel::kWgmma,   AttentionKernel::kSimple,
                                              AttentionKernel::kGemm};
  return kinds[env_choice(
      "LATENT_ATTENTION_KERNEL",
      {{"auto"}, {"mma"}, {"mma16"}, {"mma32"}, {"wgmma"}, {"simple"}, {"gemm"}}, 0)];
}

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kDefault:
      return "default";
    case AttentionKernel::kMma16:
      return "mma16";
    case AttentionKernel::kMma32:
      return "mma32";
    case AttentionKernel::kWgmma:
      return "wgmma";
    case AttentionKernel::kSimple:
      return "simple";
    case AttentionKernel::kGemm:
      return "gemm";
  }
  return "?";
}

Status launch_flash_attention(const AttentionArgs& a, DType dtype, bool tensor_cores,
                              AttentionKernel kernel, const char* op, const Launch& l) {
  if (a.n <= 0 || a.tq <= 0 || a.tk <= 0) return ok_status();
  const int64_t channels = static_cast<int64_t>(a.heads) * a.d;
  if (a.n > 65535 || a.heads < 1 || a.heads > 65535 || a.d < 1 || channels > (1 << 20))
    return Status::errorf(op, ": batch ", a.n, ", ", a.tq, " queries, ", a.tk, " keys, ", a.heads,
                          " heads of ", a.d, " is too large");
  const AttentionParams p = attention_params(a);  // ld = channels

  const bool mma_ok = tensor_cores && kernel != AttentionKernel::kSimple && dtype != DType::kF32 &&
                      mma_head_size(a.d) && channels % 8 == 0 && aligned16(a.q) && aligned16(a.k) &&
                      aligned16(a.v) && aligned16(a.out);
  if (mma_ok) {
#ifdef LATENT_ATTENTION_WGMMA
    // Default on Hopper: the wgmma kernel (H100: ~390 TFLOP/s at DiT shapes vs ~310 for mma32,
    // bench/NOTES.md), where it fits; mma.sync everywhere else.
    if ((kernel == AttentionKernel::kWgmma || kernel == AttentionKernel::kDefault) &&
        attention_wgmma_fits(a, dtype, l))
      return launch_attention_wgmma(a, dtype, l);
#endif
    // kWgmma where the Hopper kernel cannot run: the default mma.sync configuration.
    if (dtype == DType::kBF16) return run_mma_for<bf16>(p, a, kernel, op, l);
    return run_mma_for<f16>(p, a, kernel, op, l);
  }
  if (a.d > kSimpleMaxD)
    return Status::errorf(op, ": head size ", a.d, " is over the ", kSimpleMaxD,
                          " the CUDA kernels support");
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] { return run_simple<T>(p, a, op, l); });
}

}  // namespace latent::cuda
