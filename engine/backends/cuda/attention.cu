// Two flash-attention kernels with an fp32 online softmax (exp2 of scores pre-scaled by
// log2(e) / sqrt(d)):
//
// attention_mma_kernel (bf16/fp16, tensor cores): a block takes 64 queries and walks the keys
// 32 at a time. Warps form a 4 x dsplit grid: 4 row groups of 16 queries (one m16 tile each)
// times dsplit slices of DW channels. Head sizes up to 512 do not fit one warp's registers
// (a 16 x 512 fp32 accumulator is 256 registers a thread), so each warp computes the partial
// Q K^T over its channel slice, the slices are summed through shared memory, and every warp
// of a row group then runs the same softmax and accumulates O for its own slice only.
// K and V tiles arrive by cp.async, each load overlapping the other half of the step.
//
// attention_simple_kernel (any dtype, d <= 512): CUDA cores, 4 warps x 4 queries a block;
// lane j scores key j of a 32-key tile, then each lane accumulates channels lane + 32 i.
#include <cmath>

#include "engine/backends/cuda/attention.cuh"
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/mma.cuh"

namespace latent::cuda {
namespace {

// ---- tensor-core kernel ------------------------------------------------------------------

constexpr int kRowGroups = 4;
constexpr int kBr = 16 * kRowGroups;  // queries per block
constexpr int kBc = 32;               // keys per tile
constexpr int kPad = 8;       // elements added to each shared row (16 bytes): no bank conflicts
constexpr int kMaxSplit = 4;  // at most 4 x 4 warps

size_t mma_smem_bytes(int d, int warps) {
  return static_cast<size_t>(kBr + 2 * kBc) * (d + kPad) * 2 +
         static_cast<size_t>(warps) * 16 * 32 * sizeof(float);
}

// grid (ceil(tokens / 64), heads, n); block 32 * 4 * (d / DW) threads.
template <typename T, int DW>
__global__ void __launch_bounds__(32 * kRowGroups * kMaxSplit, 1)
    attention_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         T* __restrict__ out, int tokens, int channels, int d, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ld = d + kPad;
  T* qs = reinterpret_cast<T*>(smem_raw);                 // [kBr][ld]
  T* ks = qs + kBr * ld;                                  // [kBc][ld]
  T* vs = ks + kBc * ld;                                  // [kBc][ld]
  float* xbuf = reinterpret_cast<float*>(vs + kBc * ld);  // [warps][16][32] partial scores

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int dsplit = d / DW;
  const int rg = warp % kRowGroups, ds = warp / kRowGroups;
  const int q0 = blockIdx.x * kBr;
  const int64_t head_base =
      static_cast<int64_t>(blockIdx.z) * tokens * channels + static_cast<int64_t>(blockIdx.y) * d;
  const T* qg = q + head_base;
  const T* kg = k + head_base;
  const T* vg = v + head_base;
  const int chunks = d / 8;  // 16-byte pieces of a row

  // Rows past the last token are zero-filled: their scores are masked and V must not hold NaN.
  auto load_tile = [&](T* dst, const T* src, int row0, int rows) {
    for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
      const int r = i / chunks, c = (i - r * chunks) * 8;
      T* s = dst + r * ld + c;
      if (row0 + r < tokens)
        cp_async16(smem_addr(s), src + static_cast<int64_t>(row0 + r) * channels + c);
      else
        *reinterpret_cast<uint4*>(s) = make_uint4(0, 0, 0, 0);
    }
  };

  load_tile(qs, qg, q0, kBr);
  load_tile(ks, kg, 0, kBc);
  cp_async_commit();
  load_tile(vs, vg, 0, kBc);
  cp_async_commit();

  // ldmatrix row addresses of this lane (see the PTX fragment layouts of m16n8k16).
  const int g = lane >> 2, tig = lane & 3;
  const uint32_t q_addr = smem_addr(qs + (rg * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld +
                                    ds * DW + (lane >> 4) * 8);
  const uint32_t k_addr =
      smem_addr(ks + ((lane & 7) + (lane >> 4) * 8) * ld + ds * DW + ((lane >> 3) & 1) * 8);
  const uint32_t v_addr =
      smem_addr(vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + ds * DW + (lane >> 4) * 8);

  float o[DW / 8][4];
#pragma unroll
  for (int i = 0; i < DW / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g and g + 8

  const int tiles = (tokens + kBc - 1) / kBc;
  for (int t = 0; t < tiles; ++t) {
    const int k0 = t * kBc;
    cp_async_wait_all_but_one();
    __syncthreads();  // K tile t (and Q) resident

    // s = Q K^T over this warp's channel slice: 16 queries x 32 keys.
    float s[kBc / 8][4];
#pragma unroll
    for (int i = 0; i < kBc / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DW / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, q_addr + kk * 16 * sizeof(T));
#pragma unroll
      for (int np = 0; np < kBc / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, k_addr + (np * 16 * ld + kk * 16) * sizeof(T));
        mma16816<T>(s[2 * np], a, b[0], b[1]);
        mma16816<T>(s[2 * np + 1], a, b[2], b[3]);
      }
    }
    if (dsplit > 1) {
      float* mine = xbuf + warp * 16 * 32;
#pragma unroll
      for (int i = 0; i < 16; ++i) mine[i * 32 + lane] = s[i / 4][i % 4];
    }
    __syncthreads();  // partial scores visible; K tile t no longer read
    if (t + 1 < tiles) load_tile(ks, kg, k0 + kBc, kBc);
    cp_async_commit();
    if (dsplit > 1) {
      // Same order in every warp of the row group, so all of them see identical scores.
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float acc = 0.f;
        for (int j = 0; j < dsplit; ++j)
          acc += xbuf[(j * kRowGroups + rg) * 16 * 32 + i * 32 + lane];
        s[i / 4][i % 4] = acc;
      }
    }

    // Online softmax; lane holds rows g (c0, c1) and g + 8 (c2, c3), keys nt*8 + 2*tig + {0,1}.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
      const int key = k0 + nt * 8 + tig * 2;
      const bool ok0 = key < tokens, ok1 = key + 1 < tokens;
      s[nt][0] = ok0 ? s[nt][0] * scale_log2 : -INFINITY;
      s[nt][1] = ok1 ? s[nt][1] * scale_log2 : -INFINITY;
      s[nt][2] = ok0 ? s[nt][2] * scale_log2 : -INFINITY;
      s[nt][3] = ok1 ? s[nt][3] * scale_log2 : -INFINITY;
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // Every tile holds at least one real key, so the new maxima are finite.
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float alpha0 = exp2f(m0 - mn0), alpha1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    uint32_t pa[kBc / 16][4];
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
      const float p0 = exp2f(s[nt][0] - mn0), p1 = exp2f(s[nt][1] - mn0);
      const float p2 = exp2f(s[nt][2] - mn1), p3 = exp2f(s[nt][3] - mn1);
      rs0 += p0 + p1;
      rs1 += p2 + p3;
      // The accumulator layout of two adjacent n-tiles is the A layout of one k16 step.
      pa[nt / 2][(nt % 2) * 2 + 0] = pack2<T>(p0, p1);
      pa[nt / 2][(nt % 2) * 2 + 1] = pack2<T>(p2, p3);
    }
    l0 = l0 * alpha0 + rs0;  // per-lane partial sums; the quad is summed at the end
    l1 = l1 * alpha1 + rs1;
#pragma unroll
    for (int i = 0; i < DW / 8; ++i) {
      o[i][0] *= alpha0;
      o[i][1] *= alpha0;
      o[i][2] *= alpha1;
      o[i][3] *= alpha1;
    }

    cp_async_wait_all_but_one();
    __syncthreads();  // V tile t resident (K tile t + 1 may still be arriving)
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < DW / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_addr + (kk * 16 * ld + np * 16) * sizeof(T));
        mma16816<T>(o[2 * np], pa[kk], b[0], b[1]);
        mma16816<T>(o[2 * np + 1], pa[kk], b[2], b[3]);
      }
    }
    __syncthreads();  // V tile t no longer read
    if (t + 1 < tiles) load_tile(vs, vg, k0 + kBc, kBc);
    cp_async_commit();
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
  const int r0 = q0 + rg * 16 + g, r1 = r0 + 8;
  T* og = out + head_base;
#pragma unroll
  for (int i = 0; i < DW / 8; ++i) {
    const int c = ds * DW + i * 8 + tig * 2;
    if (r0 < tokens)
      *reinterpret_cast<uint32_t*>(og + static_cast<int64_t>(r0) * channels + c) =
          pack2<T>(o[i][0] * inv0, o[i][1] * inv0);
    if (r1 < tokens)
      *reinterpret_cast<uint32_t*>(og + static_cast<int64_t>(r1) * channels + c) =
          pack2<T>(o[i][2] * inv1, o[i][3] * inv1);
  }
}

// ---- fp32 kernel -------------------------------------------------------------------------

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

// grid (ceil(tokens / 16), heads, n); block 128 threads.
template <typename T>
__global__ void __launch_bounds__(32 * kSimpleWarps)
    attention_simple_kernel(const T* __restrict__ q, const T* __restrict__ k,
                            const T* __restrict__ v, T* __restrict__ out, int tokens, int channels,
                            int d, float scale_log2) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int dp = (d + 3) / 4 * 4;        // rows padded to whole float4s (zeros past d)
  const int kv_ld = dp + 4;              // K/V rows one float4 longer: lanes hit different banks
  float* qs = smem;                      // [16][dp], pre-scaled
  float* kv = qs + kSimpleQueries * dp;  // [32][kv_ld], K then V of one tile
  float* ps = kv + kSimpleKeys * kv_ld;  // [16][32] probabilities

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q0 = blockIdx.x * kSimpleQueries;
  const int64_t head_base =
      static_cast<int64_t>(blockIdx.z) * tokens * channels + static_cast<int64_t>(blockIdx.y) * d;

  for (int i = threadIdx.x; i < kSimpleQueries * dp; i += blockDim.x) {
    const int r = i / dp, c = i - r * dp;
    qs[i] = (q0 + r < tokens && c < d)
                ? to_f32(q[head_base + static_cast<int64_t>(q0 + r) * channels + c]) * scale_log2
                : 0.f;
  }

  float o[kSimpleRows][kSimpleMaxD / 32];
  float m[kSimpleRows], l[kSimpleRows];
#pragma unroll
  for (int r = 0; r < kSimpleRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int i = 0; i < kSimpleMaxD / 32; ++i) o[r][i] = 0.f;
  }

  auto load_tile = [&](const T* src, int row0) {
    for (int i = threadIdx.x; i < kSimpleKeys * dp; i += blockDim.x) {
      const int r = i / dp, c = i - r * dp;
      kv[r * kv_ld + c] =
          (row0 + r < tokens && c < d)
              ? to_f32(src[head_base + static_cast<int64_t>(row0 + r) * channels + c])
              : 0.f;
    }
  };

  for (int k0 = 0; k0 < tokens; k0 += kSimpleKeys) {
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
    const bool valid = k0 + lane < tokens;
#pragma unroll
    for (int r = 0; r < kSimpleRows; ++r) {
      const float sr = valid ? s[r] : -INFINITY;
      const float mn = fmaxf(m[r], warp_max(sr));  // finite: key k0 is always real
      const float alpha = exp2f(m[r] - mn);
      const float p = exp2f(sr - mn);
      l[r] = l[r] * alpha + warp_sum(p);
      m[r] = mn;
#pragma unroll
      for (int i = 0; i < kSimpleMaxD / 32; ++i) o[r][i] *= alpha;
      ps[(warp * kSimpleRows + r) * kSimpleKeys + lane] = p;
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
      for (int i = 0; i < kSimpleMaxD / 32; ++i) {
        const int c = lane + 32 * i;
        if (c < d) {
          const float vv = vrow[c];
#pragma unroll
          for (int r = 0; r < kSimpleRows; ++r) o[r][i] = fmaf(pj[r], vv, o[r][i]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kSimpleRows; ++r) {
    const int row = q0 + warp * kSimpleRows + r;
    if (row >= tokens) continue;
    const float inv = 1.f / l[r];
    T* orow = out + head_base + static_cast<int64_t>(row) * channels;
#pragma unroll
    for (int i = 0; i < kSimpleMaxD / 32; ++i) {
      const int c = lane + 32 * i;
      if (c < d) orow[c] = from_f32<T>(o[r][i] * inv);
    }
  }
}

template <typename T, int DW>
Status run_mma(const void* q, const void* k, const void* v, void* out, int64_t n, int tokens,
               int channels, int heads, int d, float scale_log2, size_t smem, const Launch& l) {
  auto kernel = attention_mma_kernel<T, DW>;
  LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  const dim3 grid((tokens + kBr - 1) / kBr, heads, static_cast<unsigned>(n));
  const int threads = 32 * kRowGroups * (d / DW);
  kernel<<<grid, threads, smem, l.stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                            static_cast<const T*>(v), static_cast<T*>(out), tokens,
                                            channels, d, scale_log2);
  LATENT_CUDA_CHECK_LAUNCH("attention_mma_kernel");
  return ok_status();
}

template <typename T>
Status run_simple(const void* q, const void* k, const void* v, void* out, int64_t n, int tokens,
                  int channels, int heads, int d, float scale_log2, const Launch& l) {
  const size_t smem = simple_smem_bytes(d);
  if (smem > l.smem_optin)
    return Status::errorf("spatial_attention: head size ", d, " needs ", smem,
                          " bytes of shared memory, the device allows ", l.smem_optin);
  auto kernel = attention_simple_kernel<T>;
  LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  const dim3 grid((tokens + kSimpleQueries - 1) / kSimpleQueries, heads, static_cast<unsigned>(n));
  kernel<<<grid, 32 * kSimpleWarps, smem, l.stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
      static_cast<T*>(out), tokens, channels, d, scale_log2);
  LATENT_CUDA_CHECK_LAUNCH("attention_simple_kernel");
  return ok_status();
}

}  // namespace

Status launch_spatial_attention(const void* q, const void* k, const void* v, void* out, int64_t n,
                                int64_t tokens, int64_t channels, int heads, DType dtype,
                                bool tensor_cores, const Launch& l) {
  if (n <= 0 || tokens <= 0) return ok_status();
  if (heads < 1 || channels % heads != 0)
    return Status::errorf("spatial_attention: ", channels, " channels cannot be split into ", heads,
                          " heads");
  if (n > 65535 || heads > 65535 || tokens > (1 << 30) || channels > (1 << 20))
    return Status::errorf("spatial_attention: shape n ", n, ", tokens ", tokens, ", channels ",
                          channels, " is too large");
  const int d = static_cast<int>(channels / heads);
  const float scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(d)));
  const int t = static_cast<int>(tokens), c = static_cast<int>(channels);

  if (tensor_cores && dtype != DType::kF32 && c % 8 == 0 && aligned16(q) && aligned16(k) &&
      aligned16(v) && aligned16(out)) {
    const int dw = (d % 128 == 0 && d / 128 <= kMaxSplit) ? 128
                   : (d % 64 == 0 && d / 64 <= kMaxSplit) ? 64
                                                          : 0;
    const size_t smem = dw ? mma_smem_bytes(d, kRowGroups * (d / dw)) : 0;
    if (dw && smem <= l.smem_optin) {
      if (dtype == DType::kBF16)
        return dw == 128 ? run_mma<bf16, 128>(q, k, v, out, n, t, c, heads, d, scale_log2, smem, l)
                         : run_mma<bf16, 64>(q, k, v, out, n, t, c, heads, d, scale_log2, smem, l);
      return dw == 128 ? run_mma<f16, 128>(q, k, v, out, n, t, c, heads, d, scale_log2, smem, l)
                       : run_mma<f16, 64>(q, k, v, out, n, t, c, heads, d, scale_log2, smem, l);
    }
  }
  if (d > kSimpleMaxD)
    return Status::errorf("spatial_attention: head size ", d, " (", channels, " channels / ", heads,
                          " heads) is over the ", kSimpleMaxD, " the CUDA kernels support");
  return LATENT_DISPATCH_DTYPE(
      dtype, T, [&] { return run_simple<T>(q, k, v, out, n, t, c, heads, d, scale_log2, l); });
}

}  // namespace latent::cuda
