// The combine bound's OR loops (or_reduce.hpp): AVX-512F (64-byte registers), AVX2 (32-byte) and
// an SSE2 fallback, chosen at run time like the library's reduction.
#include "or_reduce.hpp"

#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ubep::tools {

namespace {

constexpr size_t kPrefetchAhead = 2048;  // bytes, the fixed-distance variants

// The library's distance (reduce_bf16.cpp prefetch_distance), in bytes: 4 KiB over all rows.
size_t next_distance(int n) {
  const size_t per_row = n > 0 ? 4096 / static_cast<size_t>(n) : 2048;
  return per_row < 512 ? 512 : per_row > 2048 ? 2048 : per_row / 128 * 128;
}

void or_rows_scalar(char* out, const char* const* rows, int n, size_t from, size_t bytes) {
  size_t i = from;
#if defined(__SSE2__)
  for (; i + 16 <= bytes; i += 16) {
    __m128i acc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[0] + i));
    for (int r = 1; r < n; ++r)
      acc = _mm_or_si128(acc, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), acc);
  }
#endif
  for (; i < bytes; ++i) {
    char acc = rows[0][i];
    for (int r = 1; r < n; ++r) acc = static_cast<char>(acc | rows[r][i]);
    out[i] = acc;
  }
}

#if defined(__x86_64__)
const bool kAvx512 = __builtin_cpu_supports("avx512f");
const bool kAvx2 = __builtin_cpu_supports("avx2");

inline void prefetch_line(const char* p) { _mm_prefetch(p, _MM_HINT_T1); }

__attribute__((target("avx512f"))) void store64(char* out, __m512i v, bool stream) {
  if (stream)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(out), v);
  else
    _mm512_storeu_si512(out, v);
}

// One line of every row per step (64 bytes), or two (128) when two_lines.
__attribute__((target("avx512f"))) size_t or_avx512(char* out, const char* const* rows, int n,
                                                    size_t bytes, const OrReduce& how) {
  const size_t step = how.two_lines ? 128 : 64;
  size_t i = 0;
  for (; i + step <= bytes; i += step) {
    if (how.prefetch && i + kPrefetchAhead < bytes)
      for (int r = 0; r < n; ++r)
        for (size_t l = 0; l < step; l += 64) prefetch_line(rows[r] + i + kPrefetchAhead + l);
    for (size_t l = 0; l < step; l += 64) {
      __m512i acc = _mm512_loadu_si512(rows[0] + i + l);
      for (int r = 1; r < n; ++r) acc = _mm512_or_si512(acc, _mm512_loadu_si512(rows[r] + i + l));
      store64(out + i + l, acc, how.stream);
    }
  }
  return i;
}

__attribute__((target("avx2"))) void store32(char* out, __m256i v, bool stream) {
  if (stream)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), v);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), v);
}

__attribute__((target("avx2"))) size_t or_avx2(char* out, const char* const* rows, int n,
                                               size_t bytes, const OrReduce& how) {
  const size_t step = how.two_lines ? 128 : 64;
  size_t i = 0;
  for (; i + step <= bytes; i += step) {
    if (how.prefetch && i + kPrefetchAhead < bytes)
      for (int r = 0; r < n; ++r)
        for (size_t l = 0; l < step; l += 64) prefetch_line(rows[r] + i + kPrefetchAhead + l);
    for (size_t l = 0; l < step; l += 32) {
      __m256i acc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[0] + i + l));
      for (int r = 1; r < n; ++r)
        acc = _mm256_or_si256(
            acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + i + l)));
      store32(out + i + l, acc, how.stream);
    }
  }
  return i;
}

// The library's pattern: 128-byte steps, every row's prefetch interleaved with its loads, on
// into the next token's rows during the last `ahead` bytes.
__attribute__((target("avx2"))) size_t or_avx2_next(char* out, const char* const* rows, int n,
                                                    size_t bytes, bool stream,
                                                    const char* const* next, int next_n) {
  const size_t ahead = next_distance(n);
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    const size_t at = i + ahead;
    const char* const* pf = at < bytes ? rows : next;
    const int pf_n = at < bytes ? n : at - bytes < bytes ? next_n : 0;
    const size_t off = at < bytes ? at : at - bytes;
    for (int r = n; r < pf_n; ++r) prefetch_line(pf[r] + off), prefetch_line(pf[r] + off + 64);
    __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
    for (int r = 0; r < n; ++r) {
      if (r < pf_n) prefetch_line(pf[r] + off), prefetch_line(pf[r] + off + 64);
      for (int q = 0; q < 4; ++q)
        a[q] = _mm256_or_si256(
            a[q], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + i + 32 * q)));
    }
    for (int q = 0; q < 4; ++q) store32(out + i + 32 * q, a[q], stream);
  }
  return i;
}
#endif

}  // namespace

bool or_reduce_has_avx512() {
#if defined(__x86_64__)
  return kAvx512;
#else
  return false;
#endif
}

bool or_reduce_has_avx2() {
#if defined(__x86_64__)
  return kAvx2;
#else
  return false;
#endif
}

void or_reduce(char* out, const char* const* rows, int n, size_t bytes, const OrReduce& how,
               const char* const* next, int next_n) {
  size_t done = 0;
#if defined(__x86_64__)
  const bool stream_ok = !how.stream || reinterpret_cast<uintptr_t>(out) % 64 == 0;
  OrReduce h = how;
  h.stream = how.stream && stream_ok;
  if (how.next && kAvx2)
    done = or_avx2_next(out, rows, n, bytes, h.stream, next, next ? next_n : 0);
  else if (kAvx512)
    done = or_avx512(out, rows, n, bytes, h);
  else if (kAvx2)
    done = or_avx2(out, rows, n, bytes, h);
#else
  (void)how, (void)next, (void)next_n;
#endif
  or_rows_scalar(out, rows, n, done, bytes);
}

}  // namespace ubep::tools
