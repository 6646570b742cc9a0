// Device helpers shared by the DiT kernels (.cu files only).
#pragma once

#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/dit_kernels.cuh"

namespace latent::cuda {

// The conditioning row (group * batch + b) of flat token row r = b * tokens + t.
__device__ __forceinline__ int64_t dit_condition_row(const DitGroups& g, int64_t r) {
  const int64_t b = r / g.tokens, t = r - b * g.tokens;
  int group = 0;
#pragma unroll
  for (int i = 1; i < kMaxDitGroups; ++i)
    if (i < g.count && t >= g.starts[i]) group = i;
  return group * g.batch + b;
}

// PyTorch's gelu(approximate="tanh") and silu, in fp32.
__device__ __forceinline__ float dit_activate(float v, DitActivation act) {
  switch (act) {
    case DitActivation::kNone:
      return v;
    case DitActivation::kSiLU:
      return v / (1.f + expf(-v));
    case DitActivation::kGELUTanh:
      return 0.5f * v * (1.f + tanhf(0.7978845608028654f * fmaf(0.044715f * v * v, v, v)));
  }
  return v;
}

}  // namespace latent::cuda
