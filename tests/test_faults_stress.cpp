// Stress test of the failure words and bsp's window barrier (src/ep/window.hpp, bsp.cpp): many
// rounds on thread ranks (more ranks than cores), each with a random algorithm, layout, victim
// and failing phase (dispatch rejected on one rank, combine rejected on one rank) and
// random delays on every rank, so failures land while peers are spinning, yielding, sleeping
// or not yet waiting. Every round asserts: no hang (every wait is bounded, and the published
// failure must arrive far sooner), the right error kinds on every rank, BrokenBufferError and
// never data afterwards, and a fresh Buffer bit-identical to the reference.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <random>
#include <thread>

#include "fault_scenario.hpp"

namespace ubep::test {
namespace {

TEST(FaultStress, RandomRankFailsAtRandomPhase) {
  constexpr int kRanks = 4, kRounds = 200;
  GroupOptions opts;
  opts.timeout = std::chrono::milliseconds(20000);
  std::barrier<> barrier(kRanks);
  std::atomic<bool> any{false};
  auto sync = [&] { barrier.arrive_and_wait(); };
  auto any_rank = [&](bool v) {
    if (v) any = true;
    barrier.arrive_and_wait();
    const bool out = any.load();
    barrier.arrive_and_wait();
    any = false;  // reset for the next round (every rank has read it)
    barrier.arrive_and_wait();
    return out;
  };
  run_on_threads(
      kRanks,
      [&](Group& g) {
        std::mt19937 shared(2024);  // the same draws on every rank
        std::mt19937 local(static_cast<unsigned>(g.rank()) * 7919 + 1);
        for (int round = 0; round < kRounds && !::testing::Test::HasFailure(); ++round) {
          const Algorithm algo = shared() % 2 ? Algorithm::kBsp : Algorithm::kUbep;
          // Published faults only (a skip or throw is seen by the timeout: test_faults covers it).
          const Fault fault = shared() % 2 ? Fault::kRejectDispatch : Fault::kRejectCombine;
          const int victim = static_cast<int>(shared() % kRanks);
          const Layout layout = shared() % 2 ? Layout::kLatency : Layout::kThroughput;
          if (local() % 2) std::this_thread::sleep_for(std::chrono::microseconds(local() % 3000));
          run_fault_scenario(g, algo, fault, victim, layout, sync, any_rank);
        }
      },
      opts);
}

}  // namespace
}  // namespace ubep::test
