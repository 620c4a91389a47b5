#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
static double now() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
__attribute__((target("avx512f"))) void st512(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) _mm512_storeu_si512(d + i, _mm512_loadu_si512(s + i));
}
__attribute__((target("avx512f"))) void nt512(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64)
    _mm512_stream_si512((__m512i*)(d + i), _mm512_loadu_si512(s + i));
  _mm_sfence();
}
void movsb(char* d, const char* s, size_t n) {
  asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}
int main() {
  const size_t row = 14336, tokens = 128, Y = row * tokens;
  char* y = (char*)aligned_alloc(64, Y);
  char* stage = (char*)aligned_alloc(64, row);
  memset(stage, 1, row);
  memset(y, 0, Y);
  std::vector<char> junk(64 << 20, 1);
  const char* names[] = {"avx512-store", "nt-store", "rep-movsb"};
  std::vector<double> tw[3], tr[3];
  volatile long sink = 0;
  for (int it = 0; it < 60; ++it)
    for (int k = 0; k < 3; ++k) {
      for (size_t i = 0; i < junk.size(); i += 64) junk[i]++;  // evict y
      double t0 = now();
      for (size_t t = 0; t < tokens; ++t) {
        // touch stage like a reduction would write it (L1 hot)
        stage[t % 64] = (char)t;
        char* d = y + t * row;
        if (k == 0)
          st512(d, stage, row);
        else if (k == 1)
          nt512(d, stage, row);
        else
          movsb(d, stage, row);
      }
      double t1 = now();
      long s = 0;
      for (size_t i = 0; i < Y; i += 64) s += y[i];
      double t2 = now();
      sink += s;
      tw[k].push_back(t1 - t0);
      tr[k].push_back(t2 - t1);
    }
  for (int k = 0; k < 3; ++k) {
    std::sort(tw[k].begin(), tw[k].end());
    std::sort(tr[k].begin(), tr[k].end());
    printf("%-14s write %.1f us  read after %.1f us\n", names[k], tw[k][30], tr[k][30]);
  }
}
