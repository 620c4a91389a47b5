// An fp8 e4m3 reference for the tests, written from the format's definition and sharing no code
// with src/core/fp8.cpp: a code's value from its fields, encoding by searching all codes for the
// nearest (ties to the even code), scales from frexp instead of bit tricks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ubep/bf16.hpp"

namespace ubep::test {

// Value of an e4m3 "fn" code: sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is
// NaN; exponent 0 is subnormal (m/8 * 2^-6).
inline double ref_e4m3_value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (code & 0x80) ? -mag : mag;
}

// Nearest finite code, ties to the even code; |x| >= 448 saturates; NaN -> 0x7F.
inline uint8_t ref_e4m3_encode(float x) {
  if (std::isnan(x)) return 0x7F;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return static_cast<uint8_t>(sign | 0x7E);
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(ref_e4m3_value(c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

// The documented scale: max(amax over finite values, 1e-4) / 448, optionally rounded up to a
// power of two.
inline float ref_fp8_scale(const float* v, int64_t n, bool pow2) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(v[i])) amax = std::max(amax, std::fabs(v[i]));
  float scale = std::max(amax, 1e-4f) / 448.0f;
  if (pow2) {
    int e = 0;
    const float m = std::frexp(scale, &e);  // scale = m * 2^e, m in [0.5, 1)
    scale = m == 0.5f ? scale : std::ldexp(1.0f, e);
  }
  return scale;
}

// One quantized matrix: codes [rows, hidden], scales [rows, ceil(hidden / 128)].
struct RefFp8 {
  int64_t rows = 0, hidden = 0, blocks = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

inline RefFp8 ref_fp8_quantize(const std::vector<float>& x, int64_t rows, int64_t hidden,
                               bool pow2) {
  RefFp8 q;
  q.rows = rows;
  q.hidden = hidden;
  q.blocks = (hidden + 127) / 128;
  q.codes.resize(static_cast<size_t>(rows * hidden));
  q.scales.resize(static_cast<size_t>(rows * q.blocks));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < q.blocks; ++b) {
      const int64_t begin = r * hidden + b * 128, n = std::min<int64_t>(128, hidden - b * 128);
      const float scale = ref_fp8_scale(&x[static_cast<size_t>(begin)], n, pow2);
      q.scales[static_cast<size_t>(r * q.blocks + b)] = scale;
      const float inv = 1.0f / scale;
      for (int64_t i = 0; i < n; ++i)
        q.codes[static_cast<size_t>(begin + i)] =
            ref_e4m3_encode(x[static_cast<size_t>(begin + i)] * inv);
    }
  return q;
}

inline std::vector<float> bf16_values(const std::vector<uint16_t>& x) {
  std::vector<float> v(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t bits = static_cast<uint32_t>(x[i]) << 16;
    std::memcpy(&v[i], &bits, 4);
  }
  return v;
}

}  // namespace ubep::test
