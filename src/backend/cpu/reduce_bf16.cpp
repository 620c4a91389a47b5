// Hand-vectorised bf16 reduction (AVX-512F, AVX2; chosen at run time), the hot loop of combine.
//
// Bit-identical to the portable kernel in row_kernels.cpp: per element the same fp32 operations
// in the same order, a = ((0 + w0*r0) + w1*r1) + ..., one multiply and one add per row (no FMA),
// then the same round-to-nearest-even to bf16 with NaNs kept quiet. What changes is only how
// the bf16 values are widened: a 64-byte load holds 32 bf16; shifting each 32-bit lane left by
// 16 gives the even elements as fp32 and masking off the low half gives the odd ones, so no
// unpack is needed, and the two rounded halves are packed back with one shift and one mask (the
// AVX2 kernel packs first and rounds the packed halves: see pack_avx2; and past a row's first
// step it takes the even elements from a masked load one element earlier: see add_16).
// The portable kernel widens with a zero-extension per 8 elements (about twice the operations).
#include "backend/cpu/reduce_bf16.hpp"

#include <cstring>

#include "ubep/bf16.hpp"

#if defined(__x86_64__)
// GCC 12's AVX-512 shift intrinsics start from _mm512_undefined_epi32(), which -Wall reports as
// "may be used uninitialized" once the loop also prefetches (GCC bug 105593); nothing is.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define UBEP_VECTOR_REDUCE 1
#endif

namespace ubep::kernels {

namespace {

// The tail (fewer elements than a vector): the portable formula, element by element.
void reduce_tail(uint16_t* out, int64_t from, int64_t hidden, const uint16_t* const* v,
                 const float* w, int n) {
  for (int64_t h = from; h < hidden; ++h) {
    float a = 0.0f;
    for (int r = 0; r < n; ++r) a += w ? w[r] * bf16_to_float(v[r][h]) : bf16_to_float(v[r][h]);
    out[h] = float_to_bf16(a);
  }
}

#ifdef UBEP_VECTOR_REDUCE
// Software prefetch into L2, `ahead` elements ahead in every row, continued into the rows of the
// next call (`next`: the caller's next token) during the last `ahead` elements of this one. A
// combine reads 8 rows per token from memory (the experts wrote them moments ago, more than a
// core's cache holds) and spends about as long on the arithmetic as on the loads; the hint
// starts each line's fetch early enough that a step's loads find it in L2. Without the
// continuation every token began on 8 cold rows. Measured on the Zen 4 VM with AVX2, one core,
// 128 tokens x 8 weighted rows of 7168 out of cache, the same runs alternated (ubep-kernel-timing
// and a copy of the old kernel; docs/PERFORMANCE.md): the kernel before this (2 KiB ahead, within
// the token) 1010-1075 us; 512 B ahead, within the token 950-1000; the same continued into the
// next token 840-850; a plain OR over the same rows 805-845. The next token's prefetches must be
// issued as the current stream ends, interleaved with the loads: all at a step's start they gave
// 910-950, and all before the token's reduction no gain at all. Into L2 (prefetcht1), not L1: T0
// prefetches took L1 miss buffers the demand loads need (20-25% slower than none, decode, 2
// process ranks). The distance shrinks with the number of rows so that about 4 KiB are in flight
// in all: 512 B per row at 8 rows (256 B-1.5 KiB measured alike at 8 rows).
inline int64_t prefetch_distance(int n) {
  const int64_t per_row = n > 0 ? 2048 / n : 1024;  // elements (2 bytes)
  return per_row < 256 ? 256 : per_row > 1024 ? 1024 : per_row / 64 * 64;
}
inline void prefetch_128(const uint16_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(p + 32), _MM_HINT_T1);
}
// Where a step's prefetches go: row r's line pair at rows[r] + offset for r < n (128 bytes
// `ahead` elements on: this token's rows, or the next token's once this one's end is near).
struct PrefetchStep {
  const uint16_t* const* rows;
  int64_t offset;
  int n;
};
// next_n < 0: no prefetch at all (rows the hardware prefetchers follow).
inline PrefetchStep prefetch_step(const uint16_t* const* v, int n, const uint16_t* const* next,
                                  int next_n, int64_t h, int64_t ahead, int64_t hidden) {
  if (next_n < 0) return {v, 0, 0};
  const int64_t at = h + ahead;
  if (at < hidden) return {v, at, n};
  if (at - hidden < hidden) return {next, at - hidden, next_n};
  return {v, 0, 0};
}
// float_to_bf16 on 16 lanes, result in the high half of each lane: NaN -> bits | 0x400000
// (quiet), else bits + 0x7fff + ((bits >> 16) & 1).
__attribute__((target("avx512f"))) inline __m512i round_hi_avx512(__m512 a) {
  const __m512i bits = _mm512_castps_si512(a);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  return _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x400000));
}

__attribute__((target("avx512f"))) inline __m512i pack_avx512(__m512 even, __m512 odd) {
  return _mm512_or_si512(_mm512_srli_epi32(round_hi_avx512(even), 16),
                         _mm512_and_si512(round_hi_avx512(odd), _mm512_set1_epi32(-65536)));
}

// The same packing in two instructions where the CPU converts to bf16 itself (AVX512_BF16:
// Zen 4, Sapphire Rapids): VCVTNE2PS2BF16 rounds to nearest even and quiets NaNs exactly as
// float_to_bf16, except that it flushes denormal inputs to zero (checked over all 2^32 fp32
// inputs on the Zen 4 VM: the 16,711,678 that differ are all denormals), so a step whose sums
// hold a denormal takes the exact integer packing instead. The conversion puts the even lanes'
// 16 results in the low half and the odd lanes' in the high half; VPERMW interleaves them. A
// prefill combine (2 rows per token) spent two thirds of its instructions in pack_avx512.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16"))) inline __m512i pack_native(
    __m512 even, __m512 odd) {
  if (_mm512_fpclass_ps_mask(even, 0x20) | _mm512_fpclass_ps_mask(odd, 0x20))  // 0x20: denormal
    return pack_avx512(even, odd);
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

// Stores 64 bytes at out (64-byte aligned when stream): non-temporal stores skip the
// read-for-ownership of output lines that nobody reads soon (large outputs).
__attribute__((target("avx512f"))) inline void store_avx512(uint16_t* out, __m512i v, bool stream) {
  if (stream)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(out), v);
  else
    _mm512_storeu_si512(out, v);
}

// The AVX-512 kernel, compiled twice: with the integer packing for every AVX-512 CPU, and with
// the CPU's own conversion where it has AVX512_BF16. Two copies and not one template, because a
// function's target features are fixed: one copy allowed to use AVX512_BF16 could not be run on
// a CPU without it (Skylake, Ice Lake), whatever its code path.
#define UBEP_AVX512_TARGET "avx512f"
#define UBEP_AVX512_PACK pack_avx512
#define UBEP_AVX512_KERNEL reduce_avx512
#include "backend/cpu/reduce_bf16_avx512.inl"
#define UBEP_AVX512_TARGET "avx512f,avx512bw,avx512dq,avx512bf16"
#define UBEP_AVX512_PACK pack_native
#define UBEP_AVX512_KERNEL reduce_avx512_bf16
#include "backend/cpu/reduce_bf16_avx512.inl"

// float_to_bf16 on 8 lanes, result in the high half of each lane, NaNs included: the exact
// path, for calls whose sums may hold a NaN that the short packing below would round wrongly.
__attribute__((target("avx2"))) inline __m256i round_hi_avx2(__m256 a) {
  const __m256i bits = _mm256_castps_si256(a);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));  // one FP compare
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(bits, _mm256_set1_epi32(0x400000)), nan);
}

// Even lanes' results to the low half, odd lanes' kept in the high half: the output's order.
__attribute__((target("avx2"))) inline __m256i pack_avx2_nan(__m256 even, __m256 odd) {
  return _mm256_blend_epi16(_mm256_srli_epi32(round_hi_avx2(even), 16), round_hi_avx2(odd), 0xAA);
}

// float_to_bf16 of 16 sums in 8 integer operations (16 in pack_avx2_nan, 17 in the packing
// before, where the combine's few-row reductions spent most of their time on Zen 1), rounding
// after packing: the high halves (hi, the truncated bf16) and the low halves (lo) each packed
// into one vector, then hi + 1 where lo + (hi & 1) > 0x8000, the carry of float_to_bf16's
// bits + 0x7fff + (hi & 1). That test is lo - (1 - (hi & 1)) >= 0x8000, subtracting with
// unsigned saturation so that 0 - 1 stays 0. Bit-identical to float_to_bf16 for every number
// (Inf, ties and the carry into the exponent included; checked over all 2^32 inputs) and for a
// NaN that is quiet and has a zero low half, which it returns unchanged, as float_to_bf16 does;
// it would round any other NaN. No sum here holds another unless a weight is one: x86's adds and
// multiplies return one operand's NaN, quieted, or the default NaN 0xffc00000, and the operands
// are widened bf16 (low half zero), the sums themselves and the weights. Calls with a NaN weight
// therefore take pack_avx2_nan, and no step needs a NaN test.
__attribute__((target("avx2"))) inline __m256i pack_avx2(__m256 even, __m256 odd) {
  const __m256i e = _mm256_castps_si256(even), o = _mm256_castps_si256(odd);
  const __m256i hi = _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xAA);
  const __m256i lo = _mm256_blend_epi16(e, _mm256_slli_epi32(o, 16), 0xAA);
  const __m256i rest = _mm256_subs_epu16(lo, _mm256_andnot_si256(hi, _mm256_set1_epi16(1)));
  return _mm256_sub_epi16(hi, _mm256_cmpgt_epi16(_mm256_setzero_si256(), rest));  // -1: carry
}

template <bool NanWeights>
__attribute__((target("avx2"))) inline __m256i pack_avx2_for(__m256 even, __m256 odd) {
  if constexpr (NanWeights)
    return pack_avx2_nan(even, odd);
  else
    return pack_avx2(even, odd);
}

__attribute__((target("avx2"))) inline void store_avx2(uint16_t* out, __m256i v, bool stream) {
  if (stream)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), v);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), v);
}

// acc_even/acc_odd += w * (the 16 bf16 at p, widened): one row's share of a 16-element group.
// FromBefore: the even elements come from a second load one element earlier, masked (its 32-bit
// lane j holds p[2j - 1] low and p[2j] high, so the mask leaves p[2j] widened), instead of a
// shift of the first load: two loads folded into ANDs, which any vector pipe runs, instead of a
// load, a shift (fewer pipes, shared with the arithmetic) and an AND. 6-11% off an 8-row token
// in cache on the Zen 3 VM, nothing out of cache (docs/PERFORMANCE.md, twenty-sixth session);
// unmeasured on other AVX2-only CPUs. Reads p[-1], so only where that is inside the row (every
// step but a row's first).
template <bool Weighted, bool FromBefore = false>
__attribute__((target("avx2"))) inline void add_16(__m256& even, __m256& odd, const uint16_t* p,
                                                   __m256 wr) {
  const __m256 high = _mm256_castsi256_ps(_mm256_set1_epi32(-65536));
  __m256 a, b;
  if constexpr (FromBefore) {
    a = _mm256_and_ps(high, _mm256_loadu_ps(reinterpret_cast<const float*>(p - 1)));
    b = _mm256_and_ps(high, _mm256_loadu_ps(reinterpret_cast<const float*>(p)));
  } else {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    b = _mm256_and_ps(_mm256_castsi256_ps(x), high);
  }
  if constexpr (Weighted) {
    a = _mm256_mul_ps(wr, a);
    b = _mm256_mul_ps(wr, b);
  }
  even = _mm256_add_ps(even, a);
  odd = _mm256_add_ps(odd, b);
}

// 64 elements per step with eight accumulators: each accumulator's adds form a chain of n
// dependent 3-cycle adds, so one 16-element group per step (two chains, the kernel before)
// left the adders waiting on latency: 4.8 us per in-cache token of 8 rows against 3.5 now.
template <bool Weighted, bool NanWeights = false>
__attribute__((target("avx2"))) void reduce_avx2(uint16_t* out, int64_t hidden,
                                                 const uint16_t* const* v, const float* w, int n,
                                                 bool stream, const uint16_t* const* next,
                                                 int next_n) {
  const int64_t ahead = prefetch_distance(n);
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t h = 0;
  for (; h + 64 <= hidden; h += 64) {
    __m256 e0 = _mm256_setzero_ps(), o0 = e0, e1 = e0, o1 = e0, e2 = e0, o2 = e0, e3 = e0, o3 = e0;
    const PrefetchStep pf = prefetch_step(v, n, next, next_n, h, ahead, hidden);
    for (int r = n; r < pf.n; ++r) prefetch_128(pf.rows[r] + pf.offset);
    for (int r = 0; r < n; ++r) {
      // Interleaved with the loads: issued all at the step's start, the same prefetches left
      // the reduction 10-15% slower (912-954 against 796-802 us in the out-of-cache test).
      if (r < pf.n) prefetch_128(pf.rows[r] + pf.offset);
      const __m256 wr = Weighted ? _mm256_set1_ps(w[r]) : one;
      const uint16_t* p = v[r] + h;
      if (h == 0)
        add_16<Weighted>(e0, o0, p, wr);
      else
        add_16<Weighted, true>(e0, o0, p, wr);
      add_16<Weighted, true>(e1, o1, p + 16, wr);
      add_16<Weighted, true>(e2, o2, p + 32, wr);
      add_16<Weighted, true>(e3, o3, p + 48, wr);
    }
    store_avx2(out + h, pack_avx2_for<NanWeights>(e0, o0), stream);
    store_avx2(out + h + 16, pack_avx2_for<NanWeights>(e1, o1), stream);
    store_avx2(out + h + 32, pack_avx2_for<NanWeights>(e2, o2), stream);
    store_avx2(out + h + 48, pack_avx2_for<NanWeights>(e3, o3), stream);
  }
  for (; h + 16 <= hidden; h += 16) {
    __m256 e = _mm256_setzero_ps(), o = e;
    for (int r = 0; r < n; ++r)
      add_16<Weighted>(e, o, v[r] + h, Weighted ? _mm256_set1_ps(w[r]) : one);
    store_avx2(out + h, pack_avx2_for<NanWeights>(e, o), stream);
  }
  reduce_tail(out, h, hidden, v, Weighted ? w : nullptr, n);
}

// A bit test, not w != w, which -ffinite-math-only would fold away.
bool has_nan(const float* w, int n) {
  for (int r = 0; r < n; ++r) {
    uint32_t bits;
    std::memcpy(&bits, &w[r], sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return true;
  }
  return false;
}

const int kLevel = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512dq")
                       ? 3
                   : __builtin_cpu_supports("avx512f") ? 2
                   : __builtin_cpu_supports("avx2")    ? 1
                                                       : 0;
#endif

}  // namespace

int reduce_bf16_level() {
#ifdef UBEP_VECTOR_REDUCE
  return kLevel;
#else
  return 0;
#endif
}

bool reduce_bf16_vector(uint16_t* out, int64_t hidden, const void* const* rows,
                        const float* weights, int n, int level, bool stream, NextRows next,
                        bool prefetch) {
#ifdef UBEP_VECTOR_REDUCE
  if (level < 0) level = kLevel;
  level = level < kLevel ? level : kLevel;
  if (level == 0 || n > kMaxVectorRows) return false;
  const uint16_t* v[kMaxVectorRows];
  for (int r = 0; r < n; ++r) v[r] = static_cast<const uint16_t*>(rows[r]);
  const uint16_t* nv[kMaxVectorRows];
  // Rows the hardware prefetchers follow (prefetch false: a throughput layout's, contiguous in
  // token order) are still fetched ahead within the token at level 1, never into the next
  // token. The AVX-512 kernels, on the Zen 4 VM (bound harness, prefill), ran 2-5% slower with
  // the within-token prefetch than without; the AVX2 kernel, on the Zen 1 VM, once its rounding
  // had shrunk, 10% faster (the library's prefill combine, 3 alternated pairs: 1.122x -> 1.036x
  // the bound; docs/PERFORMANCE.md, ninth session). An AVX2-only Intel CPU is unmeasured.
  const int next_n = !prefetch                 ? (level == 1 ? 0 : -1)
                     : next.n < kMaxVectorRows ? next.n
                                               : kMaxVectorRows;
  for (int r = 0; r < next_n; ++r) nv[r] = static_cast<const uint16_t*>(next.rows[r]);
  stream = stream && reinterpret_cast<uintptr_t>(out) % 64 == 0;
  if (level == 3) {
    weights ? reduce_avx512_bf16<true>(out, hidden, v, weights, n, stream, nv, next_n)
            : reduce_avx512_bf16<false>(out, hidden, v, nullptr, n, stream, nv, next_n);
  } else if (level == 2) {
    weights ? reduce_avx512<true>(out, hidden, v, weights, n, stream, nv, next_n)
            : reduce_avx512<false>(out, hidden, v, nullptr, n, stream, nv, next_n);
  } else {
    if (!weights)
      reduce_avx2<false>(out, hidden, v, nullptr, n, stream, nv, next_n);
    else if (has_nan(weights, n))
      reduce_avx2<true, true>(out, hidden, v, weights, n, stream, nv, next_n);
    else
      reduce_avx2<true>(out, hidden, v, weights, n, stream, nv, next_n);
  }
  return true;
#else
  (void)out, (void)hidden, (void)rows, (void)weights, (void)n, (void)level, (void)stream;
  (void)next, (void)prefetch;
  return false;
#endif
}

}  // namespace ubep::kernels
