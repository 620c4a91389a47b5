// Element arithmetic that the CUDA kernels and the CPU-side tests share (UBEP_HD): bf16
// conversions bit-identical to ubep::float_to_bf16 / bf16_to_float (include/ubep/bf16.hpp:
// round to nearest even, NaN kept quiet with bit 6 set), and the one step of the fixed-order
// combine sum, acc = acc + w*v, with a separate rounding after the product (no FMA).
//
// The host compiles these with -ffp-contract=off (top-level CMakeLists.txt); the device uses the
// explicitly rounded intrinsics, so nvcc's -fmad setting cannot change a bit either.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.hpp"

namespace ubep::cuda_hd {

UBEP_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
#endif
}

UBEP_HD inline float bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}

UBEP_HD inline float bf16_to_float(uint16_t v) {
  return bits_float(static_cast<uint32_t>(v) << 16);
}

// Same integer recipe as ubep::float_to_bf16, so host and device round identically by
// construction (not __float2bfloat16_rn, whose NaN payload is not specified to match).
UBEP_HD inline uint16_t float_to_bf16(float f) {
  uint32_t bits = float_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// One term of the fixed-order sum: ((0 + w0*r0) + w1*r1) + ...
UBEP_HD inline float add_term(float acc, float v) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(acc, v);
#else
  return acc + v;
#endif
}
UBEP_HD inline float add_weighted_term(float acc, float w, float v) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(acc, __fmul_rn(w, v));
#else
  const float prod = w * v;  // rounded on its own: -ffp-contract=off
  return acc + prod;
#endif
}

}  // namespace ubep::cuda_hd
