// What an algorithm (bsp.cpp, ubep.cpp) works over for the buffer's life: the long-lived parts
// of one buffer it may use, and nothing else. The HostEngine owns every part and builds the
// context; an algorithm keeps a copy (references only). The call itself comes as an argument of
// each method (token_exchange.hpp). Algorithms never see the engine, so the call bookkeeping
// (sequencing, failure words, split-phase state) stays out of their reach.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/data_path.hpp"
#include "ep/dispatch_call.hpp"
#include "ep/reducer.hpp"
#include "ep/relay.hpp"
#include "ep/waiter.hpp"
#include "ep/window.hpp"
#include "ubep/buffer.hpp"

namespace ubep::ep {

struct ExchangeContext {
  Group& group;             // host map; across hosts, bsp's stage barrier
  const BufferConfig& cfg;  // hidden, max_topk, the send schedule
  backend::DataPath& dp;    // where roles run
  const Window& win;        // messages: count records, rows, tags
  const Waiter& waiter;     // bounded waits (keep the relay going on the caller's thread)
  TokenReducer& reducer;    // combine's fixed-order reduction into y
  HostRelay* relay;         // the cross-host relay, nullptr on one host
  CallStats& stats;         // stage times of the last call

  int rank() const { return group.rank(); }
  int ranks() const { return group.size(); }
  int local_experts() const { return cfg.num_experts / group.size(); }
  int64_t max_tokens() const { return cfg.max_tokens_per_rank; }
  bool same_host(int r) const { return group.same_host(r, group.rank()); }
  // A peer this call exchanges with through shared memory: on this host and not masked (a
  // masked rank is neither sent to nor waited for, docs/ELASTIC.md).
  bool reach(const DispatchCall& call, int r) const { return same_host(r) && !call.masked(r); }
  bool multi_host() const { return relay != nullptr; }
  size_t row_bytes() const { return win.row_bytes(); }  // a combine row
};

}  // namespace ubep::ep
