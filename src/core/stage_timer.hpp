// Per-stage timing of one call, recorded into CallStats.
#pragma once

#include <chrono>

#include "ubep/stats.hpp"

namespace ubep {

class StageTimer {
 public:
  explicit StageTimer(CallStats& stats) : stats_(stats), last_(Clock::now()) {
    stats_.stage_us.clear();
  }
  void lap(const char* stage) {
    const auto now = Clock::now();
    stats_.stage_us.emplace_back(stage,
                                 std::chrono::duration<double, std::micro>(now - last_).count());
    last_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  CallStats& stats_;
  Clock::time_point last_;
};

}  // namespace ubep
