#include <sys/mman.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
int main(int argc, char** argv) {
  const size_t len = size_t(120) << 20, hp = size_t(2) << 20;
  char* src = (char*)aligned_alloc(4096, len);
  memset(src, 1, len);
  for (int mode = 0; mode < 3; ++mode)
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      char* raw = (char*)mmap(nullptr, len + hp, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      char* p = (char*)(((uintptr_t)raw + hp - 1) / hp * hp);
      if (mode == 1) madvise(p, len, MADV_HUGEPAGE);
      if (mode == 2) {
        madvise(p, len, MADV_HUGEPAGE);
      }
      auto t1 = std::chrono::steady_clock::now();
      memcpy(p, src, len);
      auto t2 = std::chrono::steady_clock::now();
      memcpy(p, src, len);
      auto t3 = std::chrono::steady_clock::now();
      std::ifstream f("/proc/self/smaps_rollup");
      std::string line;
      long anon_huge = 0;
      while (std::getline(f, line))
        if (line.rfind("AnonHugePages:", 0) == 0) anon_huge = atol(line.c_str() + 14);
      printf("mode %d first copy %.1f ms (%.2f GB/s), second %.1f ms, AnonHuge %ld kB\n", mode,
             std::chrono::duration<double, std::milli>(t2 - t1).count(),
             len / 1e6 / std::chrono::duration<double, std::milli>(t2 - t1).count(),
             std::chrono::duration<double, std::milli>(t3 - t2).count(), anon_huge);
      munmap(raw, len + hp);
    }
}
