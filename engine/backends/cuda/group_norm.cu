// Three launches: (1) per-chunk Welford statistics of every group, many blocks per image so
// the whole device reads; (2) one block per image and group merges the chunks (Chan's formula,
// in double) and folds mean, rstd, gamma and beta into a per-channel scale and shift; (3) one pass
// y = act(x * scale[c] + shift[c]) with 16-byte loads and stores. The input is read twice and
// the output written once, the least a normalisation over whole groups can do.
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/group_norm.cuh"

namespace latent::cuda {
namespace {

constexpr int kMaxSharedFloats = 48 * 1024 / 4 / 2;  // per-channel mean and M2 in 48 KB

struct Geometry {
  int vec = 1;         // channels per thread (a 16-byte pack, or 1)
  int tpp = 1;         // threads per pixel = channels / vec
  int ppb = 1;         // pixels a block reads per step
  int threads = 1;     // tpp * ppb
  int64_t chunk = 1;   // pixels per block
  int64_t chunks = 1;  // blocks per image
  size_t partial_bytes = 0, scale_bytes = 0;
  Status status;
};

Geometry plan(int64_t n, int64_t hw, int64_t channels, int groups, DType dtype, const Launch& l) {
  Geometry g;
  if (n < 1 || hw < 1 || channels < 1 || groups < 1 || channels % groups != 0) {
    g.status = Status::errorf("group_norm: bad shape n ", n, ", hw ", hw, ", channels ", channels,
                              ", groups ", groups);
    return g;
  }
  if (n > 65535) {
    g.status = Status::errorf("group_norm: batch ", n, " is over 65535");
    return g;
  }
  const int pack = static_cast<int>(16 / dtype_size(dtype));
  g.vec = channels % pack == 0 ? pack : 1;
  if (channels / g.vec > 1024 || channels > kMaxSharedFloats) {
    g.status =
        Status::errorf("group_norm: ", channels,
                       " channels is more than the CUDA kernel supports (", kMaxSharedFloats, ")");
    return g;
  }
  g.tpp = static_cast<int>(channels / g.vec);
  g.ppb = g.tpp >= 256 ? 1 : 256 / g.tpp;
  g.threads = g.tpp * g.ppb;
  // Enough blocks for two full waves, each thread reading at least four pixels.
  const int64_t target = static_cast<int64_t>(l.sm_count) * (2048 / g.threads) * 2;
  const int64_t per_image = target / n > 1 ? target / n : 1;
  const int64_t min_chunk = static_cast<int64_t>(g.ppb) * 4;
  g.chunk = (hw + per_image - 1) / per_image;
  if (g.chunk < min_chunk) g.chunk = min_chunk;
  g.chunks = (hw + g.chunk - 1) / g.chunk;
  g.partial_bytes = static_cast<size_t>(n * g.chunks * groups) * sizeof(float2);
  g.partial_bytes = (g.partial_bytes + 255) / 256 * 256;
  g.scale_bytes = static_cast<size_t>(n * channels * 2) * sizeof(float);
  return g;
}

// Pixels row `py` of a block visits in [p0, p1) stepping by ppb.
__device__ __forceinline__ int64_t rows_visited(int64_t p0, int64_t p1, int py, int ppb) {
  const int64_t span = p1 - p0 - py;
  return span > 0 ? (span + ppb - 1) / ppb : 0;
}

// grid (chunks, n), block tpp * ppb threads; thread (py, t) reads channels [t*V, t*V + V) of
// pixels p0 + py, p0 + py + ppb, ... Writes (mean, M2) per group and chunk.
template <typename T, int V>
__global__ void group_norm_stats_kernel(const T* __restrict__ x, int64_t hw, int channels,
                                        int groups, int64_t chunk, int64_t chunks,
                                        float2* __restrict__ partial) {
  extern __shared__ float smem[];
  const int tpp = channels / V;
  const int ppb = blockDim.x / tpp;
  const int t = threadIdx.x % tpp, py = threadIdx.x / tpp;
  const int64_t img = blockIdx.y;
  const int64_t p0 = blockIdx.x * chunk;
  const int64_t p1 = min(hw, p0 + chunk);

  float mean[V], m2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) mean[j] = m2[j] = 0.f;
  int count = 0;
  const T* base = x + img * hw * channels + t * V;
#pragma unroll 4
  for (int64_t p = p0 + py; p < p1; p += ppb) {
    float v[V];
    load_floats<T, V>(base + p * channels, v);
    ++count;
    const float inv = 1.f / static_cast<float>(count);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = v[j] - mean[j];
      mean[j] += d * inv;
      m2[j] += d * (v[j] - mean[j]);
    }
  }

  // Merge the rows of the block: thread (0, t) folds in rows 1 .. ppb-1 of its channels.
  float* s_mean = smem;
  float* s_m2 = smem + blockDim.x * V;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    s_mean[threadIdx.x * V + j] = mean[j];
    s_m2[threadIdx.x * V + j] = m2[j];
  }
  __syncthreads();
  if (py == 0) {
    float na = static_cast<float>(count);
    for (int r = 1; r < ppb; ++r) {
      const float nb = static_cast<float>(rows_visited(p0, p1, r, ppb));
      if (nb == 0.f) break;  // later rows visit no more pixels
      const float nab = na + nb;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int k = (r * tpp + t) * V + j;
        const float d = s_mean[k] - mean[j];
        mean[j] += d * (nb / nab);
        m2[j] += s_m2[k] + d * d * (na * nb / nab);
      }
      na = nab;
    }
    // Row 0's slots are this thread's own: nobody else reads them.
#pragma unroll
    for (int j = 0; j < V; ++j) {
      s_mean[t * V + j] = mean[j];
      s_m2[t * V + j] = m2[j];
    }
  }
  __syncthreads();

  // Channels -> groups (each channel saw the same p1 - p0 pixels).
  const int cpg = channels / groups;
  const float pixels = static_cast<float>(p1 - p0);
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float gm = 0.f;
    for (int c = g * cpg; c < (g + 1) * cpg; ++c) gm += s_mean[c];
    gm /= static_cast<float>(cpg);
    float gm2 = 0.f;
    for (int c = g * cpg; c < (g + 1) * cpg; ++c) {
      const float d = s_mean[c] - gm;
      gm2 += s_m2[c] + pixels * d * d;
    }
    partial[(img * chunks + blockIdx.x) * groups + g] = make_float2(gm, gm2);
  }
}

// Chan's merge of two (count, mean, M2) partial statistics into the first.
__device__ __forceinline__ void chan_merge(double& na, double& mean, double& m2, double nb,
                                           double mb, double m2b) {
  if (nb == 0.0) return;
  const double nab = na + nb;
  const double d = mb - mean;
  mean += d * (nb / nab);
  m2 += m2b + d * d * (na * nb / nab);
  na = nab;
}

constexpr int kFinalizeThreads = 256;

// grid (n, groups), one block per image and group: the block's threads merge strided subsets of
// the chunk statistics (Chan's formula, in double), then a warp-shuffle and shared-memory tree
// merges those; the result is folded with gamma and beta into the group's channels' scale and
// shift. (One thread per group walking every chunk in turn was 0.3 ms a call at 512x512 on an
// H100, more than the statistics and the apply pass together: bench/NOTES.md.)
template <typename T>
__global__ void __launch_bounds__(kFinalizeThreads)
    group_norm_finalize_kernel(const float2* __restrict__ partial, int64_t hw, int channels,
                               int groups, int64_t chunk, int64_t chunks,
                               const T* __restrict__ gamma, const T* __restrict__ beta, float eps,
                               float* __restrict__ scale_shift) {
  const int64_t img = blockIdx.x;
  const int g = blockIdx.y;
  const int cpg = channels / groups;
  const float2* p = partial + img * chunks * groups + g;
  double n = 0.0, mean = 0.0, m2 = 0.0;
  for (int64_t i = threadIdx.x; i < chunks; i += kFinalizeThreads) {
    const int64_t pixels = min(hw, (i + 1) * chunk) - i * chunk;
    if (pixels <= 0) continue;
    const float2 v = p[i * groups];
    chan_merge(n, mean, m2, static_cast<double>(pixels) * cpg, v.x, v.y);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const double nb = __shfl_down_sync(0xffffffffu, n, off);
    const double mb = __shfl_down_sync(0xffffffffu, mean, off);
    const double qb = __shfl_down_sync(0xffffffffu, m2, off);
    chan_merge(n, mean, m2, nb, mb, qb);
  }
  constexpr int kWarps = kFinalizeThreads / 32;
  __shared__ double s_n[kWarps], s_mean[kWarps], s_m2[kWarps];
  __shared__ float s_stats[2];  // mean, rstd
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_n[warp] = n;
    s_mean[warp] = mean;
    s_m2[warp] = m2;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double tn = 0.0, tm = 0.0, tq = 0.0;
    for (int w = 0; w < kWarps; ++w) chan_merge(tn, tm, tq, s_n[w], s_mean[w], s_m2[w]);
    const double var = tn > 0.0 && tq > 0.0 ? tq / tn : 0.0;
    s_stats[0] = static_cast<float>(tm);
    s_stats[1] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  }
  __syncthreads();
  float* scale = scale_shift + img * 2 * channels;
  float* shift = scale + channels;
  for (int c = g * cpg + threadIdx.x; c < (g + 1) * cpg; c += kFinalizeThreads) {
    const float gm = gamma ? to_f32(gamma[c]) : 1.f;
    const float bt = beta ? to_f32(beta[c]) : 0.f;
    const float s = s_stats[1] * gm;
    scale[c] = s;
    shift[c] = bt - s_stats[0] * s;
  }
}

// grid (blocks, n): y = act(x * scale[c] + shift[c]).
template <typename T, int V>
__global__ void group_norm_apply_kernel(const T* __restrict__ x, T* __restrict__ y,
                                        int64_t per_image, int channels,
                                        const float* __restrict__ scale_shift, Activation act) {
  const int64_t img = blockIdx.y;
  const float* scale = scale_shift + img * 2 * channels;
  const float* shift = scale + channels;
  const T* xi = x + img * per_image;
  T* yi = y + img * per_image;
  const int64_t steps = per_image / V;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < steps;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int c0 = static_cast<int>((i * V) % channels);
    if constexpr (V == 1) {
      yi[i] = from_f32<T>(activate(fmaf(to_f32(xi[i]), __ldg(scale + c0), __ldg(shift + c0)), act));
    } else {
      Pack<T> p = load_pack(xi + i * V);
#pragma unroll
      for (int j = 0; j < V; ++j)
        p.v[j] = from_f32<T>(
            activate(fmaf(to_f32(p.v[j]), __ldg(scale + c0 + j), __ldg(shift + c0 + j)), act));
      store_pack(yi + i * V, p);
    }
  }
}

template <typename T, int V>
Status run(const Geometry& g, const void* x, void* y, int64_t n, int64_t hw, int64_t channels,
           int groups, const void* gamma, const void* beta, float eps, Activation act,
           void* scratch, const Launch& l) {
  auto* partial = static_cast<float2*>(scratch);
  auto* scale_shift = reinterpret_cast<float*>(static_cast<char*>(scratch) + g.partial_bytes);
  const int c = static_cast<int>(channels);

  const size_t stats_smem =
      static_cast<size_t>(g.threads * V > c ? g.threads * V : c) * 2 * sizeof(float);
  group_norm_stats_kernel<T, V>
      <<<dim3(static_cast<unsigned>(g.chunks), static_cast<unsigned>(n)), g.threads, stats_smem,
         l.stream>>>(static_cast<const T*>(x), hw, c, groups, g.chunk, g.chunks, partial);
  LATENT_CUDA_CHECK_LAUNCH("group_norm_stats");

  group_norm_finalize_kernel<T>
      <<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(groups)), kFinalizeThreads, 0,
         l.stream>>>(
          partial, hw, c, groups, g.chunk, g.chunks, static_cast<const T*>(gamma),
          static_cast<const T*>(beta), eps, scale_shift);
  LATENT_CUDA_CHECK_LAUNCH("group_norm_finalize");

  const int64_t per_image = hw * channels;
  const int waves = n >= 8 ? 1 : static_cast<int>(8 / n);  // about 8 waves over all images
  const unsigned blocks = grid_for(per_image / V, 256, l, waves);
  group_norm_apply_kernel<T, V><<<dim3(blocks, static_cast<unsigned>(n)), 256, 0, l.stream>>>(
      static_cast<const T*>(x), static_cast<T*>(y), per_image, c, scale_shift, act);
  LATENT_CUDA_CHECK_LAUNCH("group_norm_apply");
  return ok_status();
}

}  // namespace

size_t group_norm_scratch_bytes(int64_t n, int64_t hw, int64_t channels, int groups, DType dtype,
                                const Launch& l) {
  const Geometry g = plan(n, hw, channels, groups, dtype, l);
  return g.status.ok() ? g.partial_bytes + g.scale_bytes : 0;
}

Status launch_group_norm(const void* x, void* y, int64_t n, int64_t hw, int64_t channels,
                         int groups, const void* gamma, const void* beta, float eps, Activation act,
                         DType dtype, void* scratch, const Launch& l) {
  const Geometry g = plan(n, hw, channels, groups, dtype, l);
  if (!g.status.ok()) return g.status;
  const bool aligned = aligned16(x) && aligned16(y);
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    if (g.vec == kPack && aligned)
      return run<T, kPack>(g, x, y, n, hw, channels, groups, gamma, beta, eps, act, scratch, l);
    Geometry scalar = g;
    if (g.vec != 1) {  // misaligned buffers: the scalar geometry
      scalar.vec = 1;
      scalar.tpp = static_cast<int>(channels);
      if (scalar.tpp > 1024)
        return Status::errorf("group_norm: unaligned buffers with ", channels, " channels");
      scalar.ppb = scalar.tpp >= 256 ? 1 : 256 / scalar.tpp;
      scalar.threads = scalar.tpp * scalar.ppb;
      scalar.chunk = g.chunk;  // the scratch was sized for g.chunks, keep them
      scalar.chunks = g.chunks;
    }
    return run<T, 1>(scalar, x, y, n, hw, channels, groups, gamma, beta, eps, act, scratch, l);
  });
}

}  // namespace latent::cuda
