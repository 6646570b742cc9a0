// Dtype conversion and NCHW <-> NHWC re-layout on the device (upload and download).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// dst[i] = src[i] converted, for n elements.
Status launch_convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n,
                      const Launch& l);

// src [batch][rows][cols] -> dst [batch][cols][rows], converting the dtype on the way.
// NCHW -> NHWC is (batch N, rows C, cols H*W); NHWC -> NCHW is (N, H*W, C).
Status launch_transpose(const void* src, DType src_type, void* dst, DType dst_type, int64_t batch,
                        int64_t rows, int64_t cols, const Launch& l);

// Whether this binary has kernels the current device can run (false: built for another arch).
Status check_kernel_image();

}  // namespace latent::cuda
