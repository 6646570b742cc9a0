// The Wan / Qwen-Image VAE channel RMS norm over NHWC activations, per pixel over channels.
#pragma once

#include <cstdint>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// y = act(x / max(||x||_C, 1e-12) * sqrt(C) * gamma + beta) for NHWC [pixels][channels];
// gamma and beta ([channels], in `dtype`) may each be null (1 and 0).
Status launch_rms_norm_channels(const void* x, void* y, int64_t pixels, int64_t channels,
                                const void* gamma, const void* beta, Activation act, DType dtype,
                                const Launch& l);

}  // namespace latent::cuda
