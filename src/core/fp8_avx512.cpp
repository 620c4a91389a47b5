// AVX-512F kernels of the fp8 codec, 16 values per step: the formulas of float_to_e4m3,
// e4m3_to_float and quantize_block (ubep/fp8.hpp, fp8.cpp) lane by lane, so every code, scale
// and decoded value has the scalar functions' bits (tests/test_fp8.cpp checks this on every
// code, every bf16 pattern and random blocks).
#include "core/fp8_blocks.hpp"

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports the _mm512_undefined_* start values inside the intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include "ubep/fp8.hpp"

namespace ubep::fp8_blocks {
namespace {

constexpr int kLanes = 16;
constexpr int kSteps = static_cast<int>(kFp8BlockSize) / kLanes;
static_assert(kFp8BlockSize % kLanes == 0);

__attribute__((target("avx512f"))) inline __m512 load_values(const void* src, bool bf16, int s) {
  if (bf16) {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(src) + s * kLanes));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_loadu_ps(static_cast<const float*>(src) + s * kLanes);
}

// float_to_e4m3 on 16 lanes (same integer and float steps, same order).
__attribute__((target("avx512f"))) inline __m128i encode(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
  const __m512i mag = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(mag, 20), _mm512_set1_epi32(1));
  const __m512i normal = _mm512_sub_epi32(
      _mm512_srli_epi32(_mm512_add_epi32(mag, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff), odd)),
                        20),
      _mm512_set1_epi32(120 << 3));
  // min(f, 2^-6) picks 2^-6 for NaN, as `f < 2^-6 ? f : 2^-6` does (minps returns the second
  // operand unless the first is smaller).
  const __m512 clamped = _mm512_min_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(0.015625f));
  const __m512 big = _mm512_set1_ps(8388608.0f);
  const __m512i sub = _mm512_cvttps_epi32(
      _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(512.0f)), big), big));
  __m512i code = _mm512_mask_blend_epi32(
      _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x3c800000)), normal, sub);
  code = _mm512_mask_blend_epi32(_mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x43e00000)), code,
                                 _mm512_set1_epi32(0x7e));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
  code = _mm512_mask_blend_epi32(nan, _mm512_or_si512(code, sign), _mm512_set1_epi32(kFp8NaN));
  return _mm512_cvtepi32_epi8(code);
}

}  // namespace

__attribute__((target("avx512f"))) float quantize_block_avx512(const void* src, bool bf16,
                                                               bool pow2, uint8_t* codes) {
  __m512 v[kSteps];
  // amax over the finite magnitudes, from 0 (the scalar loop's start): max is exact, so the
  // order of the lanes does not matter; NaN and Inf fail `<= FLT_MAX` and are skipped.
  __m512 amax = _mm512_setzero_ps();
  const __m512 finite_max = _mm512_set1_ps(3.402823466e38f);
  for (int s = 0; s < kSteps; ++s) {
    v[s] = load_values(src, bf16, s);
    const __m512 a = _mm512_abs_ps(v[s]);
    amax = _mm512_mask_max_ps(amax, _mm512_cmp_ps_mask(a, finite_max, _CMP_LE_OQ), amax, a);
  }
  const float scale = fp8_block_scale(_mm512_reduce_max_ps(amax), pow2);
  const __m512 inv = _mm512_set1_ps(1.0f / scale);
  for (int s = 0; s < kSteps; ++s)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + s * kLanes),
                     encode(_mm512_mul_ps(v[s], inv)));
  return scale;
}

__attribute__((target("avx512f"))) void dequantize_block_avx512(const uint8_t* codes, float scale,
                                                                float* out) {
  const __m512 s = _mm512_set1_ps(scale);
  for (int i = 0; i < kSteps; ++i) {
    const __m512i q =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i * kLanes)));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(q, _mm512_set1_epi32(0x80)), 24);
    const __m512i low = _mm512_and_si512(q, _mm512_set1_epi32(0x7f));  // exponent, mantissa
    // Normal codes: ((exp + 120) << 23) | (man << 20) == (low << 20) + (120 << 23).
    __m512i mag = _mm512_add_epi32(_mm512_slli_epi32(low, 20), _mm512_set1_epi32(120 << 23));
    // Subnormal codes (exp 0): man * 2^-9, exact.
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(low), _mm512_set1_ps(1.0f / 512.0f));
    mag = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(low, _mm512_set1_epi32(8)), mag,
                                  _mm512_castps_si512(sub));
    mag = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(low, _mm512_set1_epi32(0x7f)), mag,
                                  _mm512_set1_epi32(0x7fc00000));
    const __m512 value = _mm512_castsi512_ps(_mm512_or_si512(mag, sign));
    _mm512_storeu_ps(out + i * kLanes, _mm512_mul_ps(value, s));
  }
}

}  // namespace ubep::fp8_blocks
#endif
