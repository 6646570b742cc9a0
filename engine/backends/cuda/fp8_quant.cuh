// Row-wise FP8 (e4m3) quantisation for dtype fp8's linear layers (backend.h, Fp8Matrix).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// x [rows, cols] row-major in `dtype` -> codes [rows, cols] (e4m3, one byte each) and scales
// [rows] (fp32): scale = max|x[r, :]| / 448 (1 for a zero row, NaN when the row holds a NaN or
// an infinity), code = e4m3(x / scale) rounded to nearest even with saturation. The same
// arithmetic as engine/weights/fp8.h's fp8_e4m3_quantize_row (IEEE division both), so the
// codes equal the host's.
Status launch_fp8_quantize_rows(const void* x, DType dtype, int64_t rows, int64_t cols,
                                uint8_t* codes, float* scales, const Launch& l);

}  // namespace latent::cuda
