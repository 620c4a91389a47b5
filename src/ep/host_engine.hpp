// The host-driven engine behind a Buffer (backend/engine.hpp) on the CPU backend: the parts it is
// composed of, and the call bookkeeping around the algorithms (the split-phase state machine,
// failure words, input checks, elastic membership).
//
//   DataPath      (backend)   how bytes and tags move, where roles run  src/backend/data_path.hpp
//   Window        (ep)        window map, epochs, count records, tags   src/ep/window.hpp
//   DispatchCall  (ep)        one routed dispatch: input and products   src/ep/dispatch_call.hpp
//   HostRelay     (ep)        the cross-host relay, over a Remote       src/ep/relay.hpp
//   Waiter        (ep)        bounded waits; keeps the relay going      src/ep/waiter.hpp
//   TokenReducer  (ep)        combine's fixed-order reduction into y    src/ep/reducer.hpp
//   TokenExchange (ep)        bsp | ubep                                src/ep/token_exchange.hpp
//   CallMachine   (protocol)  phases, call sequence, failure words src/protocol/call_machine.hpp
//
// The engine's parts are private; the algorithms see the long-lived ones through their
// ExchangeContext and each call as an argument, never the engine. Its code is in
//   host_engine.cpp             construction, departure, the views a call returns
//   host_engine_calls.cpp       Buffer's calls, each through the CallMachine
//   host_engine_inputs.cpp      routing a dispatch (and its fp8 cast), combine's checks, compact()
//   host_engine_membership.cpp  elastic EP: agreeing on masked ranks, mask, rejoin
//   repeat_combine.cpp          a second combine of one dispatch
#pragma once

#include <memory>
#include <vector>

#include "backend/data_path.hpp"
#include "backend/engine.hpp"
#include "core/local_array.hpp"
#include "ep/dispatch_call.hpp"
#include "ep/failure_watch.hpp"
#include "ep/group_agreement.hpp"
#include "ep/membership.hpp"
#include "ep/reducer.hpp"
#include "ep/relay.hpp"
#include "ep/token_exchange.hpp"
#include "ep/waiter.hpp"
#include "ep/window.hpp"
#include "protocol/call_machine.hpp"
#include "ubep/buffer.hpp"

namespace ubep::ep {

class HostEngine final : public backend::Engine, private GroupAgreement::Member {
 public:
  HostEngine(Group& g, const BufferConfig& c, std::unique_ptr<backend::DataPath> data_path);
  ~HostEngine() override;
  HostEngine(const HostEngine&) = delete;
  HostEngine& operator=(const HostEngine&) = delete;

  // backend::Engine: Buffer's calls (host_engine_calls.cpp).
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
  const BufferConfig& config() const override { return cfg_; }
  Group& group() override { return group_; }
  int num_workers() const override { return data_path_->members() - 1; }
  void mask(int rank) override;
  std::vector<int> masked_ranks() const override { return members_.masked_ranks(); }
  void rejoin() override;
  void set_algorithm(Algorithm a) override;
  void set_sync_mode(SyncMode m) override;
  const CallStats& last_stats() const override { return stats_; }
  size_t shared_bytes() const override { return window_.bytes(); }

 private:
  class CallScope;

  TokenExchange& exchange() const {
    return cfg_.algorithm == Algorithm::kBsp ? *bsp_exchange_ : *ubep_exchange_;
  }
  const protocol::RowCodec& codec() const { return window_.codec(); }  // dispatch rows
  bool multi_host() const { return relay_ != nullptr; }

  // --- the call's life (host_engine_calls.cpp) ---
  // Starts call number calls() + 1; a dispatch first agrees on a pending change of the group
  // (membership.hpp), a combine fails if a rank it needs died or left for an agreement.
  void start_call(const char* what, bool dispatch);
  // What a failed phase means: broken, in step (a peer made a different call), or abandoned
  // because the group changed (the agreement at the next dispatch settles it).
  protocol::FailureFate fate_of(const std::exception& cause);
  template <typename PhaseFn>
  auto run_phase(const char* what, PhaseFn&& phase_fn);
  DispatchResult finish_dispatch(const Arrivals& arrivals);
  CombineCall combine_call(const CombineArgs& args) const;
  void begin_combine(const char* what, const CombineArgs& args);

  // --- inputs (host_engine_inputs.cpp) ---
  void begin_dispatch(const DispatchArgs& a);
  RowArrays dispatch_rows(const DispatchArgs& a);  // x as given, or its fp8 cast
  void check_combine(const CombineArgs& a) const;
  TensorView compact_rows();

  // --- views of what a call produced (host_engine.cpp) ---
  DispatchResult result(const Arrivals& arrivals) const;
  TensorView combine_input_view() const;

  // --- elastic EP (host_engine_membership.cpp) ---
  void settle_membership(const char* what, bool dispatch);
  // The agreement's outcome (its own or the group's): where the next call starts, who is masked.
  void adopt(const Membership::Resume& resume);
  // GroupAgreement::Member: this Buffer's side of the agreement it shares with the group's other
  // Buffers (group_agreement.hpp).
  int buffer_number() const override { return members_.buffer_number(); }
  bool between_calls() const override { return machine_.idle(); }
  void pump_records() override { members_.pump(); }
  bool change_pending() const override { return members_.change_pending(); }
  bool replaced_here(int r) const override { return members_.knows_replacement(r); }
  void begin_agreement(const char* what) override;
  bool poll_agreement(const char* what) override;
  void finish_agreement() override { adopt(members_.end_agreement()); }
  std::string agreement_state(const char* what) const override {
    return members_.agreement_state(what);
  }
  bool lost_a_rank() const;  // an unmasked rank died in the group (not after breaking/leaving)
  void watch_deaths();

  // Before a repeated combine (repeat_combine.cpp): a new tag, then a barrier.
  void begin_repeat_combine();

  Group& group_;
  BufferConfig cfg_;
  const DType combine_dtype_;  // combine's rows (dispatch rows follow the window's codec)
  const int rank_, ranks_, local_experts_;
  const int64_t max_tokens_;  // per rank
  std::unique_ptr<backend::DataPath> data_path_;
  Window window_;
  DispatchCall call_;  // the last dispatch: routed by begin_dispatch, handed to the algorithm
  // Phases, calls started, whether the buffer is broken, what the peers are told (shared with
  // the device engine): once the ranks are out of step no call may return data.
  protocol::CallMachine machine_;
  Membership members_;           // masked ranks and their agreement (docs/ELASTIC.md)
  int death_subscription_ = -1;  // the group's death watch writes kDeadWord for us
  // Shared with this process's other Buffers of the group with mask_dead_ranks across hosts
  // (null otherwise: this Buffer agrees alone).
  std::shared_ptr<GroupAgreement> agreement_;
  FailureWatch watch_;                // every wait of this buffer polls the peers' failure words
  std::unique_ptr<HostRelay> relay_;  // cross-host relay, when the group spans hosts
  Waiter waiter_;
  TokenReducer reducer_;              // owns y, combine's output
  CombineArgs pending_combine_args_;  // a combine_send's arguments, for its combine_recv
  uint64_t dispatch_seq_ = 0;     // the last dispatch's handle (a repeated combine has its own seq)
  uint64_t repeat_barriers_ = 0;  // barriers made before repeated combines, for last_stats()

  LocalArray compacted_;         // [valid rows, payload] compact() output
  LocalArray compacted_scales_;  // [valid rows, scales] its scales (fp8)
  int64_t compacted_rows_ = -1;  // rows of the last compact() (-1: none since the last dispatch)
  // fp8 cast on send: this rank's x as e4m3 codes and scales, [T, payload] and [T, scales].
  LocalArray cast_x_, cast_scales_;
  CallStats stats_;
  std::unique_ptr<TokenExchange> bsp_exchange_, ubep_exchange_;
};

}  // namespace ubep::ep
