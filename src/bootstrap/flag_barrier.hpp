// A barrier made of one monotonically increasing arrival counter per rank in shared memory.
//
// Correctness: rank r publishes "I have arrived at barrier n" by storing n into its own counter
// (release) and leaves once every peer's counter is >= n (acquire). Counters only grow, so a
// fast rank that already stored n+1 still satisfies a slow peer's ">= n" test: consecutive
// barriers never need a reset, and no counter has two writers.
//
// With a death check (process groups), the wait for a peer ends as soon as that peer's process
// has died, naming it (death_check.hpp): a dead peer never arrives, so waiting out the timeout
// would only delay the same failure.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "bootstrap/death_check.hpp"
#include "core/wait.hpp"

namespace ubep::bootstrap {

struct alignas(64) ArrivalCounter {
  std::atomic<uint64_t> value{0};
};

class FlagBarrier {
 public:
  // counter_of(p) is rank p's counter (in shared memory visible to this rank).
  // deaths: nullptr where ranks cannot die alone (threads of one process).
  FlagBarrier(int rank, int size, std::function<ArrivalCounter*(int)> counter_of,
              const DeathCheck* deaths = nullptr)
      : rank_(rank), size_(size), counter_of_(std::move(counter_of)), deaths_(deaths) {}

  void arrive_and_wait(const WaitPolicy& policy) {
    const uint64_t n = ++arrived_;
    counter_of_(rank_)->value.store(n, std::memory_order_release);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      ArrivalCounter* c = counter_of_(p);
      auto what = [&] { return detail::concat("rank ", p, " at barrier #", n); };
      DeathAbort abort(deaths_, p, what);
      wait_until([&] { return c->value.load(std::memory_order_acquire) >= n; },
                 abort.applied_to(policy), what);
    }
  }

 private:
  int rank_;
  int size_;
  std::function<ArrivalCounter*(int)> counter_of_;
  const DeathCheck* deaths_;
  uint64_t arrived_ = 0;
};

}  // namespace ubep::bootstrap
