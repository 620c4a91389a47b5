// Bounded waiting: spin, then yield, then fail with a clear TimeoutError.
//
// Ranks can outnumber cores (8 thread ranks on a 2-core machine), so a waiter must give its
// core away quickly; and a dead peer must never hang the caller.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "ubep/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define UBEP_CPU_RELAX() _mm_pause()
#else
#define UBEP_CPU_RELAX() std::this_thread::yield()
#endif

namespace ubep {

// Interrupt check for embedders: the Python module points it at "SIGINT arrived", so Ctrl-C ends
// a wait instead of running into the timeout. Polled only in the yielding phase, next to the
// deadline check (never on the spinning fast path); when it returns true the wait throws Error.
inline std::atomic<bool (*)()> wait_interrupt_hook{nullptr};

struct WaitPolicy {
  std::chrono::nanoseconds timeout{std::chrono::seconds(60)};
  int spins_before_yield = 256;
};

// Waits until ready() is true. describe() is only called on timeout, to name what was awaited.
template <typename Ready, typename Describe>
void wait_until(Ready&& ready, const WaitPolicy& policy, Describe&& describe) {
  for (int i = 0; i < policy.spins_before_yield; ++i) {
    if (ready()) return;
    UBEP_CPU_RELAX();
  }
  const auto deadline = std::chrono::steady_clock::now() + policy.timeout;
  for (unsigned n = 0;; ++n) {
    if (ready()) return;
    std::this_thread::yield();
    if ((n & 63u) == 0) {
      if (auto* interrupted = wait_interrupt_hook.load(std::memory_order_relaxed);
          interrupted && interrupted() && !ready())
        throw Error(detail::concat("interrupted while waiting for ", describe()));
    }
    if ((n & 63u) == 0 && std::chrono::steady_clock::now() > deadline) {
      if (ready()) return;
      throw TimeoutError(detail::concat(
          "timed out after ", std::chrono::duration<double>(policy.timeout).count(),
          " s waiting for ", describe(),
          " (is that rank alive, making the same call, and did it accept its inputs?)"));
    }
  }
}

}  // namespace ubep
