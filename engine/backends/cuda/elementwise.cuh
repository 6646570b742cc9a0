// Elementwise kernels over device tensors of one dtype (fp32, bf16, fp16). Arithmetic is in
// fp32; loads and stores are 16 bytes wide where the buffers are aligned. Channel-indexed ops
// read tensors as NHWC rows of `channels` elements (the layout 4-D tensors have on CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// channel_affine takes its coefficients as kernel parameters, so this many channels at most.
constexpr int kMaxAffineChannels = 1024;

Status launch_activation(const void* x, void* y, int64_t n, DType dtype, Activation act,
                         const Launch& l);
Status launch_affine(const void* x, void* y, int64_t n, DType dtype, float scale, float shift,
                     const Launch& l);
Status launch_clamp(const void* x, void* y, int64_t n, DType dtype, float lo, float hi,
                    const Launch& l);
Status launch_add(const void* a, const void* b, void* y, int64_t n, DType dtype, const Launch& l);
// y = x * scale[c] + shift[c] over n elements of rows of `channels` (<= kMaxAffineChannels).
Status launch_channel_affine(const void* x, void* y, int64_t n, int64_t channels, DType dtype,
                             const float* scale, const float* shift, const Launch& l);
// The convolution epilogue, in place: y = act(y + bias[c] + residual). bias ([channels]) and
// residual (like y) may each be null.
Status launch_bias_residual_act(void* y, const void* bias, const void* residual, int64_t n,
                                int64_t channels, DType dtype, Activation act, const Launch& l);
// NHWC [pixels][channels] -> [pixels][count]: channels [start, start + count). Moves bytes.
Status launch_slice_channels(const void* x, void* y, int64_t pixels, int64_t channels,
                             int64_t start, int64_t count, size_t elem_size, const Launch& l);
// Zero padding of NHWC [n][h][w][c] to [n][h + top + bottom][w + left + right][c].
Status launch_pad(const void* x, void* y, int64_t n, int64_t h, int64_t w, int64_t c, int top,
                  int bottom, int left, int right, size_t elem_size, const Launch& l);

// Zero padding of the channels: NHWC [pixels][c] -> [pixels][c_out] (c_out >= c), elements of
// `elem_size` bytes.
Status launch_pad_channels(const void* x, void* y, int64_t pixels, int64_t c, int64_t c_out,
                           size_t elem_size, const Launch& l);

// The widest access (16, 8, 4, 2 or 1 bytes) dividing every value given (byte offsets,
// pitches and addresses).
size_t access_width(std::initializer_list<uint64_t> values);

// Runs f(U{}) with U the unsigned unit of `width` bytes (access_width()'s answer): copy, pad and
// permutation kernels move elements as the widest unit the layout allows.
template <typename F>
Status with_unit(size_t width, F&& f) {
  switch (width) {
    case 16:
      return f(uint4{});
    case 8:
      return f(uint2{});
    case 4:
      return f(uint32_t{});
    case 2:
      return f(uint16_t{});
    default:
      return f(uint8_t{});
  }
}

}  // namespace latent::cuda
