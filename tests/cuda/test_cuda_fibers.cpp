// The CUDA simulation's fibers (src/backend/cuda/cuda_host_fibers.hpp) and their barriers, on
// their own: every simulated thread of a launch runs as a fiber of the launching thread, so the
// barriers must hold every fiber until the last one arrives, the warp exchanges must see every
// lane's value, and fibers spinning on another launch's flag must let that launch (another OS
// thread) and their own launch's other fibers go on. A broken barrier shows as a slot of another
// phase; a scheduler that starved a fiber or lost one shows as a hang caught by the deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_host_sim.hpp"

namespace {

struct PhaseParams {
  int phases;
  std::vector<int>* slots;           // one per simulated thread
  std::atomic<int>* block_mismatch;  // slots of the own block seen at another phase
  std::atomic<int>* grid_mismatch;   // slots of the grid seen at another phase
  std::atomic<int>* shuffle_mismatch;
};

void phase_kernel(const PhaseParams& p) {
  const int block = static_cast<int>(blockDim.x), grid = static_cast<int>(gridDim.x);
  const int me = static_cast<int>(blockIdx.x) * block + static_cast<int>(threadIdx.x);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  std::vector<int>& slots = *p.slots;
  for (int phase = 1; phase <= p.phases; ++phase) {
    slots[static_cast<size_t>(me)] = phase;
    __syncthreads();
    for (int t = 0; t < block; ++t)
      if (slots[static_cast<size_t>(blockIdx.x * block + t)] != phase)
        p.block_mismatch->fetch_add(1);
    // Each lane gets its right neighbour's id, as on a GPU.
    const int got = __shfl_sync(0xffffffffu, me * 7 + phase, (lane + 1) % 32);
    if (got != (me - lane + (lane + 1) % 32) * 7 + phase) p.shuffle_mismatch->fetch_add(1);
    ubep::sim::self.grid->arrive_and_wait();
    if (threadIdx.x == 0)
      for (int t = 0; t < grid * block; ++t)
        if (slots[static_cast<size_t>(t)] != phase) p.grid_mismatch->fetch_add(1);
    ubep::sim::self.grid->arrive_and_wait();  // nobody writes the next phase before the check
  }
}

TEST(SimFibers, BarriersHoldEveryThreadUntilTheLastArrives) {
  constexpr int kGrid = 4, kBlock = 96, kPhases = 40;
  std::vector<int> slots(kGrid * kBlock, 0);
  std::atomic<int> block_mismatch{0}, grid_mismatch{0}, shuffle_mismatch{0};
  const PhaseParams p{kPhases, &slots, &block_mismatch, &grid_mismatch, &shuffle_mismatch};
  ubep::sim::launch(&phase_kernel, p, kGrid, kBlock, 0);
  EXPECT_EQ(block_mismatch.load(), 0);
  EXPECT_EQ(grid_mismatch.load(), 0);
  EXPECT_EQ(shuffle_mismatch.load(), 0);
  for (int v : slots) EXPECT_EQ(v, kPhases);
}

// Two launches on two OS threads play ping-pong through flags: launch A's block b waits for B's
// flag b at round r, then sets its own; B waits for A's. Every other fiber of both launches sits
// in a block barrier meanwhile, so a scheduler that did not yield at a flag spin, or an OS thread
// that never let the other launch run, hangs (the deadline fails the test instead).
struct PingParams {
  int rounds;
  int side;  // 0: A (moves first), 1: B
  std::atomic<uint32_t>* mine;
  std::atomic<uint32_t>* theirs;
  std::atomic<int>* timeouts;
};

void ping_kernel(const PingParams& p) {
  const auto b = blockIdx.x;
  for (int r = 1; r <= p.rounds; ++r) {
    if (threadIdx.x == 0) {
      const uint32_t want = static_cast<uint32_t>(p.side == 0 ? r - 1 : r);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (p.theirs[b].load(std::memory_order_acquire) < want) {
        if (std::chrono::steady_clock::now() > deadline) {
          p.timeouts->fetch_add(1);
          break;
        }
        __nanosleep(64);  // the fiber's yield
      }
      p.mine[b].store(static_cast<uint32_t>(r), std::memory_order_release);
    }
    __syncthreads();
  }
}

TEST(SimFibers, ConcurrentLaunchesWaitingOnEachOtherBothFinish) {
  constexpr int kGrid = 3, kBlock = 64, kRounds = 200;
  std::vector<std::atomic<uint32_t>> a(kGrid), b(kGrid);
  std::atomic<int> timeouts{0};
  const PingParams pa{kRounds, 0, a.data(), b.data(), &timeouts};
  const PingParams pb{kRounds, 1, b.data(), a.data(), &timeouts};
  std::thread other([&] { ubep::sim::launch(&ping_kernel, pb, kGrid, kBlock, 0); });
  ubep::sim::launch(&ping_kernel, pa, kGrid, kBlock, 0);
  other.join();
  EXPECT_EQ(timeouts.load(), 0);
  for (int i = 0; i < kGrid; ++i) {
    EXPECT_EQ(a[static_cast<size_t>(i)].load(), static_cast<uint32_t>(kRounds));
    EXPECT_EQ(b[static_cast<size_t>(i)].load(), static_cast<uint32_t>(kRounds));
  }
}

}  // namespace
