// Convolutions with few output channels (conv_narrow.cu): k <= 16, the last convolution of a VAE
// decoder (64 / 96 / 128 channels -> RGB, or -> 12 for 2x2 patches of RGB) at full resolution.
// cuDNN runs these on an sm80 kernel without shared memory (0.16 ms for TAEW2.1's 64 -> 3 at
// 720p, 4x what reading its input takes); this one is bound by that read.
//
// Same arguments as the Hopper implicit-GEMM kernel (conv_wgmma.cuh: input frames from up to
// three tensors so a causal cache needs no join, kt temporal taps, KTRSC filters, the bias /
// residual / activation epilogue fused), restricted to stride 1, filters up to 3 x 3 x 3, input
// channels a multiple of 16 from 32 to 256, bf16/fp16, compute capability 8.0 or later (mma.sync).
#pragma once

#include "engine/backends/cuda/conv_wgmma.cuh"
#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// Whether conv_narrow takes this call (see above; also alignment and int32 sizes).
bool conv_narrow_fits(const ConvWgmmaArgs& a, DType dtype, const Launch& l);

Status launch_conv_narrow(const ConvWgmmaArgs& a, DType dtype, const Launch& l);

}  // namespace latent::cuda
