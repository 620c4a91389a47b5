// ubep-kernel-timing: the per-row kernels in isolation (in cache, one thread), to explain where
// small calls spend their time. Usage: ubep-kernel-timing [hidden=7168] [iters=20000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/reduce_bf16.hpp"
#include "backend/cpu/row_kernels.hpp"
#include "ubep/bf16.hpp"
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
    // The 8-row reduction of combine by each kernel, interleaved so load affects all alike.
    const void* p[8];
    float w[8];
    for (int i = 0; i < 8; ++i) {
      p[i] = &rows[static_cast<size_t>(i * hidden)];
      w[i] = 0.125f * static_cast<float>(i + 1);
    }
    double t[3] = {0, 0, 0};
    for (int round = 0; round < 5; ++round) {
      t[0] += time_us(iters / 5, [&] {
        kernels::reduce_rows_portable(out.data(), DType::kBF16, hidden, p, w, 8);
      });
      for (int level = 1; level <= kernels::reduce_bf16_level(); ++level)
        t[level] += time_us(
            iters / 5, [&] { kernels::reduce_bf16_vector(out.data(), hidden, p, w, 8, level); });
    }
    const char* names[3] = {"reduce 8 weighted rows: portable", "reduce 8 weighted rows: AVX2",
                            "reduce 8 weighted rows: AVX-512F"};
    for (int level = 0; level <= kernels::reduce_bf16_level(); ++level)
      std::printf("%-44s %10.2f\n", names[level], t[level] / 5);
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
