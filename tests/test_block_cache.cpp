// The freed-block cache under the Python binding's result tensors (python/src/block_cache.hpp):
// which blocks a take may return, the bounds, and threads taking and giving at once.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "block_cache.hpp"

namespace ubep::python {
namespace {

constexpr size_t kPage = 4096;

void* map(size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  return p;
}

TEST(BlockCache, TakesABlockOfTheSizeOrAQuarterMoreMostRecentFirst) {
  BlockCache cache(8, size_t{1} << 30);
  size_t got = 0;
  EXPECT_EQ(cache.take(16 * kPage, &got), nullptr);
  void* a = map(16 * kPage);
  void* b = map(16 * kPage);
  void* c = map(20 * kPage);
  cache.give(a, 16 * kPage);
  cache.give(c, 20 * kPage);
  cache.give(b, 16 * kPage);
  EXPECT_EQ(cache.blocks(), 3u);
  EXPECT_EQ(cache.bytes(), 52 * kPage);
  EXPECT_EQ(cache.take(21 * kPage, &got), nullptr);  // every block is smaller
  EXPECT_EQ(cache.take(12 * kPage, &got), nullptr);  // 16 pages is more than 12 + 12 / 4
  EXPECT_EQ(cache.take(13 * kPage, &got), b);        // the most recent of a and b
  EXPECT_EQ(got, 16 * kPage);
  EXPECT_EQ(cache.take(17 * kPage, &got), c);  // 20 <= 17 + 4
  EXPECT_EQ(got, 20 * kPage);
  EXPECT_EQ(cache.take(16 * kPage, &got), a);
  EXPECT_EQ(cache.blocks(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
  // A block taken is the caller's: written whole and read back, then given back.
  std::memset(a, 7, 16 * kPage);
  EXPECT_EQ(static_cast<unsigned char*>(a)[16 * kPage - 1], 7);
  for (void* p : {a, b, c}) cache.give(p, p == c ? 20 * kPage : 16 * kPage);
}

TEST(BlockCache, KeepsAtMostItsBlocksAndBytesDroppingTheOldest) {
  BlockCache cache(3, 64 * kPage);
  std::vector<void*> small;
  for (int i = 0; i < 4; ++i) {
    small.push_back(map(16 * kPage));
    cache.give(small.back(), 16 * kPage);
  }
  EXPECT_EQ(cache.blocks(), 3u);  // the first was unmapped
  EXPECT_EQ(cache.bytes(), 48 * kPage);
  cache.give(map(80 * kPage), 80 * kPage);  // longer than the byte bound: never kept
  EXPECT_EQ(cache.blocks(), 3u);
  void* big = map(40 * kPage);
  cache.give(big, 40 * kPage);  // 88 pages: the two oldest go
  EXPECT_EQ(cache.blocks(), 2u);
  EXPECT_EQ(cache.bytes(), 56 * kPage);
  size_t got = 0;
  EXPECT_EQ(cache.take(16 * kPage, &got), small[3]);
  EXPECT_EQ(cache.take(16 * kPage, &got), nullptr);
  EXPECT_EQ(cache.take(40 * kPage, &got), big);
  cache.give(small[3], 16 * kPage);
  cache.give(big, 40 * kPage);
  BlockCache none(0, 64 * kPage);  // keeps nothing: every block given is unmapped
  none.give(map(kPage), kPage);
  EXPECT_EQ(none.blocks(), 0u);
}

// Threads take a block (or map one), fill it with their own mark, check the mark is still whole
// after a yield (no other thread holds the block meanwhile) and give it back, in sizes that
// share the cache. Under TSan this also checks the list is only touched under the lock.
TEST(BlockCache, ThreadsTakingAndGivingNeverShareABlock) {
  BlockCache cache(6, 64 * kPage);
  constexpr int kThreads = 4, kRounds = 3000;
  std::atomic<int> shared_seen{0}, reused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const size_t len = (4 + (i + t) % 3 * 2) * kPage;  // 4, 6 or 8 pages
        size_t got = len;
        void* p = cache.take(len, &got);
        if (p)
          reused.fetch_add(1, std::memory_order_relaxed);
        else
          p = map(len);
        auto* words = static_cast<uint32_t*>(p);
        const size_t n = got / sizeof(uint32_t);
        const uint32_t mark = static_cast<uint32_t>(t * kRounds + i);
        for (size_t w = 0; w < n; w += 256) words[w] = mark;
        words[n - 1] = mark;
        std::this_thread::yield();
        bool whole = words[n - 1] == mark;
        for (size_t w = 0; w < n; w += 256) whole = whole && words[w] == mark;
        if (!whole) shared_seen.fetch_add(1, std::memory_order_relaxed);
        cache.give(p, got);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(shared_seen.load(), 0);
  EXPECT_GT(reused.load(), kThreads * kRounds / 2);  // the cache served most takes
  EXPECT_LE(cache.blocks(), 6u);
  EXPECT_LE(cache.bytes(), 64 * kPage);
}

}  // namespace
}  // namespace ubep::python
