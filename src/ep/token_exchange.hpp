// The one interface both algorithms (bsp.cpp, ubep.cpp) implement: how one call's tokens are
// exchanged. A call is split in two phases so the caller can compute in between (ubep); bsp
// completes each call in its send phase.
//
// Data flows one way: every method takes the call it works on as an argument (the DispatchCall
// the engine routed, or the CombineCall built from the combine's arguments) and returns what it
// produced. The long-lived parts it works over -- the Window, the DataPath, the waits, the
// reducer, the relay -- come in the ExchangeContext at construction (exchange_context.hpp). An
// algorithm never touches peer memory except through the data path.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "ep/dispatch_call.hpp"
#include "ubep/buffer.hpp"

namespace ubep::ep {

struct ExchangeContext;

// One combine of a dispatch: what the combine's caller handed in.
struct CombineCall {
  const DispatchCall& dispatch;  // the dispatch it combines (routing, offsets, arrivals)
  const char* x;                 // the expert outputs, one combine row per received row
  bool compacted;                // x is in compact() order rather than the dispatch output's
  bool zero_copy;                // x is this rank's combine buffer itself: nothing to copy
  char* out;                     // where y goes (CombineArgs::out), or nullptr: the reducer's
};

class TokenExchange {
 public:
  virtual ~TokenExchange() = default;
  // Whether dispatch_send may return before the call is complete (Buffer's split-phase API).
  virtual bool split_phase() const = 0;
  // Preconditions (the engine's): the call is routed, the window's epoch begun.
  virtual void dispatch_send(DispatchCall& call) = 0;
  virtual Arrivals dispatch_recv(DispatchCall& call) = 0;
  // Between dispatch_send and dispatch_recv of a split-phase algorithm (the engine checks the
  // arguments): waits until source s's rows for local expert e (throughput: e is 0) have
  // arrived and returns their (begin, count).
  virtual std::array<int64_t, 2> wait_recv_range(const DispatchCall& call, int s, int e) = 0;
  virtual void combine_send(const CombineCall& call) = 0;
  // Returns y [num_tokens, hidden] in the combine dtype (the reducer's memory, or the caller's).
  virtual TensorView combine_recv(const CombineCall& call) = 0;
  // Barriers made through the window so far (bsp on one host), counted with the group's own in
  // CallStats::barriers.
  virtual uint64_t window_barriers() const { return 0; }
};

std::unique_ptr<TokenExchange> make_bsp(const ExchangeContext& context);
std::unique_ptr<TokenExchange> make_ubep(const ExchangeContext& context);

}  // namespace ubep::ep
