// Hopper flash attention for d = 128 in bf16/fp16 (see attention_flash.cuh): wgmma.mma_async
// (sm_90a) with both products on the warpgroup tensor-core path. Built only for sm_90a (its own
// object library, engine/CMakeLists.txt) and launched only on compute capability 9.0, and only
// when LATENT_ATTENTION_KERNEL=wgmma asks for it: not yet timed or checked on a GPU.
//
// A block: two consumer warpgroups of 64 queries each (128 queries, 256 threads), 128-key tiles.
// All threads load with cp.async into 128B-swizzled shared tiles (Q once; K and V double-
// buffered, tile t + 1 requested when tile t's wait ends, as in the mma kernel), then
//   S = Q K^T   wgmma m64n128k16, A (Q) and B (K) from shared-memory descriptors, both K-major;
//   softmax     in registers (fp32, exp2 with the scale folded in, keep bits as
//   attention_flash.cu); O += P V    wgmma m64n128k16, A = P straight from registers (the
//   accumulator layout of two
//               n8 blocks is the A fragment of one k16 step), B = V through the transpose bit
//               (V rows are keys: MN-major).
// Shared tile layout (rows R, 128 columns of 2 bytes): two column blocks of 64 (128 bytes a row),
// block-major; 16-byte chunk j of row r of a block at r * 128 + ((j ^ (r % 8)) * 16): the
// Swizzle<3,4,3> of the canonical 128B-swizzle layouts, tile bases 1024-byte aligned.
// Descriptors: K-major (Q, K): SBO 1024 (8 rows), k16 steps advance the start by 32 bytes within
// a block, then move to the next block; MN-major (V): LBO = the column block stride (R * 128),
// SBO 1024 (8 keys), k16 steps advance by 16 rows (2048 bytes).
#include <cmath>

#include "engine/backends/cuda/attention_common.cuh"
#include "engine/backends/cuda/attention_wgmma.cuh"
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/mma.cuh"

namespace latent::cuda {
namespace {

constexpr int kD = 128;
constexpr int kBr = 128;  // 2 warpgroups x 64 queries
constexpr int kBc = 128;  // keys a tile
constexpr int kThreads = 256;
constexpr int kWords = kBc / 32;
constexpr uint32_t kTileBytes = kBc * kD * 2;  // 32 KB; Q is the same size (kBr = kBc)
constexpr size_t kSmem = 1024 /* alignment slack */ + 5 * static_cast<size_t>(kTileBytes) +
                         2 * kWords * sizeof(uint32_t);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The accumulator operands of an m64n128 wgmma: 64 fp32 registers a thread, %0 .. %63.
#define LATENT_WGMMA_ACC_REGS                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define LATENT_WGMMA_ACC_OUTPUTS(c)                                                               \
  "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]), "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7]), \
      "+f"(c[8]), "+f"(c[9]), "+f"(c[10]), "+f"(c[11]), "+f"(c[12]), "+f"(c[13]), "+f"(c[14]),    \
      "+f"(c[15]), "+f"(c[16]), "+f"(c[17]), "+f"(c[18]), "+f"(c[19]), "+f"(c[20]), "+f"(c[21]),  \
      "+f"(c[22]), "+f"(c[23]), "+f"(c[24]), "+f"(c[25]), "+f"(c[26]), "+f"(c[27]), "+f"(c[28]),  \
      "+f"(c[29]), "+f"(c[30]), "+f"(c[31]), "+f"(c[32]), "+f"(c[33]), "+f"(c[34]), "+f"(c[35]),  \
      "+f"(c[36]), "+f"(c[37]), "+f"(c[38]), "+f"(c[39]), "+f"(c[40]), "+f"(c[41]), "+f"(c[42]),  \
      "+f"(c[43]), "+f"(c[44]), "+f"(c[45]), "+f"(c[46]), "+f"(c[47]), "+f"(c[48]), "+f"(c[49]),  \
      "+f"(c[50]), "+f"(c[51]), "+f"(c[52]), "+f"(c[53]), "+f"(c[54]), "+f"(c[55]), "+f"(c[56]),  \
      "+f"(c[57]), "+f"(c[58]), "+f"(c[59]), "+f"(c[60]), "+f"(c[61]), "+f"(c[62]), "+f"(c[63])
// c (+)= A B, m64n128k16, fp32 accumulators; `ty` is the input type's PTX name. SS: A and B from
// shared-memory descriptors (both K-major); RS: A from registers, B transposed (MN-major).
// scale_d = 0 overwrites c.
#define LATENT_WGMMA_SS(ty)                                                              \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                       \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." ty "." ty " " LATENT_WGMMA_ACC_REGS \
      ", %64, %65, p, 1, 1, 0, 0;\n"                                                     \
      "}\n"                                                                              \
      : LATENT_WGMMA_ACC_OUTPUTS(c)                                                      \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define LATENT_WGMMA_RS(ty)                                                              \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                       \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." ty "." ty " " LATENT_WGMMA_ACC_REGS \
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"                                       \
      "}\n"                                                                              \
      : LATENT_WGMMA_ACC_OUTPUTS(c)                                                      \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

template <typename T>
__device__ __forceinline__ void wgmma_ss(float (&c)[64], uint64_t desc_a, uint64_t desc_b,
                                         int scale_d);
template <>
__device__ __forceinline__ void wgmma_ss<bf16>(float (&c)[64], uint64_t desc_a, uint64_t desc_b,
                                               int scale_d) {
  LATENT_WGMMA_SS("bf16");
}
template <>
__device__ __forceinline__ void wgmma_ss<f16>(float (&c)[64], uint64_t desc_a, uint64_t desc_b,
                                              int scale_d) {
  LATENT_WGMMA_SS("f16");
}
template <typename T>
__device__ __forceinline__ void wgmma_rs(float (&c)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                         int scale_d);
template <>
__device__ __forceinline__ void wgmma_rs<bf16>(float (&c)[64], const uint32_t (&a)[4],
                                               uint64_t desc_b, int scale_d) {
  LATENT_WGMMA_RS("bf16");
}
template <>
__device__ __forceinline__ void wgmma_rs<f16>(float (&c)[64], const uint32_t (&a)[4],
                                              uint64_t desc_b, int scale_d) {
  LATENT_WGMMA_RS("f16");
}
#undef LATENT_WGMMA_SS
#undef LATENT_WGMMA_RS
#undef LATENT_WGMMA_ACC_OUTPUTS
#undef LATENT_WGMMA_ACC_REGS

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs.
__device__ __forceinline__ void fence_regs(float (&c)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(c[i])::"memory");
}
// cp.async and plain stores write through the generic proxy; wgmma reads through the async one.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);  // 128B swizzle
}

// kRows x 128 elements from global (row stride ld) into a swizzled tile; rows at or past `limit`
// are zero-filled (masked scores; V must not hold NaN).
template <int kRows, typename T>
__device__ __forceinline__ void load_tile(uint32_t dst, const T* src, int row0, int limit, int ld) {
  constexpr int kChunks = kRows * 16;
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = i >> 4, j = i & 15;
    const uint32_t s = dst + (j >> 3) * (kRows * 128) + r * 128 + (((j & 7) ^ (r & 7)) << 4);
    if (row0 + r < limit)
      cp_async16(s, src + static_cast<int64_t>(row0 + r) * ld + j * 8);
    else
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(s), "r"(0));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) attention_wgmma_kernel(const AttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t qs = base;                 // [2 blocks][128][128 B]
  const uint32_t ks = qs + kTileBytes;      // [2 stages]
  const uint32_t vs = ks + 2 * kTileBytes;  // [2 stages]
  uint32_t* keep =                          // [2][kWords], after the tiles
      reinterpret_cast<uint32_t*>(smem_raw + (vs + 2 * kTileBytes - smem_addr(smem_raw)));

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, wl = warp & 3;  // warpgroup, warp within it
  const int tq = p.tq, tk = p.tk, gld = p.ld;
  const int q0 = blockIdx.x * kBr;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * kD;
  const T* qg = static_cast<const T*>(p.q) + static_cast<int64_t>(blockIdx.z) * tq * gld + head;
  const T* kg = static_cast<const T*>(p.k) + static_cast<int64_t>(blockIdx.z) * tk * gld + head;
  const T* vg = static_cast<const T*>(p.v) + static_cast<int64_t>(blockIdx.z) * tk * gld + head;
  const T* mrow =
      p.mask ? static_cast<const T*>(p.mask) + static_cast<int64_t>(blockIdx.z) * tk : nullptr;
  const float scale = p.scale_log2;
  const int tiles = (tk + kBc - 1) / kBc;

  T mnext = from_f32<T>(0.f);
  auto flag_tile = [&](int tile, int buf) {
    flag_keys<kBc>(keep, mrow, mnext, tk, tile, buf, tid, warp, lane);
  };

  load_tile<kBr>(qs, qg, q0, tq, gld);
  load_tile<kBc>(ks, kg, 0, tk, gld);
  cp_async_commit();
  load_tile<kBc>(vs, vg, 0, tk, gld);
  cp_async_commit();
  if (warp < kWords && mrow && tid < tk) mnext = mrow[tid];
  flag_tile(0, 0);

  const int g = lane >> 2, tig = lane & 3;
  float o[64];
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows 16 wl + g and + 8
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;

  for (int t = 0; t < tiles; ++t) {
    const int buf = t & 1;
    cp_async_wait_all_but_one();
    fence_proxy_async();
    __syncthreads();  // K tile t (and Q), keep flags of tile t resident
    if (t + 1 < tiles) {
      load_tile<kBc>(ks + (buf ^ 1) * kTileBytes, kg, (t + 1) * kBc, tk, gld);
      flag_tile(t + 1, (t + 1) & 1);
    }
    cp_async_commit();

    // S = Q K^T: this warpgroup's 64 queries x 128 keys.
    float s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.f;
    const uint32_t kb = ks + buf * kTileBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t col = (kk >> 2) * (128 * 128) + (kk & 3) * 32;
      wgmma_ss<T>(s, smem_desc(qs + col + wg * 64 * 128, 16, 1024), smem_desc(kb + col, 16, 1024),
                  1);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(s);

    // Masking: s[4 i + c] holds row 16 wl + g (c = 0, 1) or + 8 (c = 2, 3), key 8 i + 2 tig + c
    // % 2.
    uint32_t kw[kWords];
    if (load_keep_words(kw, keep + buf * kWords) != 0xffffffffu) {
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt) {
        const uint32_t bits = kw[nt / 4] >> ((nt % 4) * 8 + tig * 2);
        if (!(bits & 1u)) s[4 * nt + 0] = s[4 * nt + 2] = -INFINITY;
        if (!(bits & 2u)) s[4 * nt + 1] = s[4 * nt + 3] = -INFINITY;
      }
    }

    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
      mx0 = fmaxf(mx0, fmaxf(s[4 * nt + 0], s[4 * nt + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[4 * nt + 2], s[4 * nt + 3]));
    }
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    const float base0 = softmax_base(mx0, scale), base1 = softmax_base(mx1, scale);
    const float alpha0 = fast_exp2(fmaf(m0, scale, -base0));
    const float alpha1 = fast_exp2(fmaf(m1, scale, -base1));
    m0 = mx0;
    m1 = mx1;
    uint32_t pa[kBc / 16][4];
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
      const float p0 = fast_exp2(fmaf(s[4 * nt + 0], scale, -base0));
      const float p1 = fast_exp2(fmaf(s[4 * nt + 1], scale, -base0));
      const float p2 = fast_exp2(fmaf(s[4 * nt + 2], scale, -base1));
      const float p3 = fast_exp2(fmaf(s[4 * nt + 3], scale, -base1));
      rs0 += p0 + p1;
      rs1 += p2 + p3;
      pa[nt / 2][(nt % 2) * 2 + 0] = pack2<T>(p0, p1);
      pa[nt / 2][(nt % 2) * 2 + 1] = pack2<T>(p2, p3);
    }
    l0 = l0 * alpha0 + rs0;
    l1 = l1 * alpha1 + rs1;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      o[4 * i + 0] *= alpha0;
      o[4 * i + 1] *= alpha0;
      o[4 * i + 2] *= alpha1;
      o[4 * i + 3] *= alpha1;
    }

    cp_async_wait_all_but_one();
    fence_proxy_async();
    __syncthreads();  // V tile t resident (K tile t + 1 may still be arriving)
    if (t + 1 < tiles) load_tile<kBc>(vs + (buf ^ 1) * kTileBytes, vg, (t + 1) * kBc, tk, gld);
    cp_async_commit();

    // O += P V: A = P (registers), B = V tile (keys x 128 channels, MN-major, transposed).
    const uint32_t vb = vs + buf * kTileBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
      wgmma_rs<T>(o, pa[kk], smem_desc(vb + kk * 16 * 128, kBc * 128, 1024), 1);
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(o);
    // P must stay in its registers until the MMAs that read it are done.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
      asm volatile(""
                   : "+r"(pa[kk][0]), "+r"(pa[kk][1]), "+r"(pa[kk][2]), "+r"(pa[kk][3])::"memory");
  }

  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const int r0 = q0 + wg * 64 + wl * 16 + g, r1 = r0 + 8;
  T* og = static_cast<T*>(p.out) + static_cast<int64_t>(blockIdx.z) * tq * gld + head;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int c = i * 8 + tig * 2;
    if (r0 < tq)
      *reinterpret_cast<uint32_t*>(og + static_cast<int64_t>(r0) * gld + c) =
          pack2<T>(o[4 * i + 0] * inv0, o[4 * i + 1] * inv0);
    if (r1 < tq)
      *reinterpret_cast<uint32_t*>(og + static_cast<int64_t>(r1) * gld + c) =
          pack2<T>(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
  }
}

#else  // not sm_90a: never launched (the dispatch checks the device), kept so the host links.

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) attention_wgmma_kernel(const AttentionParams) {
  __trap();
}

#endif

template <typename T>
Status run(const AttentionParams& p, const AttentionArgs& a, const Launch& l) {
  auto kernel = attention_wgmma_kernel<T>;
  LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem)));
  const dim3 grid((a.tq + kBr - 1) / kBr, a.heads, static_cast<unsigned>(a.n));
  kernel<<<grid, kThreads, kSmem, l.stream>>>(p);
  LATENT_CUDA_CHECK_LAUNCH("attention_wgmma_kernel");
  return ok_status();
}

}  // namespace

bool attention_wgmma_fits(const AttentionArgs& a, DType dtype, const Launch& l) {
  if (dtype == DType::kF32 || a.d != kD || kSmem > l.smem_optin) return false;
  return current_device_runs_sm90a();
}

Status launch_attention_wgmma(const AttentionArgs& a, DType dtype, const Launch& l) {
  const AttentionParams p = attention_params(a);
  if (dtype == DType::kBF16) return run<bf16>(p, a, l);
  return run<f16>(p, a, l);
}

}  // namespace latent::cuda
