// AVX2 kernels of the fp8 codec, 8 values per step, for CPUs without AVX-512F (AMD before Zen 4,
// most client CPUs, and VMs that hide AVX-512): the same formulas as fp8_avx512.cpp, lane by
// lane, so every code, scale and decoded value has the scalar functions' bits
// (tests/test_fp8.cpp checks every level this CPU has on every code, every bf16 pattern and
// random rows). AVX2 has no unsigned compares: every compared magnitude is below 2^31 (the sign
// is masked off first), so the signed compares order them alike.
#include "core/fp8_blocks.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include "ubep/fp8.hpp"

namespace ubep::fp8_blocks {
namespace {

constexpr int kLanes = 8;
constexpr int kSteps = static_cast<int>(kFp8BlockSize) / kLanes;
static_assert(kFp8BlockSize % kLanes == 0);

__attribute__((target("avx2"))) inline __m256 load_values(const void* src, bool bf16, int s) {
  if (bf16) {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(src) + s * kLanes));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(src) + s * kLanes);
}

__attribute__((target("avx2"))) inline __m256i below(__m256i a, int32_t b) {  // a < b, a,b >= 0
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(b), a);
}

// float_to_e4m3 on 8 lanes (same integer and float steps, same order); the codes in the low
// byte of each lane.
__attribute__((target("avx2"))) inline __m256i encode(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(mag, 20), _mm256_set1_epi32(1));
  const __m256i normal = _mm256_sub_epi32(
      _mm256_srli_epi32(_mm256_add_epi32(mag, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), odd)),
                        20),
      _mm256_set1_epi32(120 << 3));
  // min(f, 2^-6) picks 2^-6 for NaN (minps returns the second operand unless the first is
  // smaller), as `f < 2^-6 ? f : 2^-6` does.
  const __m256 clamped = _mm256_min_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(0.015625f));
  const __m256 big = _mm256_set1_ps(8388608.0f);
  const __m256i sub = _mm256_cvttps_epi32(
      _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(512.0f)), big), big));
  __m256i code = _mm256_blendv_epi8(normal, sub, below(mag, 0x3c800000));
  code = _mm256_blendv_epi8(_mm256_set1_epi32(0x7e), code, below(mag, 0x43e00000));
  const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(_mm256_or_si256(code, sign), _mm256_set1_epi32(kFp8NaN), nan);
}

// The low byte of each of 8 lanes, in order, to 8 bytes at dst.
__attribute__((target("avx2"))) inline void store_codes(uint8_t* dst, __m256i code) {
  const __m256i pick =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i bytes = _mm256_shuffle_epi8(code, pick);  // 4 codes at the start of each half
  const __m128i both =
      _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), both);
}

}  // namespace

__attribute__((target("avx2"))) float quantize_block_avx2(const void* src, bool bf16, bool pow2,
                                                          uint8_t* codes) {
  __m256 v[kSteps];
  // amax over the finite magnitudes, from 0 (the scalar loop's start): max is exact, so the
  // order of the lanes does not matter; NaN and Inf fail `<= FLT_MAX` and count as 0.
  __m256 amax = _mm256_setzero_ps();
  const __m256 finite_max = _mm256_set1_ps(3.402823466e38f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int s = 0; s < kSteps; ++s) {
    v[s] = load_values(src, bf16, s);
    const __m256 a = _mm256_and_ps(v[s], abs_mask);
    amax = _mm256_max_ps(amax, _mm256_and_ps(a, _mm256_cmp_ps(a, finite_max, _CMP_LE_OQ)));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  const float scale = fp8_block_scale(_mm_cvtss_f32(m), pow2);
  const __m256 inv = _mm256_set1_ps(1.0f / scale);
  for (int s = 0; s < kSteps; ++s)
    store_codes(codes + s * kLanes, encode(_mm256_mul_ps(v[s], inv)));
  return scale;
}

__attribute__((target("avx2"))) void dequantize_block_avx2(const uint8_t* codes, float scale,
                                                           float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int i = 0; i < kSteps; ++i) {
    const __m256i q =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i * kLanes)));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(q, _mm256_set1_epi32(0x80)), 24);
    const __m256i low = _mm256_and_si256(q, _mm256_set1_epi32(0x7f));  // exponent, mantissa
    // Normal codes: ((exp + 120) << 23) | (man << 20) == (low << 20) + (120 << 23).
    __m256i mag = _mm256_add_epi32(_mm256_slli_epi32(low, 20), _mm256_set1_epi32(120 << 23));
    // Subnormal codes (exp 0): man * 2^-9, exact.
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(low), _mm256_set1_ps(1.0f / 512.0f));
    mag = _mm256_blendv_epi8(mag, _mm256_castps_si256(sub), below(low, 8));
    mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(0x7fc00000),
                             _mm256_cmpeq_epi32(low, _mm256_set1_epi32(0x7f)));
    const __m256 value = _mm256_castsi256_ps(_mm256_or_si256(mag, sign));
    _mm256_storeu_ps(out + i * kLanes, _mm256_mul_ps(value, s));
  }
}

}  // namespace ubep::fp8_blocks
#endif
