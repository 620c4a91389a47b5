// Ends a wait of call `call` as soon as the call cannot complete on this rank, naming why,
// instead of at the timeout: a peer published that it rejected that call or that its buffer is
// broken (a host-mate in this rank's window; a rank of another host by a notice,
// remote_failures.hpp); a peer's process died (the death watch wrote kDeadWord into this
// rank's window on its behalf); or a peer abandoned the call to agree on a change of the group
// (docs/ELASTIC.md). Masked ranks take no part in calls and are not watched.
#pragma once

#include <atomic>

#include "core/wait.hpp"
#include "ep/membership.hpp"
#include "ep/window.hpp"

namespace ubep::ep {

class FailureWatch final : public WaitAbort {
 public:
  FailureWatch(const Window& w, const Membership& members, int me)
      : w_(w), members_(members), me_(me) {}
  void set_call(uint64_t call) {
    call_ = call;
    group_change_.store(false, std::memory_order_relaxed);
  }
  // Whether this call was ended by a change of the group (a death, a peer that left to agree),
  // not by a fault: any waiting thread may set it; the caller reads it once the roles are done.
  bool ended_by_group_change() const { return group_change_.load(std::memory_order_relaxed); }
  uint64_t call() const { return call_; }
  void check() const override {
    // Deaths first, over every rank: when a host is lost, a host-mate that saw it first breaks
    // its buffer, and naming that echo ("rank 0 failed call N") instead of a death this rank
    // already knows hid the lost host from a quarter of the survivors (32i: 78 of 320 errors).
    for (int r = 0; r < w_.map().ranks; ++r) {
      if (r == me_ || members_.masked(r)) continue;
      if (is_dead(w_.failure_of(r))) {  // ranks of other hosts: only a forwarded death
        group_change_.store(true, std::memory_order_relaxed);
        throw PeerFailedError(detail::concat("rank ", r, " ", members_.death_note(r),
                                             " during call ", call_, " (seen by rank ", me_, ")"));
      }
    }
    for (int r = 0; r < w_.map().ranks; ++r) {
      if (r == me_ || members_.masked(r)) continue;
      // A host-mate's word is in this window; another host's came as a notice (issue 32).
      const uint32_t v = w_.peer(r) ? w_.failure_of(r) : members_.remote_failure(r);
      if (!failure_ends_call(v, call_)) continue;
      if (is_broken(v))
        throw PeerFailedError(detail::concat("rank ", r, " failed call ", marked_call(v, call_),
                                             " (its buffer is broken), so call ", call_,
                                             " cannot complete on rank ", me_));
      throw PeerFailedError(detail::concat("rank ", r, " rejected its input for call ", call_,
                                           ", so the call cannot complete on rank ", me_));
    }
    const int ahead = members_.peer_ahead(call_);
    if (ahead >= 0) group_change_.store(true, std::memory_order_relaxed);
    if (ahead >= 0)
      throw PeerFailedError(detail::concat(
          "rank ", ahead, " left call ", call_, " to agree on a change of the group (round ",
          w_.member_round(ahead), "), so the call cannot complete on rank ", me_,
          "; the next dispatch agrees"));
  }

 private:
  const Window& w_;
  const Membership& members_;
  int me_;
  uint64_t call_ = 0;
  mutable std::atomic<bool> group_change_{false};
};

}  // namespace ubep::ep
