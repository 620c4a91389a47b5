// What an algorithm (bsp.cpp, ubep.cpp) works with: the parts of one buffer it may use, and
// nothing else. The HostEngine owns every part and builds the context; an algorithm keeps a copy
// (references only) for the buffer's life. Algorithms never see the engine, so the call
// bookkeeping (sequencing, failure words, split-phase state) stays out of their reach.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/data_path.hpp"
#include "ep/call_state.hpp"
#include "ep/reducer.hpp"
#include "ep/relay.hpp"
#include "ep/waiter.hpp"
#include "ep/window.hpp"
#include "ubep/buffer.hpp"

namespace ubep::ep {

struct AlgoContext {
  Group& group;             // host map; across hosts, bsp's stage barrier
  const BufferConfig& cfg;  // hidden, max_topk, the send schedule
  backend::DataPath& dp;    // where roles run
  const Window& win;        // messages: count records, rows, tags
  CallState& call;          // routing, offsets, arrivals of this call
  const Waiter& waiter;     // bounded waits (keep the relay going on the caller's thread)
  TokenReducer& reducer;    // combine's fixed-order reduction into y
  HostRelay* relay;         // the cross-host relay, nullptr on one host
  CallStats& stats;         // stage times of the last call

  int rank() const { return call.rank; }
  int ranks() const { return call.ranks; }
  int local_experts() const { return call.local_experts; }
  int64_t T() const { return call.T; }  // max tokens per rank
  bool same_host(int r) const { return group.same_host(r, call.rank); }
  // A peer this call exchanges with through shared memory: on this host and not masked (a
  // masked rank is neither sent to nor waited for, docs/ELASTIC.md).
  bool reach(int r) const { return same_host(r) && !call.masked(r); }
  bool multi_host() const { return relay != nullptr; }
  size_t row_bytes() const { return win.row_bytes(); }  // a combine row
};

}  // namespace ubep::ep
