// The split-phase state machine of a Buffer's calls, one copy for every engine (ep::HostEngine on
// the CPU, cuda_host::KernelEngine on a CUDA device): which phase the buffer is in, whether there
// is a dispatch to combine, the call sequence and the failure words (through its CallLedger).
// An engine drives it in the same steps for every call:
//
//   require_*(what)          preconditions: InvalidArgument before anything is started
//   start(what)              call number calls() + 1 (BrokenBufferError once broken)
//   accept(what, checks)     the inputs: a rejection tells the peers, the buffer stays usable;
//                            then joins the call (a peer whose buffer broke fails it)
//   run(what, phase, fate)   a phase of the started call: an error there leaves the ranks out of
//                            step, so the buffer breaks (and tells the peers) unless `fate` says
//                            the ranks are still in step
//   enter(phase)             where a split-phase call now stands
//
// One thread drives a buffer (Buffer's contract), so nothing here is synchronised.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <utility>

#include "protocol/call_ledger.hpp"
#include "ubep/buffer.hpp"
#include "ubep/error.hpp"

namespace ubep::protocol {

enum class Phase {
  kIdle,              // no split-phase call outstanding
  kDispatchSent,      // dispatch_send returned; dispatch_recv outstanding
  kDispatchReceived,  // a receive hook already completed the receive (kernels); recv outstanding
  kCombineSent,       // combine_send returned; combine_recv outstanding
};

// What an engine says of a phase's failure.
enum class FailureFate {
  kBreaks,     // the ranks are out of step: the buffer is broken, peers are told
  kInStep,     // the ranks are in step (e.g. a peer made a different call): the buffer stays usable
  kAbandoned,  // the engine abandoned the call (a group change, docs/ELASTIC.md): not a fault
};

class CallMachine {
 public:
  CallMachine(int rank, int ranks, std::function<uint32_t(int)> read_failure,
              std::function<void(uint32_t)> publish_failure)
      : ledger_(rank, ranks, std::move(read_failure), std::move(publish_failure)) {}

  CallLedger& ledger() { return ledger_; }
  const CallLedger& ledger() const { return ledger_; }
  uint64_t calls() const { return ledger_.calls(); }
  Phase phase() const { return phase_; }
  bool idle() const { return phase_ == Phase::kIdle; }
  bool have_dispatch() const { return have_dispatch_; }
  bool combined() const { return combined_; }

  // --- preconditions ---
  void require_usable(const char* what) const { ledger_.check_usable(what); }
  void require_idle(const char* what) const {
    UBEP_CHECK_ARG(idle(), what, ": a split-phase call is still outstanding on this buffer");
  }
  static void require_split_phase(const char* what, Algorithm algorithm) {
    UBEP_CHECK_ARG(algorithm == Algorithm::kUbep, what,
                   ": split-phase calls need the ubep algorithm, this buffer runs ",
                   algorithm_name(algorithm));
  }
  // dispatch_recv, wait_recv_range: the buffer is usable and a dispatch_send is outstanding.
  void require_dispatch_sent(const char* what) const {
    ledger_.check_usable(what);
    UBEP_CHECK_ARG(dispatch_outstanding(), what, ": no dispatch_send outstanding");
  }
  void require_pending_latency_dispatch(Layout layout) const {
    UBEP_CHECK_ARG(dispatch_outstanding() && layout == Layout::kLatency,
                   "pending_dispatch: no latency-layout dispatch_send outstanding");
  }
  void require_combine_sent(const char* what) const {
    ledger_.check_usable(what);
    require_pending_combine(what);
  }
  void require_pending_combine(const char* what) const {
    UBEP_CHECK_ARG(phase_ == Phase::kCombineSent, what, ": no combine_send outstanding");
  }
  void require_dispatch(const char* what) const {
    UBEP_CHECK_ARG(have_dispatch_, what, ": no dispatch on this buffer yet");
  }

  // --- a call's life ---
  void start(const char* what) { ledger_.start(what); }
  template <typename Checks>
  void accept(const char* what, Checks&& checks) {
    try {
      checks();
    } catch (const InvalidArgument&) {
      ledger_.reject();
      throw;
    }
    try {
      ledger_.join(what);
    } catch (...) {
      phase_ = Phase::kIdle;
      throw;
    }
  }
  // fate(cause) -> FailureFate, for an error that left `phase_fn`.
  template <typename PhaseFn, typename Fate>
  auto run(const char* what, PhaseFn&& phase_fn, Fate&& fate) {
    try {
      return phase_fn();
    } catch (const std::exception& e) {
      const FailureFate f = fate(e);
      if (f != FailureFate::kInStep) phase_ = Phase::kIdle;
      if (f == FailureFate::kBreaks) ledger_.fail(what, e);
      throw;
    }
  }
  // A failure found outside run() (e.g. a kernel's error word read after the launch).
  void fail(const char* what, const std::exception& cause) {
    phase_ = Phase::kIdle;
    ledger_.fail(what, cause);
  }
  void enter(Phase p) { phase_ = p; }

  // --- the dispatch a combine belongs to ---
  void dispatched() {
    have_dispatch_ = true;
    combined_ = false;
  }
  void forget_dispatch() { have_dispatch_ = false; }
  // Marks the last dispatch combined; true if it had been already (a repeated combine).
  bool mark_combined() { return std::exchange(combined_, true); }

  // The engine's destructor: peers learn that this rank leaves (CallLedger::depart).
  // Idle, or with a receive a hook already completed: this rank's part of the call was sent.
  void depart() { ledger_.depart(idle() || phase_ == Phase::kDispatchReceived); }

 private:
  bool dispatch_outstanding() const {
    return phase_ == Phase::kDispatchSent || phase_ == Phase::kDispatchReceived;
  }

  CallLedger ledger_;
  Phase phase_ = Phase::kIdle;
  bool have_dispatch_ = false;
  bool combined_ = false;
};

}  // namespace ubep::protocol
