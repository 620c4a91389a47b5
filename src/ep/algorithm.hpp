// The one interface both algorithms implement. A call is split in two phases so the caller can
// compute in between (ubep); bsp completes each call in its send phase.
//
// Algorithms work over the parts of the buffer named in their context (src/ep/algo_context.hpp):
// the Window, CallState and DataPath above all; they never touch peer memory except through the
// data path.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "ubep/buffer.hpp"

namespace ubep::ep {

struct AlgoContext;

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  // Whether dispatch_send may return before the call is complete (Buffer's split-phase API).
  virtual bool split_phase() const = 0;
  // Preconditions (checked by Buffer): the call's routing is built, the window's epoch begun.
  virtual void dispatch_send(const DispatchArgs& a) = 0;
  virtual void dispatch_recv() = 0;
  // Between dispatch_send and dispatch_recv of a split-phase algorithm (Buffer checks the
  // arguments): waits until source s's rows for local expert e (throughput: e is 0) have
  // arrived and returns their (begin, count).
  virtual std::array<int64_t, 2> wait_recv_range(int s, int e) = 0;
  virtual void combine_send(const CombineArgs& a) = 0;
  virtual void combine_recv() = 0;
  // Barriers made through the window so far (bsp on one host), counted with the group's own in
  // CallStats::barriers.
  virtual uint64_t window_barriers() const { return 0; }
};

std::unique_ptr<Algorithm> make_bsp(const AlgoContext& c);
std::unique_ptr<Algorithm> make_ubep(const AlgoContext& c);

}  // namespace ubep::ep
