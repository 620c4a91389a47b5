// The bounded waits of one buffer's calls. Every wait polls the peers' failure words (a failed
// peer ends it at once instead of at the timeout) and names the call when it times out.
//
// A wait on the caller's thread also keeps the cross-host relay going: the caller's thread is the
// only one that touches the transport, and relayed count records and rows appear only when the
// relay is progressed. Progressing it inside every caller wait is what makes the waits
// deadlock-free across hosts (relay.hpp), whoever is waiting for what.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "bootstrap/group_hooks.hpp"
#include "core/wait.hpp"
#include "ep/failure_watch.hpp"
#include "ep/relay.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

class Waiter {
 public:
  // relay: nullptr when the group is on one host. members: whose records from other hosts the
  // caller's waits take in (Membership::pump), so that the failure watch sees a peer that left
  // this call to agree (issue 32: a replacement host's record may reach one live rank before a
  // call and another only inside it).
  Waiter(Group& g, const FailureWatch& watch, HostRelay* relay, Membership* members)
      : group_(g), watch_(watch), relay_(relay), members_(members) {
    policy_.timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(g.options().timeout);
    policy_.abort = &watch_;
  }

  // For waits off the caller's thread that name what they wait for themselves.
  const WaitPolicy& policy() const { return policy_; }

  // Waits for pred; caller: on the caller's thread (keeps the relay going meanwhile). A wait that
  // does not find pred true at once adds its duration to waited_ns (the stage table's "wait").
  template <typename Pred, typename Describe>
  void wait_for(Pred&& pred, bool caller, Describe&& describe) const {
    if (pred()) return;  // the common case: no clock read
    const auto start = std::chrono::steady_clock::now();
    wait_slow(pred, caller, describe);
    waited_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - start)
                             .count(),
                         std::memory_order_relaxed);
  }
  // Nanoseconds this buffer's waits have spent waiting for peers, over its life (every member
  // thread adds to it: relaxed increments of one counter, read by StageTimer on the caller's
  // thread after the roles joined).
  const std::atomic<int64_t>& waited_ns() const { return waited_ns_; }

 private:
  template <typename Pred, typename Describe>
  void wait_slow(Pred&& pred, bool caller, Describe&& describe) const {
    auto named = [&] { return detail::concat(describe(), " in call ", watch_.call()); };
    if (caller && relay_) {
      // Deaths on other hosts arrive through the transport too (Group::pump_deaths): looked
      // for at most every 100 µs, not at every poll of the relay (a death is rare, a poll is
      // not), so a forwarded death still ends this wait within about a poll's sleep.
      auto next_pump = std::chrono::steady_clock::now();
      try {
        wait_until(
            [&] {
              if (pred()) return true;
              relay_->progress();
              const auto now = std::chrono::steady_clock::now();
              if (now >= next_pump) {
                bootstrap::hooks_of(group_).pump_deaths();
                // Caller's thread, the only one that touches the transport; the records land in
                // this rank's window through the seqlock the failure watch reads them by.
                if (members_) members_->pump();
                next_pump = now + std::chrono::microseconds(100);
                // The failure watch on this clock too, not only on wait_until's count (every 64
                // polls while yielding, none in its first 256): under load a poll of the relay
                // can take milliseconds (Open MPI yields inside each MPI_Test), and those
                // hundreds of polls left a host-mate's death, or a peer's failure that a notice
                // just brought, unseen for 0.8-3.3 s (issue 32, mpi_kill_2hosts_ubep with 8 busy
                // loops). Same thread, same throw as the policy's check.
                if (pred()) return true;
                watch_.check();
              }
              return pred();
            },
            policy_, named);
      } catch (const PeerFailedError&) {
        // The failure watch may have seen a host-mate's death (its word, written by the death
        // watch) before this thread's last pump forwarded it; if the caller then stops calling
        // the transport, the other hosts would learn it only at their timeout. Forward it and
        // let the notices go out first (bounded), as a group wait does (death_check.hpp).
        bootstrap::hooks_of(group_).forward_deaths_now();
        throw;
      }
    } else {
      wait_until(pred, policy_, named);
    }
  }

  WaitPolicy policy_;
  mutable std::atomic<int64_t> waited_ns_{0};
  Group& group_;
  const FailureWatch& watch_;
  HostRelay* relay_;
  Membership* members_;
};

}  // namespace ubep::ep
