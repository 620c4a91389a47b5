// One membership agreement for the Buffers of a group that spans hosts (issue 32,
// docs/ELASTIC.md "Two Buffers on one group").
//
// Each Buffer keeps its own membership records (Membership, MemberLink), but across hosts the
// changes are the group's: a lost host, a replacement host. Agreed one Buffer at a time, a
// change could be taken by Buffer A at one call while Buffer B's next call still ran without it,
// and a replacement in step with A then waited in B's agreement for live ranks that waited in
// A's next call for it: a deadlock until the timeout (3 of 4 hand runs). So the Buffers with
// mask_dead_ranks of one group, on one process, agree together: a dispatch of any of them that
// finds a change in any of them
//   1. begins the agreement of every one (each publishes its new round, marked agreeing), so a
//      peer in a call of any of them sees it left (FailureWatch) and abandons that call;
//   2. polls them all in one wait until each has concluded;
//   3. then each resumes at its own agreed call (its ledger, window sequence, masked ranks).
//   4. with two Buffers or more, the dispatch that agreed fails (PeerFailedError, nothing sent,
//      the Buffers usable): ranks may reach the agreement at different Buffers' dispatches (one
//      completed A's call that the others abandoned), so each redoes its step from its first
//      Buffer and all call the Buffers in one order again.
// Every rank does the same at its next dispatch of either Buffer, so nobody waits in one Buffer's
// agreement for a rank held in another's call or agreement. A replacement host's rank is taken
// only once its records of every such Buffer have arrived (Membership's joint check), so the
// Buffers conclude with the same view.
//
// Threads: members are added and removed by Buffers' constructors and destructors (any thread),
// under the mutex; agree() runs on the caller's thread (the one that calls every Buffer of a group
// that spans hosts: the transport has one user), takes a snapshot of the members under the mutex
// and calls them with it released. A Buffer must not be destroyed while another thread calls a
// Buffer of the same group (already the rule: the transport is used from one thread at a time).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "core/wait.hpp"
#include "ubep/group.hpp"

namespace ubep::ep {

class GroupAgreement {
 public:
  // One Buffer's side of the shared agreement (implemented by HostEngine).
  class Member {
   public:
    virtual int buffer_number() const = 0;
    virtual bool between_calls() const = 0;  // no split-phase call outstanding
    virtual void pump_records() = 0;         // takes its records from other hosts (caller's thread)
    virtual bool change_pending() const = 0;
    // The replacement of `rank`'s record of this Buffer arrived, or this Buffer took it already.
    virtual bool replaced_here(int rank) const = 0;
    virtual void begin_agreement(const char* what) = 0;
    virtual bool poll_agreement(const char* what) = 0;  // true once concluded
    virtual void finish_agreement() = 0;
    virtual std::string agreement_state(const char* what) const = 0;

   protected:
    ~Member() = default;
  };

  // The agreement of this process's Buffers on `group`, made by the first and shared by the
  // others; `m` joins it (leave() on destruction).
  static std::shared_ptr<GroupAgreement> join(Group& group, Member* m);
  void leave(Member* m);

  // Whether any member has a change to agree on (each takes its records in first).
  bool change_pending();
  // Whether every member but `except` has the replacement of `rank`'s record.
  bool replaced_elsewhere(int rank, const Member* except) const;
  // At a dispatch of `caller`: the three steps above, bounded by the policy's timeout.
  void agree(const Member* caller, const WaitPolicy& policy, const char* what);

 private:
  std::vector<Member*> snapshot() const;

  mutable std::mutex mu_;
  std::vector<Member*> members_;  // ascending buffer number
};

}  // namespace ubep::ep
