// AVX2 kernels of the fp8 codec, 8 values per step, for CPUs without AVX-512F (AMD before Zen 4,
// most client CPUs, and VMs that hide AVX-512): the same formulas as fp8_avx512.cpp, lane by
// lane, so every code, scale and decoded value has the scalar functions' bits
// (tests/test_fp8.cpp checks every level this CPU has on every code, every bf16 pattern and
// random rows). AVX2 has no unsigned compares: every compared magnitude is below 2^31 (the sign
// is masked off first), so the signed compares order them alike.
#include "core/fp8_blocks.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include <climits>
#include <cstring>

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

// float_to_e4m3's normal branch on magnitudes (sign cleared): drop 20 mantissa bits with
// round-to-nearest-even, rebias the exponent; the code in the low byte, meaningful for
// magnitudes in [2^-6, 464].
__attribute__((target("avx2"))) inline __m256i normal_code(__m256i mag) {
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(mag, 20), _mm256_set1_epi32(1));
  return _mm256_sub_epi32(
      _mm256_srli_epi32(_mm256_add_epi32(mag, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), odd)),
                        20),
      _mm256_set1_epi32(120 << 3));
}

// float_to_e4m3 on 8 lanes (same integer and float steps, same order); the codes in the low
// byte of each lane.
__attribute__((target("avx2"))) inline __m256i encode(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i normal = normal_code(mag);
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

// float_to_e4m3's normal branch only, for lanes with 2^-6 <= |v| <= 464, where its other
// branches give the same code (codes 0x08..0x7e, and the sign; see outside_normal). The magnitudes'
// running minimum and maximum over a group go to lo and hi (signed compares order them: every
// magnitude is below 2^31), so one test per group finds a lane outside that range (outside_normal),
// two operations per vector instead of a range test's five.
__attribute__((target("avx2"))) inline __m256i encode_normal(__m256 v, __m256i& lo, __m256i& hi) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  lo = _mm256_min_epi32(lo, mag);
  hi = _mm256_max_epi32(hi, mag);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  return _mm256_or_si256(normal_code(mag), sign);
}

// Whether a magnitude in [lo, hi] (per lane) lies outside [2^-6, 464]: NaN and Inf are above.
// The normal branch also gives float_to_e4m3's saturated 0x7e from 448 up to 464 (1.1101b x 2^8
// rounds down to 1.110b x 2^8, the tie at 464 to the even 448), so a block's largest value, which
// its scale maps to 448 or a rounding step off it, stays on the short path: with 448 as the
// bound, up to one group in four (the one holding the block's amax, when that came out at 448 or
// above) took the full encoding, and 128 rows of 7168 took 530-630 us against 356-422 now (Zen 3
// VM, docs/PERFORMANCE.md).
__attribute__((target("avx2"))) inline bool outside_normal(__m256i lo, __m256i hi) {
  const __m256i out =
      _mm256_or_si256(below(lo, 0x3c800000), _mm256_cmpgt_epi32(hi, _mm256_set1_epi32(0x43e80000)));
  return !_mm256_testz_si256(out, out);
}

// Four vectors of codes (each 0..0xff in the low byte of its lanes) to 32 bytes in order: the
// saturating packs are exact on 0..0xff, and leave the 4-byte chunks interleaved by 128-bit lane,
// which one cross-lane permute puts back.
constexpr int kGroup = 4;
static_assert(kSteps % kGroup == 0);
__attribute__((target("avx2"))) inline void store_group(uint8_t* dst, const __m256i* c) {
  const __m256i bytes =
      _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(dst),
      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

}  // namespace

__attribute__((target("avx2"))) float block_amax_avx2(const void* src, bool bf16) {
  // amax over the finite magnitudes, from 0 (the scalar loop's start). Magnitudes compare as
  // integers in float order, and max is exact, so the order does not matter; NaN and Inf fail
  // the finite test and count as 0. bf16 is scanned as 16-bit patterns, 16 per vector: the
  // widening to fp32 is exact and keeps the order.
  float amax;
  if (bf16) {
    __m256i m = _mm256_setzero_si256();
    for (int s = 0; s < kSteps / 2; ++s) {
      const __m256i h = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                             static_cast<const uint16_t*>(src) + s * 2 * kLanes)),
                                         _mm256_set1_epi16(0x7fff));
      m = _mm256_max_epu16(m,
                           _mm256_and_si256(h, _mm256_cmpgt_epi16(_mm256_set1_epi16(0x7f80), h)));
    }
    __m128i h = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu16(h, _mm_srli_si128(h, 8));
    h = _mm_max_epu16(h, _mm_srli_si128(h, 4));
    h = _mm_max_epu16(h, _mm_srli_si128(h, 2));
    const uint32_t top = static_cast<uint32_t>(_mm_extract_epi16(h, 0)) << 16;
    std::memcpy(&amax, &top, sizeof amax);
  } else {
    __m256i m = _mm256_setzero_si256();
    for (int s = 0; s < kSteps; ++s) {
      const __m256i a = _mm256_and_si256(_mm256_castps_si256(load_values(src, false, s)),
                                         _mm256_set1_epi32(0x7fffffff));
      m = _mm256_max_epi32(m, _mm256_and_si256(a, below(a, 0x7f800000)));
    }
    __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epi32(h, _mm_srli_si128(h, 8));
    h = _mm_max_epi32(h, _mm_srli_si128(h, 4));
    amax = _mm_cvtss_f32(_mm_castsi128_ps(h));
  }
  return amax;
}

__attribute__((target("avx2"))) void encode_block_avx2(const void* src, bool bf16, float inv_scale,
                                                       uint8_t* codes) {
  const __m256 inv = _mm256_set1_ps(inv_scale);
  for (int g = 0; g < kSteps; g += kGroup) {
    __m256 v[kGroup];
    __m256i c[kGroup];
    __m256i lo = _mm256_set1_epi32(INT32_MAX), hi = _mm256_setzero_si256();
    for (int s = 0; s < kGroup; ++s) {
      v[s] = _mm256_mul_ps(load_values(src, bf16, g + s), inv);
      c[s] = encode_normal(v[s], lo, hi);
    }
    // A lane outside the normal range (zero, subnormal, saturating, NaN): the whole group again
    // with every branch of float_to_e4m3. Rare in activations, so the branch predicts well.
    if (outside_normal(lo, hi))
      for (int s = 0; s < kGroup; ++s) c[s] = encode(v[s]);
    store_group(codes + g * kLanes, c);
  }
}

__attribute__((target("avx2"))) float quantize_block_avx2(const void* src, bool bf16, bool pow2,
                                                          uint8_t* codes) {
  const float scale = fp8_block_scale(block_amax_avx2(src, bf16), pow2);
  encode_block_avx2(src, bf16, 1.0f / scale, codes);
  return scale;
}

// The largest and smallest bf16 magnitude of a block, as bit patterns (which order
// magnitudes as their values do): one pass of three operations per 16 values, from which
// quantize_rows takes the block's amax when every value is finite, and whether every value lies,
// scaled, in float_to_e4m3's normal range (encode_block_bf16_normal_avx2's condition).
__attribute__((target("avx2"))) void block_range_bf16_avx2(const uint16_t* src, uint16_t* max,
                                                           uint16_t* min) {
  __m256i hi = _mm256_setzero_si256(), lo = _mm256_set1_epi16(0x7fff);
  for (int s = 0; s < kSteps / 2; ++s) {
    const __m256i h =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + s * 2 * kLanes)),
                         _mm256_set1_epi16(0x7fff));
    hi = _mm256_max_epu16(hi, h);
    lo = _mm256_min_epu16(lo, h);
  }
  // PHMINPOSUW finds the minimum of 8 words; the maximum is the complement of the complements'.
  const __m128i ones = _mm_set1_epi16(-1);
  const __m128i h = _mm_max_epu16(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
  const __m128i l = _mm_min_epu16(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
  *max = static_cast<uint16_t>(~_mm_extract_epi16(_mm_minpos_epu16(_mm_xor_si128(h, ones)), 0));
  *min = static_cast<uint16_t>(_mm_extract_epi16(_mm_minpos_epu16(l), 0));
}

namespace {
// 16 bf16 magnitudes (a) times inv to codes, each 32-bit lane holding its two elements' codes in
// order in its low 16 bits: lane j holds elements 2j (low half) and 2j + 1 (high half), so a
// shift widens the even ones and a mask the odd ones, and no unpack is needed.
__attribute__((target("avx2"))) inline __m256i pair_codes(__m256i a, __m256 inv) {
  const __m256 even = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), inv);
  const __m256 odd =
      _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(a, _mm256_set1_epi32(-65536))), inv);
  return _mm256_or_si256(normal_code(_mm256_castps_si256(even)),
                         _mm256_slli_epi32(normal_code(_mm256_castps_si256(odd)), 8));
}
}  // namespace

// A bf16 block whose every value v has 2^-6 <= |v * inv_scale| <= 464 (quantize_rows checks it
// from block_range_bf16_avx2): the normal branch alone, on magnitudes, 32 values a step. The
// signs are the bf16 sign bits (a positive scale keeps them), packed beside the codes in the
// same lane order; one permute puts the four 8-byte runs in place. Same operations on each
// value as float_to_e4m3 (the product, then the integer rounding), so the same codes.
__attribute__((target("avx2"))) void encode_block_bf16_normal_avx2(const uint16_t* src,
                                                                   float inv_scale,
                                                                   uint8_t* codes) {
  const __m256 inv = _mm256_set1_ps(inv_scale);
  const __m256i magnitude = _mm256_set1_epi16(0x7fff);
  for (int g = 0; g < static_cast<int>(kFp8BlockSize); g += 32) {
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + g));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + g + 16));
    const __m256i c0 = pair_codes(_mm256_and_si256(x0, magnitude), inv);
    const __m256i c1 = pair_codes(_mm256_and_si256(x1, magnitude), inv);
    const __m256i signs =
        _mm256_and_si256(_mm256_packus_epi16(_mm256_srli_epi16(x0, 8), _mm256_srli_epi16(x1, 8)),
                         _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i bytes = _mm256_or_si256(_mm256_packus_epi32(c0, c1), signs);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + g),
                        _mm256_permute4x64_epi64(bytes, 0xd8));
  }
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
