// The AVX-512 bf16 reduction's loop (reduce_bf16.cpp), included there once per packing of the
// fp32 sums back to bf16: UBEP_AVX512_TARGET is the function's target features,
// UBEP_AVX512_PACK the packing (a function of that file), UBEP_AVX512_KERNEL the name. No
// include guard: it is meant to be included more than once; each inclusion undefines the three.

template <bool Weighted>
__attribute__((target(UBEP_AVX512_TARGET))) void UBEP_AVX512_KERNEL(
    uint16_t* out, int64_t hidden, const uint16_t* const* v, const float* w, int n, bool stream,
    const uint16_t* const* next, int next_n) {
  const __m512i hi = _mm512_set1_epi32(-65536);  // 0xFFFF0000
  const int64_t ahead = prefetch_distance(n);
  int64_t h = 0;
  // 64 elements per step: four independent accumulators keep the add chains overlapped.
  for (; h + 64 <= hidden; h += 64) {
    __m512 e0 = _mm512_setzero_ps(), o0 = e0, e1 = e0, o1 = e0;
    const PrefetchStep pf = prefetch_step(v, n, next, next_n, h, ahead, hidden);
    for (int r = n; r < pf.n; ++r) prefetch_128(pf.rows[r] + pf.offset);
    for (int r = 0; r < n; ++r) {
      if (r < pf.n) prefetch_128(pf.rows[r] + pf.offset);  // interleaved with the loads
      const __m512i x0 = _mm512_loadu_si512(v[r] + h);
      const __m512i x1 = _mm512_loadu_si512(v[r] + h + 32);
      __m512 a0 = _mm512_castsi512_ps(_mm512_slli_epi32(x0, 16));
      __m512 b0 = _mm512_castsi512_ps(_mm512_and_si512(x0, hi));
      __m512 a1 = _mm512_castsi512_ps(_mm512_slli_epi32(x1, 16));
      __m512 b1 = _mm512_castsi512_ps(_mm512_and_si512(x1, hi));
      if constexpr (Weighted) {
        const __m512 wr = _mm512_set1_ps(w[r]);
        a0 = _mm512_mul_ps(wr, a0);
        b0 = _mm512_mul_ps(wr, b0);
        a1 = _mm512_mul_ps(wr, a1);
        b1 = _mm512_mul_ps(wr, b1);
      }
      e0 = _mm512_add_ps(e0, a0);
      o0 = _mm512_add_ps(o0, b0);
      e1 = _mm512_add_ps(e1, a1);
      o1 = _mm512_add_ps(o1, b1);
    }
    store_avx512(out + h, UBEP_AVX512_PACK(e0, o0), stream);
    store_avx512(out + h + 32, UBEP_AVX512_PACK(e1, o1), stream);
  }
  for (; h + 32 <= hidden; h += 32) {
    __m512 e = _mm512_setzero_ps(), o = e;
    for (int r = 0; r < n; ++r) {
      const __m512i x = _mm512_loadu_si512(v[r] + h);
      __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
      __m512 b = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
      if constexpr (Weighted) {
        const __m512 wr = _mm512_set1_ps(w[r]);
        a = _mm512_mul_ps(wr, a);
        b = _mm512_mul_ps(wr, b);
      }
      e = _mm512_add_ps(e, a);
      o = _mm512_add_ps(o, b);
    }
    store_avx512(out + h, UBEP_AVX512_PACK(e, o), stream);
  }
  reduce_tail(out, h, hidden, v, Weighted ? w : nullptr, n);
}

#undef UBEP_AVX512_TARGET
#undef UBEP_AVX512_PACK
#undef UBEP_AVX512_KERNEL
