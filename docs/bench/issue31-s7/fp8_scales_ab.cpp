// Issue 31, seventh session: what an fp8 row's scales cost the sender. One thread (core 0)
// writes 1,024 decode rows (7,168-byte payload, 64-byte non-temporal stores; a fence per 16
// rows, as CpuDataPath holds its tags) into a window that another thread (core 1) has just
// read, as the receiver's expert does between calls. Alternated: the scales (224 bytes a row,
// in their own region) with plain stores after a prefetch of their lines (the library before),
// against whole lines streamed and plain stores only for a partial end line (after); then the
// payload alone. Build: g++ -O2 -std=c++20 fp8_scales_ab.cpp -lpthread
#include <immintrin.h>
#include <pthread.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
constexpr size_t P = 7168, S = 224, N = 1024;
static void pin(int c) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(c, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}
__attribute__((target("avx512f"))) static void st(char* d, const char* s, size_t n64) {
  for (size_t i = 0; i < n64; ++i)
    _mm512_stream_si512((__m512i*)d + i, _mm512_loadu_si512((const __m512i*)s + i));
}
static void part(char* d, const char* s, size_t b) {
  size_t h = (64 - ((uintptr_t)d & 63)) & 63;
  if (b < h + 64) {
    memcpy(d, s, b);
    return;
  }
  size_t n = (b - h) / 64, t = (b - h) % 64;
  if (h) memcpy(d, s, h);
  st(d + h, s + h, n);
  if (t) memcpy(d + h + n * 64, s + h + n * 64, t);
}
static void pf(const char* p, size_t b) {
  for (uintptr_t l = (uintptr_t)p & ~63ul; l < (uintptr_t)p + b; l += 64)
    __builtin_prefetch((void*)l, 1);
}
int main() {
  std::vector<char> src(N / 8 * (P + S) + 4096);
  for (auto& c : src) c = rand();
  char* xp = (char*)aligned_alloc(64, N * P);
  char* sp = (char*)aligned_alloc(64, N * S + 64);
  memset(xp, 0, N * P);
  memset(sp, 0, N * S);
  std::atomic<int> phase{0};
  std::atomic<long> sink{0};
  std::thread reader([&] {
    pin(1);
    for (int k = 1;; k += 2) {
      while (phase.load() != k) {
        if (phase.load() < 0) return;
      }
      long a = 0;
      for (size_t i = 0; i < N * P; i += 64) a += xp[i];
      for (size_t i = 0; i < N * S; i += 64) a += sp[i];
      sink += a;
      phase.store(k + 1);
    }
  });
  pin(0);
  std::vector<double> t[2];
  int k = 1;
  for (int it = 0; it < 400; ++it) {
    int mode = it % 2;
    phase.store(k);
    while (phase.load() != k + 1) {
    }
    k += 2;  // receiver read everything
    auto t0 = std::chrono::steady_clock::now();
    for (size_t r = 0; r < N; ++r) {
      size_t slot = (r * 37) % N;
      const char* s = src.data() + (r % 128) * (P + S);
      char* sd = sp + slot * S;
      if (mode == 0) {
        pf(sd, S);
        st(xp + slot * P, s, P / 64);
        memcpy(sd, s + P, S);
      } else {
        pf(sd, 1);
        pf(sd + S - 1, 1);
        st(xp + slot * P, s, P / 64);
        part(sd, s + P, S);
      }
      if (r % 16 == 15) _mm_sfence();
    }
    _mm_sfence();
    t[mode].push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  // payload only reference
  std::vector<double> t2;
  for (int it = 0; it < 100; ++it) {
    phase.store(k);
    while (phase.load() != k + 1) {
    }
    k += 2;
    auto t0 = std::chrono::steady_clock::now();
    for (size_t r = 0; r < N; ++r) {
      size_t slot = (r * 37) % N;
      st(xp + slot * P, src.data() + (r % 128) * (P + S), P / 64);
      if (r % 16 == 15) _mm_sfence();
    }
    _mm_sfence();
    t2.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t2.begin(), t2.end());
  printf("payload only     median %.1f\n", t2[t2.size() / 2]);
  phase.store(-5);
  reader.join();
  for (int m = 0; m < 2; ++m) {
    auto v = t[m];
    std::sort(v.begin(), v.end());
    printf("%s median %.1f us p10 %.1f p90 %.1f\n", m ? "partial-NT scales" : "plain scales    ",
           v[v.size() / 2], v[v.size() / 10], v[v.size() * 9 / 10]);
  }
}
