// ep::HostEngine: Buffer's calls. Each goes through the CallMachine (protocol/call_machine.hpp)
// in the same steps -- preconditions, start, accept the inputs, run the phases -- and hands the
// routed call to the algorithm (bsp or ubep), which returns what it produced.
#include <utility>

#include "bootstrap/group_hooks.hpp"
#include "core/log.hpp"
#include "ep/host_engine.hpp"
#include "protocol/call_checks.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

using protocol::FailureFate;
using protocol::Phase;

// Barriers the call made, and bytes it moved between hosts, into last_stats().
class HostEngine::CallScope {
 public:
  explicit CallScope(HostEngine& engine) : engine_(engine), barriers_before_(barriers()) {}
  ~CallScope() {
    engine_.stats_.barriers = barriers() - barriers_before_;
    engine_.stats_.network_bytes = engine_.relay_ ? engine_.relay_->network_bytes() : 0;
    engine_.stats_.network_rows = engine_.relay_ ? engine_.relay_->network_rows() : 0;
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  // Only bsp makes barriers through the window; ubep makes none.
  uint64_t barriers() const {
    return engine_.group_.barrier_count() + engine_.bsp_exchange_->window_barriers() +
           engine_.repeat_barriers_;
  }

  HostEngine& engine_;
  uint64_t barriers_before_;
};

void HostEngine::start_call(const char* what, bool dispatch) {
  machine_.require_usable(what);
  settle_membership(what, dispatch);
  machine_.start(what);
  watch_.set_call(machine_.calls());
}

FailureFate HostEngine::fate_of(const std::exception& cause) {
  // A peer made a different call: the ranks are in step, the buffer stays usable.
  if (dynamic_cast<const MismatchedCallError*>(&cause)) return FailureFate::kInStep;
  // A death that ended this call goes to the other hosts now: their ranks may be waiting in
  // this call for what only this host would have sent (DeathNotices).
  if (multi_host()) bootstrap::hooks_of(group_).pump_deaths();
  // The call failed because a rank died or left for an agreement: not a fault of this buffer.
  // Abandon the call (peers waiting for this rank's part learn it from the new round) and
  // agree at the next dispatch instead of breaking (docs/ELASTIC.md).
  // Across hosts (issue 32) only with mask_dead_ranks, and also when the transport named the
  // lost peer before the watch did (a TcpRemote request to it failed): the death is in the
  // watch by then (the transport notes it first), so dead_unmasked sees it.
  const bool elastic = !multi_host() || (cfg_.mask_dead_ranks && members_.can_mask_hosts());
  if (elastic && (watch_.ended_by_group_change() || lost_a_rank() ||
                  (multi_host() && members_.dead_unmasked() >= 0) ||
                  members_.peer_ahead(machine_.calls()) >= 0)) {
    if (relay_) relay_->abandon_call();
    members_.abandon(machine_.calls(), window_.seq(), cfg_.mask_dead_ranks);
    machine_.forget_dispatch();
    return FailureFate::kAbandoned;
  }
  log::debug("rank ", rank_, ": a call breaks the buffer: ", cause.what());
  return FailureFate::kBreaks;
}

template <typename PhaseFn>
auto HostEngine::run_phase(const char* what, PhaseFn&& phase_fn) {
  return machine_.run(what, std::forward<PhaseFn>(phase_fn),
                      [this](const std::exception& e) { return fate_of(e); });
}

// A dispatch that a peer made differently completed on every rank, but its output means
// nothing: no combine of it, and the error names the peer.
DispatchResult HostEngine::finish_dispatch(const Arrivals& arrivals) {
  if (arrivals.shape_mismatch >= 0 || arrivals.topk_mismatch >= 0) machine_.forget_dispatch();
  UBEP_CHECK_ARG(arrivals.shape_mismatch < 0, "dispatch: rank ", arrivals.shape_mismatch,
                 " made a different call (layout or placement) than rank ", rank_, " (",
                 layout_name(call_.layout()), ", ", placement_name(call_.placement()), ")");
  UBEP_CHECK_ARG(arrivals.topk_mismatch < 0, "dispatch: rank ", arrivals.topk_mismatch,
                 " used a different topk than rank ", rank_, " (", call_.routing().topk, ")");
  return result(arrivals);
}

DispatchResult HostEngine::dispatch(const DispatchArgs& args) {
  machine_.require_idle("dispatch");
  start_call("dispatch", true);
  Arrivals arrivals{};
  {
    CallScope scope(*this);
    machine_.accept("dispatch", [&] { begin_dispatch(args); });
    arrivals = run_phase("dispatch", [&] {
      exchange().dispatch_send(call_);
      return exchange().dispatch_recv(call_);
    });
  }
  return finish_dispatch(arrivals);
}

void HostEngine::dispatch_send(const DispatchArgs& args) {
  protocol::CallMachine::require_split_phase("dispatch_send", cfg_.algorithm);
  machine_.require_idle("dispatch_send");
  start_call("dispatch_send", true);
  CallScope scope(*this);
  machine_.accept("dispatch_send", [&] { begin_dispatch(args); });
  run_phase("dispatch_send", [&] { exchange().dispatch_send(call_); });
  machine_.enter(Phase::kDispatchSent);
}

DispatchResult HostEngine::dispatch_recv() {
  machine_.require_dispatch_sent("dispatch_recv");
  machine_.enter(Phase::kIdle);
  Arrivals arrivals{};
  {
    CallScope scope(*this);
    arrivals = run_phase("dispatch_recv", [&] { return exchange().dispatch_recv(call_); });
  }
  return finish_dispatch(arrivals);
}

std::array<int64_t, 2> HostEngine::wait_recv_range(int source, int local_expert) {
  machine_.require_dispatch_sent("wait_recv_range");
  protocol::check_recv_piece(source, local_expert, call_.layout(), ranks_, local_experts_);
  return run_phase("wait_recv_range",
                   [&] { return exchange().wait_recv_range(call_, source, local_expert); });
}

DispatchResult HostEngine::pending_dispatch() const {
  machine_.require_pending_latency_dispatch(call_.layout());
  return result(call_.arrivals());  // views: the counts fill in as the receive completes
}

CombineCall HostEngine::combine_call(const CombineArgs& a) const {
  const char* own_rows = window_.at<char>(rank_, window_.map().comb_x);
  return {call_, static_cast<const char*>(a.x.data), a.compacted,
          a.x.data == own_rows && !a.compacted,
          a.out.ndim != 0 ? static_cast<char*>(a.out.data) : nullptr};
}

// A started combine's inputs: checked (a rejection leaves the buffer usable), then the weights
// it combines with.
void HostEngine::begin_combine(const char* what, const CombineArgs& args) {
  machine_.accept(what, [&] { check_combine(args); });
  call_.use_combine_weights(
      args.topk_weights.ndim != 0 ? static_cast<const float*>(args.topk_weights.data) : nullptr);
}

TensorView HostEngine::combine(const CombineArgs& args) {
  machine_.require_idle("combine");
  start_call("combine", false);
  CallScope scope(*this);
  begin_combine("combine", args);
  const bool repeat = machine_.mark_combined();
  return run_phase("combine", [&] {
    if (repeat) begin_repeat_combine();
    const CombineCall combine = combine_call(args);
    exchange().combine_send(combine);
    return exchange().combine_recv(combine);
  });
}

void HostEngine::combine_send(const CombineArgs& args) {
  protocol::CallMachine::require_split_phase("combine_send", cfg_.algorithm);
  machine_.require_idle("combine_send");
  start_call("combine_send", false);
  CallScope scope(*this);
  begin_combine("combine_send", args);
  const bool repeat = machine_.mark_combined();
  run_phase("combine_send", [&] {
    if (repeat) begin_repeat_combine();
    exchange().combine_send(combine_call(args));
  });
  pending_combine_args_ = args;
  machine_.enter(Phase::kCombineSent);
}

TensorView HostEngine::combine_recv() {
  machine_.require_combine_sent("combine_recv");
  machine_.enter(Phase::kIdle);
  CallScope scope(*this);
  return run_phase("combine_recv",
                   [&] { return exchange().combine_recv(combine_call(pending_combine_args_)); });
}

TensorView HostEngine::pending_combine() const {
  machine_.require_pending_combine("pending_combine");
  return reducer_.y_view(call_.routing().num_tokens, combine_call(pending_combine_args_).out);
}

TensorView HostEngine::compact() {
  machine_.require_dispatch("compact");
  UBEP_CHECK_ARG(machine_.idle(), "compact: a split-phase call is outstanding");
  return compact_rows();
}

}  // namespace ubep::ep
