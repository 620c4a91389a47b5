// fp8 e4m3 with per-block fp32 scales: the codec ubep uses for fp8 dispatch (docs/SEMANTICS.md,
// "fp8 dispatch"), public so callers can quantize inputs and read outputs exactly as ubep does.
//
// Format: OCP e4m3 "fn" (bias 7, 3 mantissa bits, no infinities; 0x7F/0xFF are NaN; largest
// finite 448). Each row of `hidden` channels is cut into blocks of 128 channels (the last block
// may be shorter when hidden is not a multiple of 128); each block has one fp32 scale, the
// multiplier that dequantizes it: value ~= e4m3_to_float(q) * scale.
//   amax  = largest |x| over the block's finite values (NaN and Inf do not count)
//   scale = max(amax, 1e-4) / 448, rounded up to a power of two if requested (ue8m0-style)
//   q     = float_to_e4m3(x * (1 / scale))
// float_to_e4m3 rounds to nearest even, saturates every magnitude >= 448 (Inf included) to
// +-448, and turns NaN into 0x7F. The 1e-4 amax floor (DeepEP's) keeps an all-zero block from
// dividing by zero and bounds how small a scale can get.
#pragma once

#include <cstdint>
#include <cstring>

#include "ubep/types.hpp"

namespace ubep {

inline constexpr int64_t kFp8BlockSize = 128;  // channels per scale
inline constexpr float kFp8Max = 448.0f;       // largest finite e4m3 value
inline constexpr float kFp8AmaxFloor = 1e-4f;  // amax floor before dividing by kFp8Max
inline constexpr uint8_t kFp8NaN = 0x7F;

// Scales per row: ceil(hidden / 128).
inline constexpr int64_t fp8_scales_per_row(int64_t hidden) {
  return (hidden + kFp8BlockSize - 1) / kFp8BlockSize;
}

namespace fp8_detail {
inline uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
inline float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
}  // namespace fp8_detail

// Round to nearest even, saturating; written without branches so loops over it vectorize.
inline uint8_t float_to_e4m3(float v) {
  using namespace fp8_detail;
  const uint32_t bits = bits_of(v);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t mag = bits & 0x7fffffffu;
  // Normal range (>= 2^-6): drop 20 mantissa bits with round-to-nearest-even, then rebias the
  // exponent from 127 to 7 (a carry out of the mantissa correctly bumps the exponent).
  const uint32_t normal = ((mag + 0x7ffffu + ((mag >> 20) & 1u)) >> 20) - (120u << 3);
  // Subnormal range (< 2^-6): the code is round(|v| * 2^9), 0..8 (8 is the smallest normal);
  // adding and subtracting 2^23 rounds to an integer in the default nearest-even mode.
  const float f = fp8_detail::float_of(mag);
  const float clamped = f < 0.015625f ? f : 0.015625f;  // NaN picks the bound: no UB below
  const auto sub = static_cast<uint32_t>((clamped * 512.0f + 8388608.0f) - 8388608.0f);
  uint32_t code = mag < 0x3c800000u ? sub : normal;
  code = mag >= 0x43e00000u ? 0x7eu : code;             // >= 448, Inf included: saturate
  code = mag > 0x7f800000u ? uint32_t{kFp8NaN} : code;  // NaN (sign dropped)
  return static_cast<uint8_t>(code | (mag > 0x7f800000u ? 0u : sign));
}

inline float e4m3_to_float(uint8_t q) {
  using namespace fp8_detail;
  const uint32_t sign = static_cast<uint32_t>(q & 0x80u) << 24;
  const uint32_t exp = (q >> 3) & 0xfu, man = q & 7u;
  if (exp == 0xfu && man == 7u) return float_of(sign | 0x7fc00000u);
  if (exp == 0) return float_of(sign | bits_of(static_cast<float>(man) * (1.0f / 512.0f)));
  return float_of(sign | ((exp + 120u) << 23) | (man << 20));
}

// The scale of a block whose largest finite magnitude is `amax` (see the top of this file).
inline float fp8_block_scale(float amax, bool pow2) {
  using namespace fp8_detail;
  float scale = (amax > kFp8AmaxFloor ? amax : kFp8AmaxFloor) / kFp8Max;
  if (pow2) {  // round up to a power of two: clear the mantissa, carry into the exponent
    const uint32_t b = bits_of(scale);
    if (b & 0x7fffffu) scale = float_of((b & 0xff800000u) + 0x800000u);
  }
  return scale;
}

// Quantizes `rows` rows of `hidden` bf16 or fp32 values (src_dtype) into e4m3 codes
// [rows, hidden] and scales [rows, fp8_scales_per_row(hidden)]. Rows are independent, so the
// caller may split them over threads.
void fp8_quantize_rows(const void* src, DType src_dtype, int64_t rows, int64_t hidden, bool pow2,
                       uint8_t* codes, float* scales);
// codes * scale, as fp32 [rows, hidden].
void fp8_dequantize_rows(const uint8_t* codes, const float* scales, int64_t rows, int64_t hidden,
                         float* out);

}  // namespace ubep
