// Per-window NT copy speed: does the same loop run at different speeds into different shm windows?
#include <immintrin.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <string>
static double now() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  int nwin = argc > 1 ? atoi(argv[1]) : 6, rounds = argc > 2 ? atoi(argv[2]) : 30;
  const size_t row = 14336, rows = 1024, winsz = 2 * rows * row + (1 << 20);
  std::vector<char*> w(nwin);
  for (int i = 0; i < nwin; ++i) {
    std::string n = "/s31win" + std::to_string(getpid()) + "_" + std::to_string(i);
    int fd = shm_open(n.c_str(), O_CREAT | O_RDWR, 0600); ftruncate(fd, winsz);
    w[i] = (char*)mmap(nullptr, winsz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); close(fd); shm_unlink(n.c_str());
    memset(w[i], 1, winsz);
  }
  std::vector<char> src(128 * row + 64); char* s = (char*)(((uintptr_t)src.data() + 63) & ~63ul); memset(s, 2, 128 * row);
  std::vector<size_t> place(rows); for (size_t r = 0; r < rows; ++r) place[r] = ((r * 37) % rows) * row;  // scattered
  std::vector<std::vector<double>> t(nwin);
  for (int rd = 0; rd < rounds; ++rd)
    for (int k = 0; k < nwin; ++k) {
      int i = (k + rd) % nwin;
      char* base = w[i] + (rd & 1) * rows * row;
      double t0 = now();
      for (size_t r = 0; r < rows; ++r) {
        const __m256i* a = (const __m256i*)(s + (r / 8) * row); __m256i* d = (__m256i*)(base + place[r]);
        for (size_t j = 0; j < row / 32; ++j) _mm256_stream_si256(d + j, _mm256_load_si256(a + j));
      }
      _mm_sfence();
      t[i].push_back(now() - t0);
    }
  for (int h = 0; h < 2; ++h) for (int i = 0; i < nwin; ++i) { auto v = std::vector<double>(t[i].begin() + h * rounds / 2, t[i].begin() + (h + 1) * rounds / 2); std::sort(v.begin(), v.end()); printf("half %d win %d: median %.0f us  min %.0f  p90 %.0f\n", h, i, v[v.size()/2], v[0], v[v.size()*9/10]); }
}
