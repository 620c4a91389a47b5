// ubep-kernel-timing: the per-row kernels in isolation (in cache, one thread), to explain where
// small calls spend their time, and a decode combine's reduction out of cache. Usage:
// ubep-kernel-timing [hidden=7168] [iters=20000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/reduce_bf16.hpp"
#include "backend/cpu/row_kernels.hpp"
#include "bench/or_reduce.hpp"
#include "core/fp8_blocks.hpp"
#include "ubep/bf16.hpp"
#include "ubep/fp8.hpp"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

using namespace ubep;
using Clock = std::chrono::steady_clock;

#if defined(__x86_64__)
// The same 64-byte non-temporal stores as copy_row_to_peer, without its fence after every row:
// with one fence per call, to measure what the per-row fence costs a dispatch.
__attribute__((target("avx512f"))) void stream_rows(char* dst, const char* src, size_t bytes) {
  for (size_t i = 0; i + 64 <= bytes; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
}
#endif

template <typename F>
double time_us(int iters, F&& f) {
  for (int i = 0; i < iters / 10 + 1; ++i) f();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) f();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
}

// A decode combine's reduction out of cache: 128 tokens x 8 weighted rows placed at random in a
// window of 2 x 128 x 8 rows, 8 such windows used in turn (117 MB: more than the L3), one thread.
// Times the library's reduction with and without the next token's rows as a prefetch hint, and
// a plain OR over the same rows, interleaved; prints the median over the calls.
void combine_out_of_cache(int64_t hidden, int calls) {
  constexpr int kTokens = 128, kTopk = 8, kWindows = 8;
  const size_t slots = 2 * kTokens * kTopk, row = static_cast<size_t>(hidden);
  std::vector<uint16_t> pool(kWindows * slots * row);
  std::mt19937 rng(1);
  for (auto& v : pool) v = float_to_bf16(static_cast<float>(rng() % 2001) / 997.0f - 1.0f);
  std::vector<int> slot(slots);
  for (size_t i = 0; i < slots; ++i) slot[i] = static_cast<int>(i);
  std::shuffle(slot.begin(), slot.end(), rng);
  std::vector<float> w(kTokens * kTopk);
  for (auto& x : w) x = static_cast<float>(rng() % 1000) / 1000.0f;
  std::vector<uint16_t> out(kTokens * row), ref(kTokens * row);
  auto rows_of = [&](int win, int t, const void** p) {
    for (int k = 0; k < kTopk; ++k)
      p[k] = &pool[(static_cast<size_t>(win) * slots + static_cast<size_t>(slot[t * kTopk + k])) *
                   row];
  };
  auto call = [&](int win, int variant) {
    const void* p[kTopk];
    const void* next[kTopk];
    for (int t = 0; t < kTokens; ++t) {
      rows_of(win, t, p);
      uint16_t* o = &out[static_cast<size_t>(t) * row];
      if (variant == 0) {  // the bench's or-reduce bound (tools/bench/or_reduce.hpp), plain
        tools::or_reduce(reinterpret_cast<char*>(o), reinterpret_cast<const char* const*>(p), kTopk,
                         row * sizeof(uint16_t), tools::OrReduce{}, nullptr, 0);
        continue;
      }
      const bool hint = variant == 2 && t + 1 < kTokens;
      if (hint) rows_of(win, t + 1, next);
      kernels::reduce_rows(o, DType::kBF16, hidden, p, &w[static_cast<size_t>(t) * kTopk], kTopk,
                           false, hint ? next : nullptr, hint ? kTopk : 0);
    }
  };
  call(0, 1);
  ref = out;
  call(1 % kWindows, 2);
  call(0, 2);
  if (out != ref) std::printf("combine out of cache: the hinted reduction DIFFERS (a bug)\n");
  std::vector<double> t[3];
  int win = 0;
  for (int c = 0; c < calls; ++c)
    for (int v = 0; v < 3; ++v) {
      const auto t0 = Clock::now();
      call(win = (win + 1) % kWindows, v);
      t[v].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
  const char* names[3] = {"or of the same rows (no arithmetic)", "reduce_rows, no next-rows hint",
                          "reduce_rows, next token's rows hinted"};
  std::printf("combine out of cache: %d tokens x %d weighted rows, %d calls each, median us\n",
              kTokens, kTopk, calls);
  for (int v = 0; v < 3; ++v) {
    std::sort(t[v].begin(), t[v].end());
    std::printf("%-44s %10.1f\n", names[v], t[v][t[v].size() / 2]);
  }
}

// The fp8 codec's kernels on a decode call's worth of rows (128 x hidden, bf16 in, fp32 out).
void fp8_levels(int64_t hidden, int iters) {
  const int64_t rows = 128;
  std::vector<uint16_t> x(static_cast<size_t>(rows * hidden));
  std::mt19937 rng(3);
  for (auto& v : x) v = float_to_bf16(static_cast<float>(rng() % 2001) / 100.0f - 10.0f);
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(static_cast<size_t>(rows * fp8_scales_per_row(hidden))), y(x.size());
  const char* names[3] = {"portable", "AVX2", "AVX-512F"};
  for (int level = 0; level <= fp8_blocks::best_level(); ++level) {
    char name[64];
    std::snprintf(name, sizeof name, "fp8 quantize 128 bf16 rows: %s", names[level]);
    std::printf("%-44s %10.2f\n", name, time_us(iters, [&] {
                  fp8_blocks::quantize_rows(x.data(), true, rows, hidden, false, codes.data(),
                                            scales.data(), level);
                }));
    std::snprintf(name, sizeof name, "fp8 dequantize 128 rows: %s", names[level]);
    std::printf("%-44s %10.2f\n", name, time_us(iters, [&] {
                  fp8_blocks::dequantize_rows(codes.data(), scales.data(), rows, hidden, y.data(),
                                              level);
                }));
  }
}

// An fp8-cast dispatch quantizes its rows as a call finds them: not in cache (the caller's x was
// last read a call earlier, with a dispatch's, an expert's and a combine's traffic since). 128
// rows of bf16 and their codes in as many copies, used in turn, as take 64 MiB (more than an L3
// of 32 MiB), one thread, the median over the calls, beside the same in cache (the line above).
void fp8_quantize_out_of_cache(int64_t hidden, int calls) {
  const int64_t rows = 128;
  const size_t n = static_cast<size_t>(rows * hidden);
  const int kCopies = static_cast<int>((size_t{64} << 20) / (3 * n) + 2);
  std::vector<uint16_t> x(kCopies * n);
  std::mt19937 rng(5);
  for (auto& v : x) v = float_to_bf16(static_cast<float>(rng() % 2001) / 100.0f - 10.0f);
  std::vector<uint8_t> codes(kCopies * n);
  std::vector<float> scales(static_cast<size_t>(rows * fp8_scales_per_row(hidden)));
  std::vector<double> t;
  for (int c = 0; c < calls + kCopies; ++c) {
    const size_t at = static_cast<size_t>(c % kCopies) * n;
    const auto t0 = Clock::now();
    fp8_blocks::quantize_rows(&x[at], true, rows, hidden, false, &codes[at], scales.data(),
                              fp8_blocks::best_level());
    if (c >= kCopies)
      t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  std::printf("%-44s %10.2f\n", "fp8 quantize 128 bf16 rows, out of cache", t[t.size() / 2]);
}

int main(int argc, char** argv) {
  const int64_t hidden = argc > 1 ? std::atoll(argv[1]) : 7168;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 20000;
  const size_t row = static_cast<size_t>(hidden) * 2;
  std::vector<uint16_t> rows(static_cast<size_t>(8 * hidden)), out(static_cast<size_t>(hidden));
  for (size_t i = 0; i < rows.size(); ++i)
    rows[i] = float_to_bf16(0.5f + static_cast<float>(i % 97) / 97.0f);
  std::printf("ubep-kernel-timing: bf16 rows of hidden %lld, in cache, one thread, %d iterations\n",
              static_cast<long long>(hidden), iters);
  std::printf("%-44s %10s\n", "kernel", "us/call");
  for (int n : {1, 2, 4, 8}) {
    const void* p[8];
    float w[8];
    for (int i = 0; i < n; ++i) {
      p[i] = &rows[static_cast<size_t>(i * hidden)];
      w[i] = 0.125f * static_cast<float>(i + 1);
    }
    char name[64];
    std::snprintf(name, sizeof name, "reduce_rows, %d weighted rows", n);
    std::printf("%-44s %10.2f\n", name, time_us(iters, [&] {
                  kernels::reduce_rows(out.data(), DType::kBF16, hidden, p, w, n);
                }));
  }
  {
    // The 8-row reduction of combine by each kernel, interleaved so load affects all alike, and
    // beside them the combine bound's loop (an OR of the same rows, no arithmetic): their
    // difference is what the reduction's arithmetic costs on this CPU with the rows in cache
    // (a tiny combine's 8 rows; with hidden 1024 they fit L1).
    const void* p[8];
    float w[8];
    for (int i = 0; i < 8; ++i) {
      p[i] = &rows[static_cast<size_t>(i * hidden)];
      w[i] = 0.125f * static_cast<float>(i + 1);
    }
    double t[4] = {0, 0, 0, 0}, t_or = 0;
    for (int round = 0; round < 5; ++round) {
      t[0] += time_us(iters / 5, [&] {
        kernels::reduce_rows_portable(out.data(), DType::kBF16, hidden, p, w, 8);
      });
      for (int level = 1; level <= kernels::reduce_bf16_level(); ++level)
        t[level] += time_us(
            iters / 5, [&] { kernels::reduce_bf16_vector(out.data(), hidden, p, w, 8, level); });
      t_or += time_us(iters / 5, [&] {
        tools::or_reduce(reinterpret_cast<char*>(out.data()),
                         reinterpret_cast<const char* const*>(p), 8, row, tools::OrReduce{},
                         nullptr, 0);
      });
    }
    const char* names[4] = {"reduce 8 weighted rows: portable", "reduce 8 weighted rows: AVX2",
                            "reduce 8 weighted rows: AVX-512F",
                            "reduce 8 weighted rows: AVX-512 + BF16"};
    for (int level = 0; level <= kernels::reduce_bf16_level(); ++level)
      std::printf("%-44s %10.2f\n", names[level], t[level] / 5);
    std::printf("%-44s %10.2f\n", "or of the same 8 rows (the bound's loop)", t_or / 5);
  }
  std::vector<char> dst(8 * row + 64);
  char* d = dst.data() + (64 - reinterpret_cast<uintptr_t>(dst.data()) % 64) % 64;
  std::printf("%-44s %10.2f\n", "memcpy of 8 rows",
              time_us(iters, [&] { std::memcpy(d, rows.data(), 8 * row); }));
  std::printf("%-44s %10.2f\n", "copy_row_to_peer (non-temporal) of 8 rows", time_us(iters, [&] {
                for (int i = 0; i < 8; ++i)
                  kernels::copy_row_to_peer(d + i * row, &rows[static_cast<size_t>(i * hidden)],
                                            row);
              }));
  fp8_levels(hidden, std::max(20, iters / 200));
  fp8_quantize_out_of_cache(hidden, std::max(20, iters / 200));
  combine_out_of_cache(hidden, std::max(10, iters / 500));
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) {
    // A decode dispatch's worth of rows (1024, out of cache: two 14.7 MB halves alternately).
    const size_t n = 1024, span = n * row;
    std::vector<char> win(2 * span + 64);
    char* w = win.data() + (64 - reinterpret_cast<uintptr_t>(win.data()) % 64) % 64;
    int half = 0;
    const int it = std::max(4, iters / 1000);
    std::printf("%-44s %10.2f\n", "copy_row_to_peer, 1024 rows (fence per row)", time_us(it, [&] {
                  char* d0 = w + span * static_cast<size_t>(half ^= 1);
                  for (size_t i = 0; i < n; ++i)
                    kernels::copy_row_to_peer(d0 + i * row,
                                              &rows[(i % 8) * static_cast<size_t>(hidden)], row);
                }));
    for (size_t batch : {4, 16, 64}) {
      char name[64];
      std::snprintf(name, sizeof name, "same stores, 1024 rows, fence per %zu rows", batch);
      std::printf(
          "%-44s %10.2f\n", name, time_us(it, [&] {
            char* d0 = w + span * static_cast<size_t>(half ^= 1);
            for (size_t i = 0; i < n; ++i) {
              stream_rows(
                  d0 + i * row,
                  reinterpret_cast<const char*>(&rows[(i % 8) * static_cast<size_t>(hidden)]), row);
              if (i % batch == batch - 1) _mm_sfence();
            }
            _mm_sfence();
          }));
    }
    std::printf("%-44s %10.2f\n", "same stores, 1024 rows, one fence", time_us(it, [&] {
                  char* d0 = w + span * static_cast<size_t>(half ^= 1);
                  for (size_t i = 0; i < n; ++i)
                    stream_rows(
                        d0 + i * row,
                        reinterpret_cast<const char*>(&rows[(i % 8) * static_cast<size_t>(hidden)]),
                        row);
                  _mm_sfence();
                }));
  }
#endif
  return 0;
}
