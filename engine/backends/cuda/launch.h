// What every kernel launcher needs: the stream to queue on and the device's size.
// Plain C++ (included by the .cpp dispatch and by the .cu kernels alike).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace latent::cuda {

struct Launch {
  cudaStream_t stream = nullptr;
  int sm_count = 1;               // multiprocessors, to size grid-stride launches
  size_t smem_optin = 48 * 1024;  // largest dynamic shared memory a block may ask for
};

// Blocks for a grid-stride loop over `work` items of `threads` each: enough to fill the device
// several times over, no more.
inline unsigned grid_for(int64_t work, int threads, const Launch& l, int waves = 8) {
  const int64_t needed = (work + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(l.sm_count) * waves;
  const int64_t blocks = needed < cap ? needed : cap;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

}  // namespace latent::cuda
