#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
using Clock = std::chrono::steady_clock;
static inline uint16_t f2b(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  if ((b & 0x7fffffff) > 0x7f800000) return (b >> 16) | 0x40;
  return (b + 0x7fff + ((b >> 16) & 1)) >> 16;
}
static inline float b2f(uint16_t x) {
  uint32_t b = uint32_t(x) << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}
__attribute__((target("avx2"))) inline __m256i pack(__m256 even, __m256 odd) {
  const __m256i e = _mm256_castps_si256(even), o = _mm256_castps_si256(odd);
  const __m256i hi = _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xAA);
  const __m256i lo = _mm256_blend_epi16(e, _mm256_slli_epi32(o, 16), 0xAA);
  const __m256i rest = _mm256_subs_epu16(lo, _mm256_andnot_si256(hi, _mm256_set1_epi16(1)));
  return _mm256_sub_epi16(hi, _mm256_cmpgt_epi16(_mm256_setzero_si256(), rest));
}
#define PF(p)                                           \
  do {                                                  \
    _mm_prefetch((const char*)(p), _MM_HINT_T1);        \
    _mm_prefetch((const char*)((p) + 32), _MM_HINT_T1); \
  } while (0)
template <int V>
__attribute__((target("avx2"), noinline)) void red(uint16_t* out, int64_t hidden,
                                                   const uint16_t* const* v, const float* w,
                                                   int n) {
  int64_t h = 0;
  const __m256i m = _mm256_set1_epi32(-65536);
  for (; h + 64 <= hidden; h += 64) {
    __m256 e0 = _mm256_setzero_ps(), o0 = e0, e1 = e0, o1 = e0, e2 = e0, o2 = e0, e3 = e0, o3 = e0;
    for (int r = 0; r < n; ++r) {
      const __m256 wr = _mm256_set1_ps(w[r]);
      const uint16_t* p = v[r] + h;
      if ((V == 0 || V == 3) && h + 512 < hidden) PF(p + 512);
#define ADD(E, O, q)                                                                            \
  {                                                                                             \
    if ((V == 2 || V == 3) && (q)-2 >= v[r]) {                                                  \
      __m256 a = _mm256_and_ps(_mm256_castsi256_ps(m), _mm256_loadu_ps((const float*)((q)-1))); \
      __m256 b = _mm256_and_ps(_mm256_castsi256_ps(m), _mm256_loadu_ps((const float*)(q)));     \
      E = _mm256_add_ps(E, _mm256_mul_ps(wr, a));                                               \
      O = _mm256_add_ps(O, _mm256_mul_ps(wr, b));                                               \
    } else {                                                                                    \
      const __m256i x = _mm256_loadu_si256((const __m256i*)(q));                                \
      __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));                                 \
      __m256 b = _mm256_castsi256_ps(_mm256_and_si256(x, m));                                   \
      E = _mm256_add_ps(E, _mm256_mul_ps(wr, a));                                               \
      O = _mm256_add_ps(O, _mm256_mul_ps(wr, b));                                               \
    }                                                                                           \
  }
      ADD(e0, o0, p) ADD(e1, o1, p + 16) ADD(e2, o2, p + 32) ADD(e3, o3, p + 48)
    }
    _mm256_storeu_si256((__m256i*)(out + h), pack(e0, o0));
    _mm256_storeu_si256((__m256i*)(out + h + 16), pack(e1, o1));
    _mm256_storeu_si256((__m256i*)(out + h + 32), pack(e2, o2));
    _mm256_storeu_si256((__m256i*)(out + h + 48), pack(e3, o3));
  }
}
// V3: 32 elements per step, 4 accumulators, rows in pairs
template <int V>
__attribute__((target("avx2"), noinline)) void red128(uint16_t* out, int64_t hidden,
                                                      const uint16_t* const* v, const float* w,
                                                      int n) {
  const __m256i m = _mm256_set1_epi32(-65536);
  for (int64_t h = 0; h + 128 <= hidden; h += 128) {
    __m256 e[8], o[8];
    for (int i = 0; i < 8; ++i) {
      e[i] = _mm256_setzero_ps();
      o[i] = e[i];
    }
    for (int r = 0; r < n; ++r) {
      const __m256 wr = _mm256_set1_ps(w[r]);
      const uint16_t* p = v[r] + h;
      for (int i = 0; i < 8; ++i) {
        const __m256i x = _mm256_loadu_si256((const __m256i*)(p + 16 * i));
        e[i] =
            _mm256_add_ps(e[i], _mm256_mul_ps(wr, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16))));
        o[i] = _mm256_add_ps(o[i], _mm256_mul_ps(wr, _mm256_castsi256_ps(_mm256_and_si256(x, m))));
      }
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_si256((__m256i*)(out + h + 16 * i), pack(e[i], o[i]));
  }
}
// OR bound
__attribute__((target("avx2"), noinline)) void orr(uint16_t* out, int64_t hidden,
                                                   const uint16_t* const* v, const float*, int n) {
  for (int64_t h = 0; h + 64 <= hidden; h += 64) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int r = 0; r < n; ++r) {
      const uint16_t* p = v[r] + h;
      a0 = _mm256_or_si256(a0, _mm256_loadu_si256((const __m256i*)p));
      a1 = _mm256_or_si256(a1, _mm256_loadu_si256((const __m256i*)(p + 16)));
      a2 = _mm256_or_si256(a2, _mm256_loadu_si256((const __m256i*)(p + 32)));
      a3 = _mm256_or_si256(a3, _mm256_loadu_si256((const __m256i*)(p + 48)));
    }
    _mm256_storeu_si256((__m256i*)(out + h), a0);
    _mm256_storeu_si256((__m256i*)(out + h + 16), a1);
    _mm256_storeu_si256((__m256i*)(out + h + 32), a2);
    _mm256_storeu_si256((__m256i*)(out + h + 48), a3);
  }
}
typedef void (*K)(uint16_t*, int64_t, const uint16_t* const*, const float*, int);
int main(int argc, char** argv) {
  int64_t hidden = argc > 1 ? atoll(argv[1]) : 7168;
  int iters = argc > 2 ? atoi(argv[2]) : 5000;
  std::vector<uint16_t> rows(8 * hidden + 64), out(hidden), ref(hidden);
  for (size_t i = 0; i < rows.size(); ++i)
    rows[i] = f2b(0.5f + float(i % 97) / 97.f - (i % 5 == 0 ? 1.3f : 0.f));
  const uint16_t* p[8];
  float w[8];
  for (int i = 0; i < 8; ++i) {
    p[i] = &rows[32 + i * hidden];
    w[i] = 0.125f * (i + 1) - 0.3f;
  }
  for (int64_t h = 0; h < hidden; ++h) {
    float a = 0;
    for (int r = 0; r < 8; ++r) a += w[r] * b2f(p[r][h]);
    ref[h] = f2b(a);
  }
  K ks[] = {red<0>, red<1>, red<2>, red<3>, orr};
  const char* nm[] = {"current(pf)", "nopf", "and-widen", "and-widen+pf", "or"};
  const int NK = 5;
  std::vector<double> t[NK];
  for (int round = 0; round < 7; ++round)
    for (int k = 0; k < NK; ++k) {
      for (int i = 0; i < iters / 10; ++i) ks[k](out.data(), hidden, p, w, 8);
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) ks[k](out.data(), hidden, p, w, 8);
      t[k].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
      if (k < 4 && memcmp(out.data(), ref.data(), hidden * 2)) printf("MISMATCH %s\n", nm[k]);
    }
  for (int k = 0; k < NK; ++k) {
    std::sort(t[k].begin(), t[k].end());
    printf("%-14s %.3f us (min %.3f)\n", nm[k], t[k][3], t[k][0]);
  }
}
