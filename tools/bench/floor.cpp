// The latency floor (bench.hpp, measure_floor): a one-cache-line flag round trip between ranks 0
// and 1 through shared memory, and one all-to-all flag barrier, as bsp makes after each stage.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "ubep/error.hpp"

namespace ubep::tools {

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Spins on a flag in shared memory until it reaches `want`, within the group's timeout.
void wait_at_least(const uint64_t* p, uint64_t want, const Group& g, int peer) {
  std::atomic_ref<const uint64_t> a(*p);
  const auto deadline = Clock::now() + g.options().timeout;
  for (uint64_t n = 1; a.load(std::memory_order_acquire) < want; ++n) {
    if (n % 4096 == 0) {
      UBEP_CHECK(Clock::now() < deadline, TimeoutError, "ubep-bench floor: rank ", g.rank(),
                 " waited for rank ", peer, "'s flag ", want, " past the timeout");
      // Oversubscribed ranks (more ranks than cores) must let the peer run.
      std::this_thread::yield();
    }
  }
}

void publish(uint64_t* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
}

}  // namespace

std::vector<BenchRow> measure_floor(Group& g, int iters) {
  std::vector<BenchRow> out;
  const int R = g.size(), me = g.rank();
  if (R < 2) return out;
  // Line 0 of each window: the ping-pong flag; line 1 + s: rank s's barrier flag.
  auto win = g.allocate_window(64 * static_cast<size_t>(R + 2) + 64);
  int shared = 1;
  for (int d = 0; d < R; ++d) shared &= win->base(d) != nullptr;
  std::vector<int> all(static_cast<size_t>(R));
  g.allgather(&shared, all.data(), sizeof shared);
  if (std::find(all.begin(), all.end(), 0) != all.end()) return out;
  auto line = [&](int d, int i) {
    auto base = (reinterpret_cast<uintptr_t>(win->base(d)) + 63) & ~uintptr_t(63);
    return reinterpret_cast<uint64_t*>(base + 64 * static_cast<size_t>(i));
  };
  const int warmup = std::max(10, iters / 10);
  // Ping-pong: each side polls a line in its own memory and writes the peer's, as a receiver
  // polls its window for the tag a sender wrote.
  std::vector<double> rt;
  g.barrier();
  if (me <= 1) {
    const int peer = 1 - me;
    for (int i = 1; i <= warmup + iters; ++i) {
      const auto v = static_cast<uint64_t>(i);
      if (me == 0) {
        const auto t0 = Clock::now();
        publish(line(peer, 0), v);
        wait_at_least(line(me, 0), v, g, peer);
        if (i > warmup) rt.push_back(us_since(t0));
      } else {
        wait_at_least(line(me, 0), v, g, peer);
        publish(line(peer, 0), v);
      }
    }
  }
  if (me != 0) rt.assign(static_cast<size_t>(iters), 0.0);  // rank 0's times are the ones
  g.barrier();
  out.push_back(make_row(g, "floor", "", "roundtrip", rt, 64));
  // All-to-all flag barrier: post my epoch to every peer, wait for every peer's.
  std::vector<double> bt;
  for (int i = 1; i <= warmup + iters; ++i) {
    const auto v = static_cast<uint64_t>(i);
    const auto t0 = Clock::now();
    for (int d = 0; d < R; ++d)
      if (d != me) publish(line(d, 1 + me), v);
    for (int s = 0; s < R; ++s)
      if (s != me) wait_at_least(line(me, 1 + s), v, g, s);
    if (i > warmup) bt.push_back(us_since(t0));
  }
  g.barrier();
  out.push_back(make_row(g, "barrier", "", "flag", bt, 0));
  return out;
}

}  // namespace ubep::tools
