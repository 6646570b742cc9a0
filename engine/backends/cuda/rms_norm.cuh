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
// `max_packs`: the most 16-byte packs of a pixel one lane holds in rms_norm_group_kernel (1 to 6;
// fewer packs a lane, more lanes a pixel); 0: the default (tests/gpu/bench_norm.cpp times them;
// the CUDA backend passes LATENT_RMS_NORM_PACKS).
Status launch_rms_norm_channels(const void* x, void* y, int64_t pixels, int64_t channels,
                                const void* gamma, const void* beta, Activation act, DType dtype,
                                const Launch& l, int max_packs = 0);

}  // namespace latent::cuda
