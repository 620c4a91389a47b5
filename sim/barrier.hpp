// A group barrier of ubep-sim's bsp orchestration (call_sim.cpp).
#pragma once

#include <functional>
#include <vector>

#include "sim/engine.hpp"

namespace ubep::sim {

// A group barrier: releases every rank `cost` after the last one arrives.
class Barrier {
 public:
  Barrier(EventQueue& q, int ranks, double cost) : q_(q), ranks_(ranks), cost_(cost) {}
  // Rank arrives now; `then(release_time)` runs at release.
  void arrive(std::function<void()> then) {
    waiting_.push_back(std::move(then));
    if (static_cast<int>(waiting_.size()) < ranks_) return;
    auto all = std::move(waiting_);
    waiting_.clear();
    released_at_ = q_.now() + cost_;
    q_.after(cost_, [all = std::move(all)] {
      for (auto& f : all) f();
    });
  }
  double released_at() const { return released_at_; }

 private:
  EventQueue& q_;
  int ranks_;
  double cost_;
  double released_at_ = 0;
  std::vector<std::function<void()>> waiting_;
};

}  // namespace ubep::sim
