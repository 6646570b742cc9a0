// Nearest-neighbour 2x upsampling of NHWC activations.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/backends/cuda/launch.h"
#include "engine/core/status.h"

namespace latent::cuda {

// [n][h][w][c] -> [n][2h][2w][c]; moves elements of `elem_size` bytes unchanged.
Status launch_upsample_nearest2x(const void* x, void* y, int64_t n, int64_t h, int64_t w, int64_t c,
                                 size_t elem_size, const Launch& l);

}  // namespace latent::cuda
