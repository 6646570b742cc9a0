// RMS norm over the channels of each pixel (NHWC), with gamma, beta and the activation fused.
// Two kernels:
//  - rms_norm_group_kernel (channels in 16-byte packs, up to 3 packs a lane by default): L lanes a
//    pixel (L a power of two, the fewest that leave each lane at most that many packs: 96 bf16
//    channels = 12 packs on 4 lanes), the pixel's channels held in registers (read once), the sum
//    of squares reduced over the L lanes. A warp takes 32 / L pixels a step.
//  - rms_norm_kernel (any other channel count): one warp a pixel, reading the channels twice
//    (the second time from L1). For the Wan VAEs' 96 / 192 channels it left 20 / 8 of 32 lanes
//    idle and ran at ~1.2 TB/s on an H100 (15-17 % of a 720p video stream's time).
#include <cmath>
#include <type_traits>

#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/rms_norm.cuh"

namespace latent::cuda {
namespace {

template <typename T, int V>
__global__ void rms_norm_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t pixels,
                                int channels, const T* __restrict__ gamma,
                                const T* __restrict__ beta, float sqrt_c, Activation act) {
  const int lane = threadIdx.x & 31;
  const int64_t first = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  const int steps = channels / V;
  for (int64_t p = first; p < pixels; p += warps) {
    const T* xp = x + p * channels;
    T* yp = y + p * channels;
    float ss = 0.f;
    for (int s = lane; s < steps; s += 32) {
      float v[V];
      load_floats<T, V>(xp + s * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) ss = fmaf(v[j], v[j], ss);
    }
    ss = warp_sum(ss);
    const float k = sqrt_c / fmaxf(sqrtf(ss), 1e-12f);
    for (int s = lane; s < steps; s += 32) {
      float v[V], g[V], b[V];
      load_floats<T, V>(xp + s * V, v);
      if (gamma) {
        load_floats<T, V>(gamma + s * V, g);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) g[j] = 1.f;
      }
      if (beta) {
        load_floats<T, V>(beta + s * V, b);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) b[j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = activate(fmaf(v[j] * k, g[j], b[j]), act);
      store_floats<T, V>(yp + s * V, v);
    }
  }
}

// L lanes a pixel (runtime, a power of two up to 32), lane s holding packs s, s + L, ... (P of
// them) of its pixel. The arithmetic per element is rms_norm_kernel's.
template <typename T, int P>
__global__ void __launch_bounds__(256)
    rms_norm_group_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t pixels,
                          int channels, int L, const T* __restrict__ gamma,
                          const T* __restrict__ beta, float sqrt_c, Activation act) {
  constexpr int V = Pack<T>::kN;
  const int lane = threadIdx.x & 31, s = lane % L;
  const int per_warp = 32 / L;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t base = warp * per_warp; base < pixels; base += warps * per_warp) {
    const int64_t p = base + lane / L;
    const bool valid = p < pixels;
    const T* xp = x + (valid ? p : pixels - 1) * channels;
    float v[P][V];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      load_floats<T, V>(xp + (s + k * L) * V, v[k]);
#pragma unroll
      for (int j = 0; j < V; ++j) ss = fmaf(v[k][j], v[k][j], ss);
    }
    for (int o = L / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float scale = sqrt_c / fmaxf(sqrtf(ss), 1e-12f);
    if (!valid) continue;
    T* yp = y + p * channels;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int c = (s + k * L) * V;
      float g[V], b[V];
      if (gamma) {
        load_floats<T, V>(gamma + c, g);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) g[j] = 1.f;
      }
      if (beta) {
        load_floats<T, V>(beta + c, b);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) b[j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < V; ++j) v[k][j] = activate(fmaf(v[k][j] * scale, g[j], b[j]), act);
      store_floats<T, V>(yp + c, v[k]);
    }
  }
}

// launch_rms_norm_channels' max_packs = 0: 3 packs a lane (4 lanes a pixel at 96 channels, each
// warp-wide load 8 pixels' 64-byte pieces) ran 5-14 % faster than 6 (2 lanes, 32-byte pieces) at
// every Wan 2.1 720p shape on an H200 (bench_norm, session 25); a lane holding its packs as loaded
// rather than as floats, two pixels a lane in flight, or whole 512-byte warp rows with the sums
// met in shared memory did not help. What did most was activate()'s SiLU without the IEEE
// division (common.cuh): 0.86 of a copy's speed now, against 0.54 before.
constexpr int kDefaultMaxPacks = 3;

}  // namespace

Status launch_rms_norm_channels(const void* x, void* y, int64_t pixels, int64_t channels,
                                const void* gamma, const void* beta, Activation act, DType dtype,
                                const Launch& l, int max_packs) {
  if (pixels <= 0 || channels <= 0) return ok_status();
  if (max_packs == 0) max_packs = kDefaultMaxPacks;
  if (max_packs < 1 || max_packs > 6)
    return Status::errorf("rms_norm_channels: ", max_packs, " packs a lane (1 to 6)");
  if (channels > 0x7fffffff) return Status::errorf("rms_norm_channels: ", channels, " channels");
  const float sqrt_c = std::sqrt(static_cast<float>(channels));
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    const bool vec = channels % kPack == 0 && aligned16(x) && aligned16(y) &&
                     (!gamma || aligned16(gamma)) && (!beta || aligned16(beta));
    if (vec) {
      // The fewest lanes a pixel (a power of two) that leave each lane at most max_packs packs.
      const int64_t packs = channels / kPack;
      int lanes = 1;
      while (lanes <= 32 && (packs % lanes != 0 || packs / lanes > max_packs)) lanes *= 2;
      if (lanes <= 32) {
        auto go = [&](auto per) {
          rms_norm_group_kernel<T, decltype(per)::value>
              <<<grid_for(pixels * lanes, 256, l), 256, 0, l.stream>>>(
                  static_cast<const T*>(x), static_cast<T*>(y), pixels,
                  static_cast<int>(channels), lanes, static_cast<const T*>(gamma),
                  static_cast<const T*>(beta), sqrt_c, act);
        };
        switch (packs / lanes) {
          case 1: go(std::integral_constant<int, 1>{}); break;
          case 2: go(std::integral_constant<int, 2>{}); break;
          case 3: go(std::integral_constant<int, 3>{}); break;
          case 4: go(std::integral_constant<int, 4>{}); break;
          case 5: go(std::integral_constant<int, 5>{}); break;
          default: go(std::integral_constant<int, 6>{}); break;
        }
        LATENT_CUDA_CHECK_LAUNCH("rms_norm_channels");
        return ok_status();
      }
    }
    const unsigned blocks = grid_for(pixels * 32, 256, l);
    if (vec)
      rms_norm_kernel<T, kPack><<<blocks, 256, 0, l.stream>>>(
          static_cast<const T*>(x), static_cast<T*>(y), pixels, static_cast<int>(channels),
          static_cast<const T*>(gamma), static_cast<const T*>(beta), sqrt_c, act);
    else
      rms_norm_kernel<T, 1><<<blocks, 256, 0, l.stream>>>(
          static_cast<const T*>(x), static_cast<T*>(y), pixels, static_cast<int>(channels),
          static_cast<const T*>(gamma), static_cast<const T*>(beta), sqrt_c, act);
    LATENT_CUDA_CHECK_LAUNCH("rms_norm_channels");
    return ok_status();
  });
}

}  // namespace latent::cuda
