// scratch: is the AVX2 8-row weighted reduction bound by L2 loads or by the FP pipes?
// The library kernel on 8 rows of 1024 (16 KiB, in L1) x7 against 8 rows of 7168 (112 KiB, L2),
// interleaved call by call; medians of per-batch times, per 7168 elements.
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#include "backend/cpu/row_kernels.hpp"
#include "ubep/bf16.hpp"
using namespace ubep;
using Clock = std::chrono::steady_clock;
__attribute__((target("avx2"))) void or8(uint16_t* out, const uint16_t* const* v, int64_t hidden) {
  for (int64_t h = 0; h < hidden; h += 64) {
    __m256i a[4] = {};
    for (int r = 0; r < 8; ++r)
      for (int q = 0; q < 4; ++q)
        a[q] = _mm256_or_si256(
            a[q], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v[r] + h + 16 * q)));
    for (int q = 0; q < 4; ++q)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + h + 16 * q), a[q]);
  }
}
int main() {
  std::vector<uint16_t> big(8 * 7168 + 64), small(8 * 1024 + 64), out(7168 + 64);
  for (size_t i = 0; i < big.size(); ++i) big[i] = float_to_bf16(0.5f + (i % 97) / 97.0f);
  for (size_t i = 0; i < small.size(); ++i) small[i] = float_to_bf16(0.5f + (i % 89) / 89.0f);
  const void* pb[8];
  const void* ps[8];
  const uint16_t* ob[8];
  float w[8];
  for (int r = 0; r < 8; ++r) {
    pb[r] = &big[r * 7168];
    ps[r] = &small[r * 1024];
    ob[r] = &big[r * 7168];
    w[r] = 0.125f * (r + 1);
  }
  std::vector<double> tl2, tl1, tor;
  const int reps = 50;
  for (int round = 0; round < 400; ++round) {
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) kernels::reduce_rows(out.data(), DType::kBF16, 7168, pb, w, 8);
    auto t1 = Clock::now();
    for (int i = 0; i < reps; ++i)
      for (int k = 0; k < 7; ++k)
        kernels::reduce_rows(out.data() + 1024 * (k & 1), DType::kBF16, 1024, ps, w, 8);
    auto t2 = Clock::now();
    for (int i = 0; i < reps; ++i) or8(out.data(), ob, 7168);
    auto t3 = Clock::now();
    tl2.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / reps);
    tl1.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count() / reps);
    tor.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count() / reps);
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto q = [](std::vector<double> v, double f) {
    std::sort(v.begin(), v.end());
    return v[size_t(f * (v.size() - 1))];
  };
  std::printf(
      "us per 8 x 7168 elements: L2 rows (8 x 14 KiB) median %.2f [p10 %.2f]; L1 rows (8 x 2 KiB, "
      "x7) median %.2f [p10 %.2f]; OR of the L2 rows median %.2f [p10 %.2f]\n",
      med(tl2), q(tl2, .1), med(tl1), q(tl1, .1), med(tor), q(tor, .1));
}
