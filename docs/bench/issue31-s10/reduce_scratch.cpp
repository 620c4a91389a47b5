// Scratch: the AVX2 8-row weighted bf16 reduction's inner loop (as reduce_avx2: 64 elements per
// step, 8 accumulators), mul+add against fma, in cache; plus the same with the widening only
// (no arithmetic) to split the cost. Pack/round/store identical in all (a plain truncating pack).
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
constexpr int H = 7168;
template <int Mode, int PF = 0, int Hint = 0>
__attribute__((target("avx2,fma"), always_inline)) inline void add16(__m256& e, __m256& o,
                                                                     const uint16_t* p, __m256 wr) {
  const __m256i x = _mm256_loadu_si256((const __m256i*)p);
  __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  __m256 b = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(-65536)));
  if (Mode == 0) {
    e = _mm256_add_ps(e, _mm256_mul_ps(wr, a));
    o = _mm256_add_ps(o, _mm256_mul_ps(wr, b));
  }
  if (Mode == 1) {
    e = _mm256_fmadd_ps(wr, a, e);
    o = _mm256_fmadd_ps(wr, b, o);
  }
  if (Mode == 2) {
    e = _mm256_add_ps(e, a);
    o = _mm256_add_ps(o, b);
  }
}
static bool g_exact = getenv("EXACT") != nullptr;
__attribute__((target("avx2"), always_inline)) inline void st(uint16_t* out, __m256 even,
                                                              __m256 odd) {
  const __m256i e = _mm256_castps_si256(even), o = _mm256_castps_si256(odd);
  const __m256i hi = _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xAA);
  if (!g_exact) {
    _mm256_storeu_si256((__m256i*)out, hi);
    return;
  }
  const __m256i lo = _mm256_blend_epi16(e, _mm256_slli_epi32(o, 16), 0xAA);
  const __m256i rest = _mm256_subs_epu16(lo, _mm256_andnot_si256(hi, _mm256_set1_epi16(1)));
  _mm256_storeu_si256((__m256i*)out,
                      _mm256_sub_epi16(hi, _mm256_cmpgt_epi16(_mm256_setzero_si256(), rest)));
}
template <int Mode, int PF = 0, int Hint = 0>
__attribute__((target("avx2,fma"), noinline)) void red(uint16_t* out, const uint16_t* const* v,
                                                       const float* w, int n) {
  for (int h = 0; h < H; h += 64) {
    __m256 e0 = _mm256_setzero_ps(), o0 = e0, e1 = e0, o1 = e0, e2 = e0, o2 = e0, e3 = e0, o3 = e0;
    for (int r = 0; r < n; ++r) {
      const __m256 wr = _mm256_set1_ps(w[r]);
      const uint16_t* p = v[r] + h;
      if (PF) {
        const char* q = (const char*)(p + PF);
        if (Hint == 0) {
          _mm_prefetch(q, _MM_HINT_T0);
          _mm_prefetch(q + 64, _MM_HINT_T0);
        } else {
          _mm_prefetch(q, _MM_HINT_T1);
          _mm_prefetch(q + 64, _MM_HINT_T1);
        }
      }
      add16<Mode>(e0, o0, p, wr);
      add16<Mode>(e1, o1, p + 16, wr);
      add16<Mode>(e2, o2, p + 32, wr);
      add16<Mode>(e3, o3, p + 48, wr);
    }
    st(out + h, e0, o0);
    st(out + h + 16, e1, o1);
    st(out + h + 32, e2, o2);
    st(out + h + 48, e3, o3);
  }
}
template <int Mode, int PF = 0, int Hint = 0>
double time_us(uint16_t* out, const uint16_t* const* v, const float* w, int n, int iters) {
  std::vector<double> t;
  for (int rep = 0; rep < 7; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      red<Mode, PF, Hint>(out, v, w, n);
      asm volatile("" ::: "memory");
    }
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        iters);
  }
  std::sort(t.begin(), t.end());
  return t[3];
}
int main() {
  const int OUT_OFF = getenv("OUT_OFF") ? atoi(getenv("OUT_OFF")) : 0;
  const uint16_t* v[8];
  for (int r = 0; r < 8; ++r) {
    uint16_t* p = (uint16_t*)aligned_alloc(4096, 16384);
    for (int i = 0; i < H; ++i) p[i] = 0x3f80 + ((i * 7 + r) & 0x7f);
    v[r] = p;
  }
  float w[8] = {0.1f, 0.2f, 0.3f, 0.05f, 0.15f, 0.07f, 0.08f, 0.05f};
  uint16_t* outp = (uint16_t*)aligned_alloc(4096, 32768) + OUT_OFF / 2;
  struct {
    uint16_t* p;
    uint16_t* data() { return p; }
  } out{outp};
  for (int n : {1, 2, 8}) {
    double m = time_us<0>(out.data(), v, w, n, 5000), f = time_us<1>(out.data(), v, w, n, 5000),
           a = time_us<2>(out.data(), v, w, n, 5000);
    printf(
        "%d rows: mul+add %.2f us  fma %.2f us  widen+add only %.2f us | mul+add T0@64 %.2f T0@128 "
        "%.2f T0@256 %.2f T0@512 %.2f T1@512 %.2f\n",
        n, m, f, a, time_us<0, 64, 0>(out.data(), v, w, n, 5000),
        time_us<0, 128, 0>(out.data(), v, w, n, 5000),
        time_us<0, 256, 0>(out.data(), v, w, n, 5000),
        time_us<0, 512, 0>(out.data(), v, w, n, 5000),
        time_us<0, 512, 1>(out.data(), v, w, n, 5000));
  }
}
