// DiT attention: softmax(q k^T / sqrt(d)) v with queries and keys of different lengths, heads
// side by side in the features ([n][tokens][heads * d]) and an optional key padding mask.
// Flash-style, fp32 online softmax on exp2 of scores pre-scaled by log2(e) / sqrt(d); the
// T x S scores never exist as a whole.
//
// dit_attention_mma_kernel (bf16/fp16, d = 64 or 128): the tensor-core kernel of attention.cu
// for one warp per 16 queries over the whole head (no channel split): a block of 4 warps takes
// 64 queries and walks the keys 32 at a time, K and V tiles arriving by cp.async, each load
// overlapping the other half of the step. Each tile's key-keep flags (mask and sequence end)
// go to shared memory with the K tile. A tile whose keys are all masked leaves the running
// maximum at -inf; the exponent base is then taken as 0 so no NaN arises, and a row that never
// saw a key ends with l = 0 and is written as zeros.
//
// dit_attention_simple_kernel (any dtype, d <= 256): CUDA cores, 4 warps x 4 queries a block;
// lane j scores key j of a 32-key tile, then each lane accumulates channels lane + 32 i.
#include <cmath>

#include "engine/backends/cuda/dit_common.cuh"
#include "engine/backends/cuda/mma.cuh"

namespace latent::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kBr = 16 * kWarps;  // queries per block
constexpr int kBc = 32;           // keys per tile
constexpr int kPad = 8;           // elements added to each shared row (16 bytes): no bank conflicts

template <int D>
constexpr size_t mma_smem_bytes() {
  return static_cast<size_t>(kBr + 2 * kBc) * (D + kPad) * 2 + 2 * kBc * sizeof(float);
}

// grid (ceil(tq / 64), heads, n); block 128 threads.
template <typename T, int D>
__global__ void __launch_bounds__(32 * kWarps)
    dit_attention_mma_kernel(const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, const T* __restrict__ mask,
                             T* __restrict__ out, int tq, int tk, int channels, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = D + kPad;
  T* qs = reinterpret_cast<T*>(smem_raw);                 // [kBr][ld]
  T* ks = qs + kBr * ld;                                  // [kBc][ld]
  T* vs = ks + kBc * ld;                                  // [kBc][ld]
  float* keep = reinterpret_cast<float*>(vs + kBc * ld);  // [2][kBc]: 1 attend, 0 skip

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q0 = blockIdx.x * kBr;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * D;
  const T* qg = q + static_cast<int64_t>(blockIdx.z) * tq * channels + head;
  const T* kg = k + static_cast<int64_t>(blockIdx.z) * tk * channels + head;
  const T* vg = v + static_cast<int64_t>(blockIdx.z) * tk * channels + head;
  const T* mrow = mask ? mask + static_cast<int64_t>(blockIdx.z) * tk : nullptr;
  constexpr int kChunks = D / 8;  // 16-byte pieces of a row

  // Rows past `limit` are zero-filled: their scores are masked and V must not hold NaN.
  auto load_tile = [&](T* dst, const T* src, int row0, int rows, int limit) {
    for (int i = threadIdx.x; i < rows * kChunks; i += blockDim.x) {
      const int r = i / kChunks, c = (i - r * kChunks) * 8;
      T* s = dst + r * ld + c;
      if (row0 + r < limit)
        cp_async16(smem_addr(s), src + static_cast<int64_t>(row0 + r) * channels + c);
      else
        *reinterpret_cast<uint4*>(s) = make_uint4(0, 0, 0, 0);
    }
  };
  auto load_keep = [&](int buf, int key0) {
    if (threadIdx.x < kBc) {
      const int key = key0 + threadIdx.x;
      keep[buf * kBc + threadIdx.x] = (key < tk && (!mrow || to_f32(mrow[key]) != 0.f)) ? 1.f : 0.f;
    }
  };

  load_tile(qs, qg, q0, kBr, tq);
  load_tile(ks, kg, 0, kBc, tk);
  load_keep(0, 0);
  cp_async_commit();
  load_tile(vs, vg, 0, kBc, tk);
  cp_async_commit();

  // ldmatrix row addresses of this lane (see the PTX fragment layouts of m16n8k16).
  const int g = lane >> 2, tig = lane & 3;
  const uint32_t q_addr =
      smem_addr(qs + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8);
  const uint32_t k_addr =
      smem_addr(ks + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8);
  const uint32_t v_addr =
      smem_addr(vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8);

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g and g + 8

  const int tiles = (tk + kBc - 1) / kBc;
  for (int t = 0; t < tiles; ++t) {
    const int k0 = t * kBc;
    const float* kp = keep + (t & 1) * kBc;
    cp_async_wait_all_but_one();
    __syncthreads();  // K tile t (and Q), its keep flags resident

    // s = Q K^T: 16 queries x 32 keys.
    float s[kBc / 8][4];
#pragma unroll
    for (int i = 0; i < kBc / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
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

    // Online softmax; lane holds rows g (c0, c1) and g + 8 (c2, c3), keys nt*8 + 2*tig + {0,1}.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
      const bool ok0 = kp[nt * 8 + tig * 2] != 0.f, ok1 = kp[nt * 8 + tig * 2 + 1] != 0.f;
      s[nt][0] = ok0 ? s[nt][0] * scale_log2 : -INFINITY;
      s[nt][1] = ok1 ? s[nt][1] * scale_log2 : -INFINITY;
      s[nt][2] = ok0 ? s[nt][2] * scale_log2 : -INFINITY;
      s[nt][3] = ok1 ? s[nt][3] * scale_log2 : -INFINITY;
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    __syncthreads();  // K tile t and keep[t & 1] no longer read
    if (t + 1 < tiles) {
      load_tile(ks, kg, k0 + kBc, kBc, tk);
      load_keep((t + 1) & 1, k0 + kBc);
    }
    cp_async_commit();

    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // No key seen yet (all masked so far): any finite base gives p = 0, alpha = 0.
    const float base0 = mn0 == -INFINITY ? 0.f : mn0, base1 = mn1 == -INFINITY ? 0.f : mn1;
    const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    uint32_t pa[kBc / 16][4];
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
      const float p0 = exp2f(s[nt][0] - base0), p1 = exp2f(s[nt][1] - base0);
      const float p2 = exp2f(s[nt][2] - base1), p3 = exp2f(s[nt][3] - base1);
      rs0 += p0 + p1;
      rs1 += p2 + p3;
      // The accumulator layout of two adjacent n-tiles is the A layout of one k16 step.
      pa[nt / 2][(nt % 2) * 2 + 0] = pack2<T>(p0, p1);
      pa[nt / 2][(nt % 2) * 2 + 1] = pack2<T>(p2, p3);
    }
    l0 = l0 * alpha0 + rs0;  // per-lane partial sums; the quad is summed at the end
    l1 = l1 * alpha1 + rs1;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
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
      for (int np = 0; np < D / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_addr + (kk * 16 * ld + np * 16) * sizeof(T));
        mma16816<T>(o[2 * np], pa[kk], b[0], b[1]);
        mma16816<T>(o[2 * np + 1], pa[kk], b[2], b[3]);
      }
    }
    __syncthreads();  // V tile t no longer read
    if (t + 1 < tiles) load_tile(vs, vg, k0 + kBc, kBc, tk);
    cp_async_commit();
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
  T* og = out + static_cast<int64_t>(blockIdx.z) * tq * channels + head;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    const int c = i * 8 + tig * 2;
    if (r0 < tq)
      *reinterpret_cast<uint32_t*>(og + static_cast<int64_t>(r0) * channels + c) =
          pack2<T>(o[i][0] * inv0, o[i][1] * inv0);
    if (r1 < tq)
      *reinterpret_cast<uint32_t*>(og + static_cast<int64_t>(r1) * channels + c) =
          pack2<T>(o[i][2] * inv1, o[i][3] * inv1);
  }
}

// ---- CUDA-core kernel ---------------------------------------------------------------------

constexpr int kSimpleWarps = 4;
constexpr int kSimpleRows = 4;  // queries per warp
constexpr int kSimpleQueries = kSimpleWarps * kSimpleRows;
constexpr int kSimpleKeys = 32;
constexpr int kSimpleMaxD = 256;

size_t simple_smem_bytes(int d) {
  const int dp = (d + 3) / 4 * 4;
  return (static_cast<size_t>(kSimpleQueries) * dp + static_cast<size_t>(kSimpleKeys) * (dp + 4) +
          kSimpleQueries * kSimpleKeys) *
         sizeof(float);
}

// grid (ceil(tq / 16), heads, n); block 128 threads.
template <typename T>
__global__ void __launch_bounds__(32 * kSimpleWarps)
    dit_attention_simple_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                const T* __restrict__ v, const T* __restrict__ mask,
                                T* __restrict__ out, int tq, int tk, int channels, int d,
                                float scale_log2) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int dp = (d + 3) / 4 * 4;        // rows padded to whole float4s (zeros past d)
  const int kv_ld = dp + 4;              // K/V rows one float4 longer: lanes hit different banks
  float* qs = smem;                      // [16][dp], pre-scaled
  float* kv = qs + kSimpleQueries * dp;  // [32][kv_ld], K then V of one tile
  float* ps = kv + kSimpleKeys * kv_ld;  // [16][32] probabilities

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q0 = blockIdx.x * kSimpleQueries;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * d;
  const int64_t qbase = static_cast<int64_t>(blockIdx.z) * tq * channels + head;
  const int64_t kbase = static_cast<int64_t>(blockIdx.z) * tk * channels + head;
  const T* mrow = mask ? mask + static_cast<int64_t>(blockIdx.z) * tk : nullptr;

  for (int i = threadIdx.x; i < kSimpleQueries * dp; i += blockDim.x) {
    const int r = i / dp, c = i - r * dp;
    qs[i] = (q0 + r < tq && c < d)
                ? to_f32(q[qbase + static_cast<int64_t>(q0 + r) * channels + c]) * scale_log2
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
      kv[r * kv_ld + c] = (row0 + r < tk && c < d)
                              ? to_f32(src[kbase + static_cast<int64_t>(row0 + r) * channels + c])
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
      const float p = exp2f(sr - base);
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
    if (row >= tq) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    T* orow = out + qbase + static_cast<int64_t>(row) * channels;
#pragma unroll
    for (int i = 0; i < kSimpleMaxD / 32; ++i) {
      const int c = lane + 32 * i;
      if (c < d) orow[c] = from_f32<T>(o[r][i] * inv);
    }
  }
}

template <typename T, int D>
Status run_mma(const void* q, const void* k, const void* v, const void* mask, void* out, int64_t n,
               int tq, int tk, int channels, int heads, float scale_log2, const Launch& l) {
  constexpr size_t smem = mma_smem_bytes<D>();
  auto kernel = dit_attention_mma_kernel<T, D>;
  if (smem > 48 * 1024)
    LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  const dim3 grid((tq + kBr - 1) / kBr, heads, static_cast<unsigned>(n));
  kernel<<<grid, 32 * kWarps, smem, l.stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
      static_cast<const T*>(mask), static_cast<T*>(out), tq, tk, channels, scale_log2);
  LATENT_CUDA_CHECK_LAUNCH("dit_attention_mma_kernel");
  return ok_status();
}

template <typename T>
Status run_simple(const void* q, const void* k, const void* v, const void* mask, void* out,
                  int64_t n, int tq, int tk, int channels, int heads, int d, float scale_log2,
                  const Launch& l) {
  const size_t smem = simple_smem_bytes(d);
  auto kernel = dit_attention_simple_kernel<T>;
  if (smem > 48 * 1024)
    LATENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  const dim3 grid((tq + kSimpleQueries - 1) / kSimpleQueries, heads, static_cast<unsigned>(n));
  kernel<<<grid, 32 * kSimpleWarps, smem, l.stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
      static_cast<const T*>(mask), static_cast<T*>(out), tq, tk, channels, d, scale_log2);
  LATENT_CUDA_CHECK_LAUNCH("dit_attention_simple_kernel");
  return ok_status();
}

}  // namespace

Status launch_dit_attention(const void* q, const void* k, const void* v, const void* mask,
                            void* out, int64_t n, int64_t tq, int64_t tk, int heads, int64_t d,
                            DType dtype, const Launch& l) {
  if (n <= 0 || tq <= 0 || tk <= 0) return ok_status();
  const int64_t channels = heads * d;
  if (n > 65535 || heads > 65535 || tq > (1 << 30) || tk > (1 << 30) || channels > (1 << 20))
    return Status::errorf("attention: batch ", n, ", ", tq, " queries, ", tk, " keys, ", heads,
                          " heads of ", d, " is too large");
  const float scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(d)));
  const int a = static_cast<int>(tq), b = static_cast<int>(tk), c = static_cast<int>(channels);

  const bool mma_ok = dtype != DType::kF32 && (d == 64 || d == 128) && aligned16(q) &&
                      aligned16(k) && aligned16(v) && aligned16(out);
  if (mma_ok) {
    if (dtype == DType::kBF16)
      return d == 128 ? run_mma<bf16, 128>(q, k, v, mask, out, n, a, b, c, heads, scale_log2, l)
                      : run_mma<bf16, 64>(q, k, v, mask, out, n, a, b, c, heads, scale_log2, l);
    return d == 128 ? run_mma<f16, 128>(q, k, v, mask, out, n, a, b, c, heads, scale_log2, l)
                    : run_mma<f16, 64>(q, k, v, mask, out, n, a, b, c, heads, scale_log2, l);
  }
  if (d > kSimpleMaxD)
    return Status::errorf("attention: head size ", d, " is over the ", kSimpleMaxD,
                          " the CUDA kernels support (tensor cores: 64 or 128 in bf16/fp16)");
  if (simple_smem_bytes(static_cast<int>(d)) > l.smem_optin)
    return Status::errorf("attention: head size ", d,
                          " needs more shared memory than the device has");
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    return run_simple<T>(q, k, v, mask, out, n, a, b, c, heads, static_cast<int>(d), scale_log2, l);
  });
}

}  // namespace latent::cuda
