// bfloat16 <-> float conversions (round to nearest even, NaN kept quiet), the ones the library
// uses, so callers can prepare bf16 inputs and read bf16 outputs exactly as ubep does.
#pragma once

#include <cstdint>
#include <cstring>

#include "ubep/types.hpp"

namespace ubep {

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Element i of a bf16 or fp32 array, as float; and the converse (rounding to bf16).
inline float load_value(const void* base, int64_t i, DType dt) {
  const char* p = static_cast<const char*>(base);
  if (dt == DType::kBF16) {
    uint16_t v;
    std::memcpy(&v, p + i * 2, 2);
    return bf16_to_float(v);
  }
  float v;
  std::memcpy(&v, p + i * 4, 4);
  return v;
}

inline void store_value(void* base, int64_t i, float v, DType dt) {
  char* p = static_cast<char*>(base);
  if (dt == DType::kBF16) {
    const uint16_t b = float_to_bf16(v);
    std::memcpy(p + i * 2, &b, 2);
  } else {
    std::memcpy(p + i * 4, &v, 4);
  }
}

}  // namespace ubep
