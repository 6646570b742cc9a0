#include "engine/core/dtype.h"

#include <cmath>
#include <cstring>

namespace latent {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

Result<DType> parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32" || s == "f32" || s == "F32") return DType::kF32;
  if (s == "bf16" || s == "bfloat16" || s == "BF16") return DType::kBF16;
  if (s == "fp16" || s == "float16" || s == "f16" || s == "F16") return DType::kF16;
  return Status::errorf("unknown dtype '", s, "' (expected fp32, bf16 or fp16)");
}

float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in fp16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(exp);  // value / 2^-24 = mant * 2^(exp - 126)
    uint32_t halfway = 1u << (shift - 1);
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t res = mant >> shift;
    if (rem > halfway || (rem == halfway && (res & 1u))) ++res;
    return static_cast<uint16_t>(sign | res);
  }
  uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  abs += rounding;
  return static_cast<uint16_t>(sign | (((abs >> 23) - 112) << 10) | ((abs >> 13) & 0x3ffu));
}

void convert_elements(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  auto load = [&](size_t i) -> float {
    switch (st) {
      case DType::kF32: return static_cast<const float*>(src)[i];
      case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    }
    return 0.f;
  };
  for (size_t i = 0; i < n; ++i) {
    float v = load(i);
    switch (dt) {
      case DType::kF32: static_cast<float*>(dst)[i] = v; break;
      case DType::kBF16: static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v); break;
      case DType::kF16: static_cast<uint16_t*>(dst)[i] = f32_to_f16(v); break;
    }
  }
}

std::string Device::to_string() const {
  if (kind == DeviceKind::kCPU) return "cpu";
  return str_cat("cuda:", index);
}

Result<Device> parse_device(const std::string& s) {
  if (s == "cpu") return Device{DeviceKind::kCPU, 0};
  if (s == "cuda" || s == "gpu") return Device{DeviceKind::kCUDA, 0};
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() < 9) {
    int idx = 0;
    for (size_t i = 5; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') return Status::errorf("invalid device '", s, "'");
      idx = idx * 10 + (s[i] - '0');
    }
    return Device{DeviceKind::kCUDA, idx};
  }
  return Status::errorf("invalid device '", s, "' (expected cpu, cuda or cuda:N)");
}

}  // namespace latent
