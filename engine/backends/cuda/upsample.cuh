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

// Backend::interleave_phases2x in NHWC: z [n][h + 1][w + 1][4c] -> y [n][2h][2w][c] with
// y[b][2i + a][2j + q] = z[b][i + a][j + q][(2a + q) c, (2a + q + 1) c); elements of `elem_size`
// bytes moved unchanged.
Status launch_interleave_phases2x(const void* z, void* y, int64_t n, int64_t h, int64_t w,
                                  int64_t c, size_t elem_size, const Launch& l);

}  // namespace latent::cuda
