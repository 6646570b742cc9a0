// One warp per pixel: the warp reads the pixel's channels (16-byte packs), reduces the sum of
// squares with shuffles, then reads them again (from L1) to scale, shift, activate and store.
#include <cmath>

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

}  // namespace

Status launch_rms_norm_channels(const void* x, void* y, int64_t pixels, int64_t channels,
                                const void* gamma, const void* beta, Activation act, DType dtype,
                                const Launch& l) {
  if (pixels <= 0 || channels <= 0) return ok_status();
  if (channels > 0x7fffffff) return Status::errorf("rms_norm_channels: ", channels, " channels");
  const float sqrt_c = std::sqrt(static_cast<float>(channels));
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    const bool vec = channels % kPack == 0 && aligned16(x) && aligned16(y) &&
                     (!gamma || aligned16(gamma)) && (!beta || aligned16(beta));
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
