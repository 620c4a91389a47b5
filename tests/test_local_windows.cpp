// cuda_host::share_local_window / find_local_window (src/backend/cuda/local_windows.hpp): a
// window is released exactly once, after its owner and every peer that found it let go, on
// whichever thread lets go last; a released address is never found again, and a new window at
// the same address is. The stress test runs the set-up/tear-down pattern of thread ranks many
// times with random tear-down orders and delays.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backend/cuda/local_windows.hpp"

namespace {

using ubep::cuda_host::find_local_window;
using ubep::cuda_host::share_local_window;

TEST(LocalWindows, ReleasedOnceAfterTheLastReference) {
  auto memory = std::make_unique<char[]>(64);
  int released = 0;
  std::shared_ptr<char> owner = share_local_window(memory.get(), [&](char*) { ++released; });
  std::shared_ptr<char> peer = find_local_window(memory.get());
  ASSERT_EQ(peer.get(), memory.get());
  owner.reset();
  EXPECT_EQ(released, 0) << "released while a peer still references it";
  EXPECT_EQ(find_local_window(memory.get()).get(), memory.get());
  peer.reset();
  EXPECT_EQ(released, 1);
  EXPECT_EQ(find_local_window(memory.get()), nullptr);
}

TEST(LocalWindows, AnUnpublishedAddressIsNotFound) {
  char here = 0;
  EXPECT_EQ(find_local_window(&here), nullptr);
}

TEST(LocalWindows, ANewWindowAtAReleasedAddressIsFound) {
  auto memory = std::make_unique<char[]>(64);
  int first = 0, second = 0;
  share_local_window(memory.get(), [&](char*) { ++first; }).reset();
  ASSERT_EQ(first, 1);
  std::shared_ptr<char> again = share_local_window(memory.get(), [&](char*) { ++second; });
  std::shared_ptr<char> found = find_local_window(memory.get());
  ASSERT_NE(found, nullptr);
  again.reset();
  found.reset();
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 1);
}

// Ranks as threads, many rounds: each publishes a fresh window, all meet, each finds every
// peer's, all meet, then they let go in a random order with random delays. Every window must be
// released exactly once, only after the last rank let go, and lookups must see this round's.
TEST(LocalWindows, RanksSharingAndLettingGoConcurrently) {
  constexpr int kRanks = 6, kRounds = 300;
  std::barrier meet(kRanks);
  std::vector<std::atomic<int>> released(static_cast<size_t>(kRanks * kRounds));
  std::vector<std::atomic<int>> holders(static_cast<size_t>(kRanks * kRounds));
  std::vector<char*> windows(static_cast<size_t>(kRanks));
  std::atomic<int> bad_lookups{0}, early_releases{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      std::mt19937 rng(static_cast<unsigned>(r) * 7919u + 1u);
      for (int round = 0; round < kRounds; ++round) {
        const size_t id = static_cast<size_t>(round * kRanks + r);
        char* mem = new char[16];
        mem[0] = static_cast<char>(round & 0x7f);
        holders[id] = kRanks;
        std::shared_ptr<char> mine = share_local_window(mem, [&, id](char* p) {
          if (holders[id].load() != 0) early_releases.fetch_add(1);
          released[id].fetch_add(1);
          delete[] p;
        });
        windows[static_cast<size_t>(r)] = mem;
        meet.arrive_and_wait();
        std::vector<std::shared_ptr<char>> peers;
        for (int q = 0; q < kRanks; ++q) {
          if (q == r) continue;
          std::shared_ptr<char> w = find_local_window(windows[static_cast<size_t>(q)]);
          if (!w || w.get()[0] != static_cast<char>(round & 0x7f)) bad_lookups.fetch_add(1);
          peers.push_back(std::move(w));
        }
        meet.arrive_and_wait();  // nobody lets go before everyone has found its peers
        if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
        // Let go of the peers' references first or last, at random; count this rank out of
        // every window it held just before it drops the references.
        const bool peers_first = rng() % 2;
        const auto drop_peers = [&] {
          for (int q = 0, i = 0; q < kRanks; ++q)
            if (q != r) {
              holders[static_cast<size_t>(round * kRanks + q)].fetch_sub(1);
              peers[static_cast<size_t>(i++)].reset();
            }
        };
        if (peers_first) drop_peers();
        holders[id].fetch_sub(1);
        mine.reset();
        if (!peers_first) drop_peers();
        meet.arrive_and_wait();  // the next round reuses `windows`
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad_lookups.load(), 0);
  EXPECT_EQ(early_releases.load(), 0);
  for (size_t i = 0; i < released.size(); ++i) ASSERT_EQ(released[i].load(), 1) << "window " << i;
}

}  // namespace
