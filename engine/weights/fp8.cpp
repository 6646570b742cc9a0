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
