// Deaths seen by the waits outside the calls (issue 29): a group barrier, a set-up exchange of
// the bootstrap (segment names, pids), anything else the group itself waits for. Inside a call
// the failure words do this (ep/failure_watch.hpp); here the death watch is asked directly, so a
// rank killed while its peers wait in a barrier is named within about a poll's sleep (<= 1 ms)
// instead of at the group's timeout.
//
// Correctness: DeathWatch::dead() is an acquire load of a flag its watch thread (or note_remote)
// stores with release after writing how(), so a waiter that sees it also sees how the rank
// ended. The notices from other hosts are pumped by the waiting thread itself, which is the
// caller's thread of the group (barriers and set-up exchanges are made on it, never during a
// call), the only thread that touches the transport then (death_notices.hpp).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "bootstrap/death_notices.hpp"
#include "bootstrap/death_watch.hpp"
#include "core/wait.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {

class DeathCheck {
 public:
  // notices: the cross-host forwarding to pump while waiting (nullptr on one host).
  DeathCheck(const DeathWatch& watch, DeathNotices* notices, int me)
      : watch_(watch), notices_(notices), me_(me) {}

  // Throws PeerFailedError when rank `awaited` (-1: any other rank) has died, naming it, how it
  // ended and what this rank was waiting for.
  void check(int awaited, const std::function<std::string()>& what) const {
    if (notices_) notices_->pump();
    const int first = awaited >= 0 ? awaited : 0;
    const int last = awaited >= 0 ? awaited : ranks() - 1;
    for (int r = first; r <= last; ++r)
      if (r != me_ && watch_.dead(r)) {
        // This rank may be the one that forwards the death to the other hosts: pump again (the
        // watch thread may have recorded the death after the pump above looked) and deliver the
        // notice before leaving the wait, after which this rank may not call the transport again.
        if (notices_) {
          notices_->pump();
          notices_->flush(std::chrono::milliseconds(100));
        }
        throw PeerFailedError(detail::concat("rank ", r, " ", watch_.how(r), " while rank ", me_,
                                             " waited for ", what()));
      }
  }
  int ranks() const { return watch_.ranks(); }
  // Whether rank r's process ended with exit status 0: it finished what it called (a rank that
  // leaves right after a group call must not fail a peer still finishing that call).
  bool ended_cleanly(int r) const {
    return watch_.dead(r) && watch_.how(r) == "exited with status 0";
  }

 private:
  const DeathWatch& watch_;
  DeathNotices* notices_;
  int me_;
};

// A WaitAbort for one wait: the death check for `awaited`, then the policy's own abort if any.
class DeathAbort final : public WaitAbort {
 public:
  DeathAbort(const DeathCheck* deaths, int awaited, std::function<std::string()> what)
      : deaths_(deaths), awaited_(awaited), what_(std::move(what)) {}
  // `policy` with this abort in front of its own (unchanged without a death check).
  WaitPolicy applied_to(WaitPolicy policy) {
    if (!deaths_) return policy;
    next_ = policy.abort;
    policy.abort = this;
    return policy;
  }
  void check() const override {
    deaths_->check(awaited_, what_);
    if (next_) next_->check();
  }

 private:
  const DeathCheck* deaths_;
  int awaited_;
  std::function<std::string()> what_;
  const WaitAbort* next_ = nullptr;
};

// A bootstrap of this library whose waits can watch the group's deaths, once its group has a
// death watch (ShmGroup hands its check over after the exchange of pids, and withdraws it before
// it goes). Called on the caller's thread only.
class DeathAwareBootstrap {
 public:
  virtual ~DeathAwareBootstrap() = default;
  virtual void watch_deaths(const DeathCheck* deaths) = 0;
};

}  // namespace ubep::bootstrap
