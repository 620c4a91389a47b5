// The host-driven engine behind a Buffer (backend/engine.hpp) on the CPU backend: the parts it
// is composed of, and the call bookkeeping around the algorithms (sequencing, failure words,
// split-phase state, input checks).
//
//   DataPath     (backend)  how bytes and tags move, where roles run   src/backend/data_path.hpp
//   Window       (ep)       window map, epochs, count records, tags    src/ep/window.hpp
//   CallState    (ep)       routing, offsets, arrivals of one call     src/ep/call_state.hpp
//   HostRelay    (ep)       the cross-host relay, over a Remote        src/ep/relay.hpp
//   Waiter       (ep)       bounded waits; keeps the relay going       src/ep/waiter.hpp
//   TokenReducer (ep)       combine's fixed-order reduction into y     src/ep/reducer.hpp
//   Algorithm    (ep)       bsp | ubep over an AlgoContext of the above  src/ep/algorithm.hpp
// The algorithms see the parts through their context (src/ep/algo_context.hpp), never the engine.
#pragma once

#include <memory>
#include <vector>

#include "backend/data_path.hpp"
#include "backend/engine.hpp"
#include "core/local_array.hpp"
#include "ep/algorithm.hpp"
#include "ep/call_state.hpp"
#include "ep/membership.hpp"
#include "ep/reducer.hpp"
#include "ep/relay.hpp"
#include "ep/waiter.hpp"
#include "ep/window.hpp"
#include "protocol/call_checks.hpp"
#include "protocol/call_ledger.hpp"
#include "ubep/buffer.hpp"

namespace ubep::ep {

struct HostEngine final : backend::Engine {
  Group& grp;
  BufferConfig cfg;
  DType cdtype;  // combine_dtype(cfg): combine's rows (dispatch rows follow the window's codec)
  int rank, ranks, local_experts;
  int64_t T;  // max tokens per rank
  std::unique_ptr<backend::DataPath> dp;
  ep::Window win;
  ep::CallState call;
  // Calls started, whether the buffer is broken, what the peers are told (shared with the
  // device engine): once the ranks are out of step no call may return data.
  protocol::CallLedger ledger;
  ep::Membership members;            // masked ranks and their agreement (docs/ELASTIC.md)
  int death_subscription = -1;       // the group's death watch writes kDeadWord for us
  ep::FailureWatch watch;            // every wait of this buffer polls the peers' failure words
  std::unique_ptr<HostRelay> relay;  // cross-host relay, when the group spans hosts
  ep::Waiter waiter;
  ep::TokenReducer reducer;  // owns y, combine's output

  // Starts call number `ledger.calls() + 1`; throws BrokenBufferError if the buffer is broken.
  // A dispatch first agrees on a pending change of the group (membership.hpp); a combine fails
  // if a rank it needs died or left for an agreement.
  void start_call(const char* what, bool dispatch);
  void settle_membership(const char* what, bool dispatch);
  bool lost_a_rank() const;  // an unmasked rank died in the group (not after breaking/leaving)
  // After the call's inputs were accepted: fails the call if a peer's buffer broke.
  void join_call(const char* what);
  // This rank rejected its input before sending anything: tell peers waiting in this call.
  void reject_call();
  // The call failed after the ranks started it: the buffer is broken, for this rank and (through
  // its failure word) for its peers.
  void break_call(const char* what, const std::exception& cause);

  enum class Phase { kIdle, kDispatchSent, kCombineSent } phase = Phase::kIdle;
  bool have_dispatch = false;
  uint64_t dispatch_seq = 0;  // the last dispatch's handle (a repeated combine has its own seq)
  // The last dispatch was combined: a further combine of it is a repeat (repeat_combine.cpp).
  bool combined = false;
  uint64_t repeat_barriers = 0;  // barriers made before repeated combines, for last_stats()
  // The dispatch's topk_weights, kept once a combine replaced them: a later combine without
  // weights uses the dispatch's again, as the first one would have.
  std::vector<float> dispatch_weights;
  bool weights_kept = false;

  LocalArray compacted;         // [valid rows, payload] compact() output
  LocalArray compacted_scales;  // [valid rows, scales] its scales (fp8)
  int64_t compacted_rows = -1;  // rows of the last compact() (-1: none since the last dispatch)
  // fp8 cast on send: this rank's x as e4m3 codes and scales, [T, payload] and [T, scales].
  LocalArray cast_x, cast_scales;
  CallStats stats;
  std::unique_ptr<ep::Algorithm> bsp, ubep;

  HostEngine(Group& g, const BufferConfig& c, std::unique_ptr<backend::DataPath> data_path);
  ~HostEngine() override;

  // backend::Engine: Buffer's calls (host_engine.cpp).
  DispatchResult dispatch(const DispatchArgs& args) override;
  TensorView combine(const CombineArgs& args) override;
  void dispatch_send(const DispatchArgs& args) override;
  DispatchResult dispatch_recv() override;
  void combine_send(const CombineArgs& args) override;
  TensorView combine_recv() override;
  std::array<int64_t, 2> wait_recv_range(int source, int local_expert) override;
  DispatchResult pending_dispatch() const override;
  TensorView pending_combine() const override;
  TensorView compact() override;
  TensorView compact_scales() const override;
  TensorView combine_buffer() const override;
  const BufferConfig& config() const override { return cfg; }
  Group& group() override { return grp; }
  int num_workers() const override { return dp->members() - 1; }
  void mask(int r) override;
  std::vector<int> masked_ranks() const override { return members.masked_ranks(); }
  void rejoin() override;
  void set_algorithm(ubep::Algorithm a) override;
  void set_sync_mode(SyncMode m) override;
  const CallStats& last_stats() const override { return stats; }
  size_t shared_bytes() const override { return win.bytes(); }

  ep::Algorithm& algorithm() const { return cfg.algorithm == ubep::Algorithm::kBsp ? *bsp : *ubep; }

  const protocol::RowCodec& codec() const { return win.codec(); }  // dispatch rows
  int64_t RT() const { return call.RT(); }
  bool multi_host() const { return relay != nullptr; }

  void begin_dispatch(const DispatchArgs& a);
  void set_dispatch_source(const DispatchArgs& a);  // call.source; casts to fp8 if asked
  DispatchResult result() const;
  TensorView combine_input_view() const;
  TensorView compact_rows();
  TensorView y_view() const;
  void check_combine(const CombineArgs& a) const;
  // After check_combine accepted them: the weights and where y goes (CombineArgs::out).
  void set_combine_weights(const CombineArgs& a);
  // Before a repeated combine (repeat_combine.cpp): a new tag, then a barrier.
  void begin_repeat_combine();
};

}  // namespace ubep::ep
