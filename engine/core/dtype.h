// Element types and host-side conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/core/status.h"

namespace latent {

enum class DType : uint8_t { kF32, kBF16, kF16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "fp32", "bf16", "fp16"
// Accepts fp32/float32/f32/F32, bf16/bfloat16/BF16, fp16/float16/f16/F16.
Result<DType> parse_dtype(const std::string& s);

float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float v);  // round to nearest even; NaN stays NaN
float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float v);   // round to nearest even; overflow to inf

// Converts n elements; src and dst may be the same dtype (plain copy). Must not overlap.
void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

enum class DeviceKind : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  bool is_cpu() const { return kind == DeviceKind::kCPU; }
  std::string to_string() const;  // "cpu", "cuda:0"
};

// "cpu", "cuda" (= cuda:0), "cuda:N". ("auto" is resolved by the caller, see backends/registry.h.)
Result<Device> parse_device(const std::string& s);

}  // namespace latent
