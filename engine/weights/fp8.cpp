#include "engine/weights/fp8.h"

#include <array>
#include <cmath>
#include <limits>

namespace latent {

const char* fp8_format_name(Fp8Format f) {
  switch (f) {
    case Fp8Format::kE4M3:
      return "fp8_e4m3";
    case Fp8Format::kE5M2:
      return "fp8_e5m2";
    case Fp8Format::kNone:
      break;
  }
  return "";
}

const char* fp8_safetensors_name(Fp8Format f) {
  switch (f) {
    case Fp8Format::kE4M3:
      return "F8_E4M3";
    case Fp8Format::kE5M2:
      return "F8_E5M2";
    case Fp8Format::kNone:
      break;
  }
  return "";
}

float fp8_e4m3_to_f32(uint8_t v) {
  const bool negative = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  float f;
  if (exp == 0xf && mant == 0x7)
    f = std::numeric_limits<float>::quiet_NaN();  // the only NaN; e4m3fn has no infinity
  else if (exp == 0)
    f = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 x 2^(1-7)
  else
    f = std::ldexp(static_cast<float>(8 + mant), exp - 7 - 3);
  return negative ? -f : f;
}

float fp8_e5m2_to_f32(uint8_t v) {
  const bool negative = v & 0x80;
  const int exp = (v >> 2) & 0x1f;
  const int mant = v & 0x3;
  float f;
  if (exp == 0x1f)
    f = mant == 0 ? std::numeric_limits<float>::infinity()
                  : std::numeric_limits<float>::quiet_NaN();
  else if (exp == 0)
    f = std::ldexp(static_cast<float>(mant), -16);  // subnormal: mant/4 x 2^(1-15)
  else
    f = std::ldexp(static_cast<float>(4 + mant), exp - 15 - 2);
  return negative ? -f : f;
}

uint8_t fp8_e4m3_from_f32(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isnan(v)) return sign | 0x7f;
  const float a = std::fabs(v);
  if (!(a < 448.f)) return sign | 0x7e;  // saturate (448 itself is 0x7e)
  // nearbyint rounds half to even in the default rounding mode.
  if (a < 0x1p-6f) {  // subnormal: steps of 2^-9; 8 steps is the smallest normal, code 0x08
    return sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9f));
  }
  int e = 0;
  std::frexp(a, &e);  // a = f x 2^e, f in [0.5, 1): the unbiased exponent is e - 1
  int exp = e - 1;    // -6 .. 8
  int mant = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exp)));  // 8 .. 16
  if (mant == 16) {
    mant = 8;
    ++exp;
  }
  if (exp > 8 || (exp == 8 && mant > 14)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | (mant - 8));
}

float fp8_e4m3_quantize_row(const float* v, size_t n, uint8_t* q) {
  float amax = 0.f;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(v[i]);
    amax = std::fmax(amax, std::fabs(v[i]));
  }
  const float scale = !finite        ? std::numeric_limits<float>::quiet_NaN()
                      : amax == 0.f ? 1.f
                                    : amax / 448.f;
  for (size_t i = 0; i < n; ++i) q[i] = fp8_e4m3_from_f32(v[i] / scale);
  return scale;
}

namespace {

template <float (*decode)(uint8_t)>
const std::array<float, 256>& table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> out{};
    for (int i = 0; i < 256; ++i) out[i] = decode(static_cast<uint8_t>(i));
    return out;
  }();
  return t;
}

}  // namespace

void fp8_decode(Fp8Format f, const uint8_t* in, float* out, size_t n) {
  const float* t =
      f == Fp8Format::kE5M2 ? table<fp8_e5m2_to_f32>().data() : table<fp8_e4m3_to_f32>().data();
  for (size_t i = 0; i < n; ++i) out[i] = t[in[i]];
}

}  // namespace latent
