#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include "core/fp8_blocks.hpp"
#include "ubep/bf16.hpp"
namespace oldk {
float quantize_block_avx2(const void*, bool, bool, uint8_t*);
}
using namespace ubep;
int main(int argc, char** argv) {
  const long rows = atol(argv[1]), hidden = 7168;
  const int iters = atoi(argv[2]);
  std::vector<uint16_t> x(rows * hidden);
  std::mt19937 rng(3);
  for (auto& v : x) v = float_to_bf16((float)(rng() % 2001) / 100.0f - 10.0f);
  std::vector<uint8_t> c1(x.size()), c2(x.size());
  std::vector<float> s1(rows * 56), s2(rows * 56);
  std::vector<double> to, tn;
  for (int rep = 0; rep < 21; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      for (long r = 0; r < rows; ++r)
        for (int b = 0; b < 56; ++b)
          s1[r * 56 + b] = oldk::quantize_block_avx2(x.data() + r * hidden + b * 128, true, false,
                                                     c1.data() + r * hidden + b * 128);
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      fp8_blocks::quantize_rows(x.data(), true, rows, hidden, false, c2.data(), s2.data(),
                                fp8_blocks::kAvx2);
    auto t2 = std::chrono::steady_clock::now();
    to.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / iters / (rows * 56));
    tn.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count() / iters / (rows * 56));
  }
  if (c1 != c2 || s1 != s2) printf("DIFFER\n");
  std::sort(to.begin(), to.end());
  std::sort(tn.begin(), tn.end());
  printf("rows %ld ns/block median old %.1f new %.1f (min %.1f / %.1f)\n", rows, to[10], tn[10],
         to[0], tn[0]);
}
