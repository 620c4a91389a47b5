// Why computing the pool gives the same times as an event per task (the simulator before issue
// 28's eighth session: a completion event per row, a third of a ubep call's events).
//
// Event by event, an idle server takes the queue's head when it arrives, and a server whose task
// completes at t takes the head at t: every task starts at max(its arrival, the time a server
// became free for it), first come, first served, and completes task_ns later. All tasks cost the
// same, so which idle server takes a task changes no time, and the queue's head goes to the
// server free first: the earliest-free-server rule of a first-come-first-served multi-server
// queue. A server that joins at t would take the head at t; so until no server can join
// (seal), a task is given a server only if one is free by now (one free earlier would have
// started it already, and none joining now or later comes sooner); after the seal, all of them.
// The doubles are the event run's: a start is one of its event times (an arrival, a join, the
// gate, a completion) and a completion is start + task_ns, as EventQueue::after adds it. Before
// the gate opens no task starts, so the servers there are all idle at the gate.
// tests/sim/test_receive_pool.cpp checks it against an event per task.
#include "sim/receive_pool.hpp"

#include <algorithm>
#include <functional>

#include "ubep/error.hpp"

namespace ubep::sim {

void ReceivePool::add_servers(double now, int n) {
  UBEP_CHECK_ARG(n >= 0, "receive pool: negative server count ", n);
  UBEP_CHECK_ARG(!sealed_, "receive pool: a server joined after the pool was sealed");
  for (int i = 0; i < n; ++i) {
    free_.push_back(now);
    std::push_heap(free_.begin(), free_.end(), std::greater<>{});
  }
  advance(now);
}

void ReceivePool::seal(double now) {
  sealed_ = true;
  advance(now);
}

void ReceivePool::open_gate(double now) {
  gate_open_ = true;
  // Nothing started before: every server there is idle, from now. (Raising each key to the
  // same value keeps the heap a heap.)
  for (double& f : free_) f = std::max(f, now);
  advance(now);
}

void ReceivePool::arrive(double now, uint64_t n) {
  if (n == 0) return;
  waiting_.push_back(Waiting{now, n});
  advance(now);
}

void ReceivePool::advance(double now) {
  if (!gate_open_) return;
  while (!waiting_.empty() && !free_.empty()) {
    const double free_at = free_.front();
    if (!sealed_ && free_at > now) return;  // a server may still join before it
    Waiting& head = waiting_.front();
    const double done = std::max(free_at, head.arrival) + task_ns_;
    std::pop_heap(free_.begin(), free_.end(), std::greater<>{});
    free_.back() = done;
    std::push_heap(free_.begin(), free_.end(), std::greater<>{});
    last_done_ = std::max(last_done_, done);
    ++started_;
    if (--head.count == 0) waiting_.pop_front();
  }
}

}  // namespace ubep::sim
