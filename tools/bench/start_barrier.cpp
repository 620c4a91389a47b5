// The barrier every timed op of the bench starts after (bench.hpp StartBarrier).
//
// Why not the group barrier: its waiter yields its core after a few microseconds and sleeps (up
// to 1 ms per poll) after 2 ms. The bench's untimed expert step ends at different times on
// different ranks, so the first rank there often waited long enough to sleep, or -- on this
// shared VM with other processes runnable -- yielded its core for a scheduler time slice; it
// then left the barrier milliseconds after its peers, which waited for it inside the timed op
// (decode combine, 2 process ranks, under load: start skew median 3.1 ms, the op 4.2 ms against
// 0.93 ms of work; breakdown.cpp measures it). The bound's copies never wait on a peer, so that
// skew was charged to the calls alone.
//
// Correctness: rank r publishes "arrived at barrier n" by storing n (release) into line r of
// every peer's window, and leaves once each of its own lines s holds >= n (acquire). Only rank s
// writes line s of any window, values only grow, so a fast rank already at n + 1 still satisfies
// a slow peer's ">= n" test, and nothing is ever reset (the same argument as FlagBarrier's).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "bench.hpp"
#include "ubep/error.hpp"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ubep::tools {

namespace {

void relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

uint64_t* line(const SharedWindow& w, int rank, int slot) {
  const auto base = (reinterpret_cast<uintptr_t>(w.base(rank)) + 63) & ~uintptr_t{63};
  return reinterpret_cast<uint64_t*>(base + 64 * static_cast<size_t>(slot));
}

}  // namespace

StartBarrier::StartBarrier(Group& g) : g_(g) {
  if (!g.single_host()) return;  // across hosts: the group barrier
  win_ = g.allocate_window(64 * static_cast<size_t>(g.size()) + 64);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // More ranks than cores: the ranks sharing a core must get it to arrive, so waiters yield.
  yield_ = static_cast<unsigned>(g.size()) > cores;
  g.barrier();  // every window is zero before anyone arrives
}

StartBarrier::~StartBarrier() {
  // Nobody unmaps the window while a peer may still poll it (a failed run ends there anyway).
  if (win_ && !std::uncaught_exceptions()) g_.barrier();
}

void StartBarrier::wait() {
  if (!win_) {
    g_.barrier();
    return;
  }
  const uint64_t n = ++arrived_;
  const int me = g_.rank(), R = g_.size();
  for (int d = 0; d < R; ++d)
    std::atomic_ref<uint64_t>(*line(*win_, d, me)).store(n, std::memory_order_release);
  const auto deadline = std::chrono::steady_clock::now() + g_.options().timeout;
  for (int s = 0; s < R; ++s) {
    std::atomic_ref<uint64_t> flag(*line(*win_, me, s));
    for (uint64_t polls = 1; flag.load(std::memory_order_acquire) < n; ++polls) {
      relax();
      if (yield_ && polls % 64 == 0) std::this_thread::yield();
      if (polls % 65536 == 0)
        UBEP_CHECK(std::chrono::steady_clock::now() < deadline, TimeoutError, "ubep-bench: rank ",
                   me, " waited for rank ", s, " at start barrier #", n, " past the timeout");
    }
  }
}

}  // namespace ubep::tools
