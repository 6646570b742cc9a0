// FP8 weights as checkpoints store them (safetensors F8_E4M3 / F8_E5M2), decoded exactly to
// fp32 at load. The engine computes in fp32 / bf16 / fp16; an FP8 tensor is a storage format
// only, like the file's byte order.
//
// e4m3 is PyTorch's float8_e4m3fn (OCP "E4M3"): exponent bias 7, no infinities, S.1111.111 is
// NaN, largest finite 448, smallest subnormal 2^-9. e5m2 is float8_e5m2: bias 15, IEEE-like
// infinities and NaNs, largest finite 57344, smallest subnormal 2^-16. Every value of both is
// exact in fp32 (and in bf16 and fp16).
#pragma once

#include <cstddef>
#include <cstdint>

namespace latent {

enum class Fp8Format : uint8_t { kNone, kE4M3, kE5M2 };

const char* fp8_format_name(Fp8Format f);  // "fp8_e4m3", "fp8_e5m2", "" for kNone
// The safetensors dtype string, "F8_E4M3" / "F8_E5M2".
const char* fp8_safetensors_name(Fp8Format f);

float fp8_e4m3_to_f32(uint8_t v);
float fp8_e5m2_to_f32(uint8_t v);

// fp32 -> e4m3, round to nearest even, saturating: |v| > 448 (and +-inf) gives +-448, NaN gives
// NaN (0x7f | sign). What CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3) returns.
uint8_t fp8_e4m3_from_f32(float v);

// One row of n values quantised to e4m3 with its own scale (ditdenoise dtype=fp8: weight rows,
// activation rows): scale = max|v| / 448 (1 for an all-zero row), q[i] = e4m3(v[i] / scale), so
// v[i] ~= q[i] * scale. Returns the scale. NaN / inf values make the scale non-finite.
float fp8_e4m3_quantize_row(const float* v, size_t n, uint8_t* q);

// n FP8 values -> fp32, through a 256-entry table.
void fp8_decode(Fp8Format f, const uint8_t* in, float* out, size_t n);

}  // namespace latent
