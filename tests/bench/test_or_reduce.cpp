// The combine bound's OR loops (tools/bench/or_reduce.cpp) against a byte-by-byte OR: every
// access pattern, row counts and sizes with and without a partial step, and with the next
// token's rows hinted (a prefetch only: the output must not depend on them).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <vector>

#include "bench/or_reduce.hpp"

namespace ubep::tools {
namespace {

TEST(BenchOrReduce, EveryPatternOrsTheRows) {
  std::mt19937 rng(5);
  for (int n : {1, 2, 8, 9})
    for (size_t bytes : {size_t{16}, size_t{64}, size_t{200}, size_t{14336}, size_t{14336 + 48}}) {
      std::vector<std::vector<char>> rows(static_cast<size_t>(n) + 3,
                                          std::vector<char>(bytes + 64));
      for (auto& r : rows)
        for (auto& c : r) c = static_cast<char>(rng() & 0x11);  // sparse bits: ORs differ
      std::vector<char> want(bytes, 0);
      std::vector<const char*> ptrs, next;
      for (int r = 0; r < n; ++r) {
        ptrs.push_back(rows[static_cast<size_t>(r)].data());
        for (size_t i = 0; i < bytes; ++i) want[i] |= rows[static_cast<size_t>(r)][i];
      }
      for (size_t r = static_cast<size_t>(n); r < rows.size(); ++r) next.push_back(rows[r].data());
      for (int mask = 0; mask < 16; ++mask) {
        const OrReduce how{(mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0, (mask & 8) != 0};
        std::vector<char> storage(bytes + 128, 0x7f);
        char* out = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
        or_reduce(out, ptrs.data(), n, bytes, how, next.data(), static_cast<int>(next.size()));
        std::atomic_thread_fence(std::memory_order_seq_cst);  // after streamed stores
        ASSERT_EQ(std::vector<char>(out, out + bytes), want)
            << "n " << n << " bytes " << bytes << " pattern " << mask;
        EXPECT_EQ(out[bytes], 0x7f) << "wrote past the row";
      }
    }
}

}  // namespace
}  // namespace ubep::tools
