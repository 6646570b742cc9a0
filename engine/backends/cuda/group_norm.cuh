// Group normalisation over NHWC activations, with the affine transform and an optional
// activation fused into the one pass that writes the output.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// Bytes of device scratch launch_group_norm needs for this shape (0 if the shape is unsupported;
// launch_group_norm then says why).
size_t group_norm_scratch_bytes(int64_t n, int64_t hw, int64_t channels, int groups, DType dtype,
                                const Launch& l);

// x, y: NHWC [n][hw][channels]; gamma, beta: [channels] in `dtype`, or both null.
// y = act((x - mean_g) / sqrt(var_g + eps) * gamma + beta), statistics in fp32/fp64.
Status launch_group_norm(const void* x, void* y, int64_t n, int64_t hw, int64_t channels,
                         int groups, const void* gamma, const void* beta, float eps, Activation act,
                         DType dtype, void* scratch, const Launch& l);

}  // namespace latent::cuda
