// A ubep receiver's pool of workers that reorder (dispatch) or reduce (combine) the rows that
// land on it (call_sim.cpp), computed without an event per row.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

namespace ubep::sim {

// Tasks of one cost (one row each), served first come, first served by servers that join over
// time, once a gate has opened (a dispatch receiver's prefix sum). Every task's start and
// completion is the one an event per task would give, to the bit (receive_pool.cpp says why);
// the pool needs no event of its own, only its callers' (arrivals, joins, the gate).
class ReceivePool {
 public:
  explicit ReceivePool(double task_ns = 0) : task_ns_(task_ns) {}
  // `n` servers idle from `now`.
  void add_servers(double now, int n);
  // No server will join any more: the waiting tasks can be given their servers at once.
  void seal(double now);
  void open_gate(double now);
  // `n` tasks join the queue at `now`.
  void arrive(double now, uint64_t n);

  bool gate_open() const { return gate_open_; }
  // Tasks that have a server and a start time (all that arrived, once sealed and open).
  uint64_t started() const { return started_; }
  // When the last started task completes (-inf: none started).
  double last_done() const { return last_done_; }

 private:
  void advance(double now);

  double task_ns_;
  bool gate_open_ = false, sealed_ = false;
  std::vector<double> free_;  // each server's free time, a min-heap
  struct Waiting {
    double arrival;
    uint64_t count;
  };
  std::deque<Waiting> waiting_;  // tasks without a server, in arrival order
  uint64_t started_ = 0;
  double last_done_ = -std::numeric_limits<double>::infinity();
};

}  // namespace ubep::sim
