// Per-stage timing of one call, recorded into CallStats: each stage's time and, when given a
// running total of peer-wait time (ep::Waiter::waited_ns), the part of it spent waiting.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "ubep/stats.hpp"

namespace ubep {

class StageTimer {
 public:
  // waited_ns: nanoseconds waited on peers so far (only ever grows), or nullptr.
  explicit StageTimer(CallStats& stats, const std::atomic<int64_t>* waited_ns = nullptr)
      : stats_(stats), waited_(waited_ns), last_(Clock::now()), last_wait_(waited()) {
    stats_.stage_us.clear();
    stats_.stage_wait_us.clear();
  }
  void lap(const char* stage) {
    const auto now = Clock::now();
    stats_.stage_us.emplace_back(stage,
                                 std::chrono::duration<double, std::micro>(now - last_).count());
    last_ = now;
    if (!waited_) return;
    const int64_t w = waited();
    stats_.stage_wait_us.push_back(static_cast<double>(w - last_wait_) / 1e3);
    last_wait_ = w;
  }
  // The last lap's time less its waits on peers: the rank's own work in that stage (us).
  double last_own_us() const {
    const double lap = stats_.stage_us.back().second;
    return waited_ ? lap - stats_.stage_wait_us.back() : lap;
  }

 private:
  using Clock = std::chrono::steady_clock;
  // Members add with relaxed increments inside run_roles; the caller reads after run_roles
  // returned (the team's join orders those increments before this load).
  int64_t waited() const { return waited_ ? waited_->load(std::memory_order_relaxed) : 0; }
  CallStats& stats_;
  const std::atomic<int64_t>* waited_;
  Clock::time_point last_;
  int64_t last_wait_;
};

}  // namespace ubep
