// Rotary embedding on interleaved pairs (diffusers' apply_rotary_emb_qwen, use_real=False): a
// thread rotates the V / 2 pairs of one 16-byte pack (or a single pair where rows are not
// pack-aligned) with the fp32 (cos, sin) of its token.
#include "engine/backends/cuda/dit_common.cuh"

namespace latent::cuda {
namespace {

// x, y: [rows][channels]; freqs: [tokens][half][2]; V elements (V / 2 pairs) a thread.
template <typename T, int V>
__global__ void __launch_bounds__(256)
    dit_rope_kernel(const T* __restrict__ x, const float* __restrict__ freqs, T* __restrict__ y,
                    int64_t packs, int64_t tokens, int64_t channels, int64_t d) {
  static_assert(V % 2 == 0, "whole pairs");
  const int64_t half = d / 2;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < packs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = p * V;
    const int64_t row = e / channels, col = e - row * channels;
    const int64_t t = row % tokens, i0 = (col % d) / 2;  // first pair of the pack
    const float2* f = reinterpret_cast<const float2*>(freqs) + t * half + i0;
    float v[V];
    if constexpr (V == 2) {
      v[0] = to_f32(x[e]);
      v[1] = to_f32(x[e + 1]);
    } else {
      load_floats<T, V>(x + e, v);
    }
#pragma unroll
    for (int j = 0; j < V / 2; ++j) {
      const float2 cs = f[j];
      const float re = v[2 * j], im = v[2 * j + 1];
      v[2 * j] = re * cs.x - im * cs.y;
      v[2 * j + 1] = re * cs.y + im * cs.x;
    }
    if constexpr (V == 2) {
      y[e] = from_f32<T>(v[0]);
      y[e + 1] = from_f32<T>(v[1]);
    } else {
      store_floats<T, V>(y + e, v);
    }
  }
}

}  // namespace

Status launch_dit_rope(const void* x, const float* freqs, void* y, int64_t rows, int64_t tokens,
                       int heads, int64_t d, DType dtype, const Launch& l) {
  const int64_t channels = heads * d, n = rows * channels;
  if (n <= 0) return ok_status();
  if (d % 2 != 0) return Status::errorf("rope: odd head size ", d);
  if (reinterpret_cast<uintptr_t>(freqs) % 8 != 0)
    return Status::error("rope: freqs are not 8-byte aligned (a view at an odd offset?)");
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    constexpr int kPack = Pack<T>::kN;
    // With d a multiple of the pack length, a pack's pairs lie in one head: consecutive freqs.
    if (d % kPack == 0 && aligned16(x) && aligned16(y)) {
      const int64_t packs = n / kPack;
      dit_rope_kernel<T, kPack><<<grid_for(packs, 256, l), 256, 0, l.stream>>>(
          static_cast<const T*>(x), freqs, static_cast<T*>(y), packs, tokens, channels, d);
    } else {
      const int64_t packs = n / 2;
      dit_rope_kernel<T, 2><<<grid_for(packs, 256, l), 256, 0, l.stream>>>(
          static_cast<const T*>(x), freqs, static_cast<T*>(y), packs, tokens, channels, d);
    }
    LATENT_CUDA_CHECK_LAUNCH("dit_rope_kernel");
    return ok_status();
  });
}

}  // namespace latent::cuda
