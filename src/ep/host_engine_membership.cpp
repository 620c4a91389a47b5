// ep::HostEngine's side of elastic EP (docs/ELASTIC.md): agreeing on masked ranks at a
// dispatch, mask/rejoin, and telling a group change from a fault.
#include "bootstrap/death_watch.hpp"
#include "bootstrap/group_hooks.hpp"
#include "ep/host_engine.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

void HostEngine::settle_membership(const char* what, bool dispatch) {
  if (multi_host()) {
    bootstrap::hooks_of(group_).pump_deaths();
    bootstrap::hooks_of(group_).pump_rejoins();  // a replacement host's connections (issue 32)
    members_.pump();                             // the records of other hosts' ranks (MemberLink)
  }
  // Across hosts with mask_dead_ranks the group's Buffers agree together (group_agreement.hpp):
  // a change pending in any of them is agreed by all at this dispatch.
  const bool shared = agreement_ && dispatch;
  if (shared ? !agreement_->change_pending() : !members_.change_pending()) return;
  const uint64_t next = machine_.calls() + 1;
  // Across hosts a lost host is masked only with mask_dead_ranks (Buffer::mask takes ranks of
  // this host only) in a TCP group: otherwise a death ends the buffer's use, named.
  if (multi_host() && !(cfg_.mask_dead_ranks && members_.can_mask_hosts())) {
    const int dead = members_.dead_unmasked();
    UBEP_CHECK(dead < 0, PeerFailedError, what, " (call ", next, "): rank ", dead, " ",
               members_.death_note(dead),
               members_.can_mask_hosts()
                   ? "; BufferConfig::mask_dead_ranks goes on without its host (docs/ELASTIC.md)"
                   : "; masking a lost host needs a TCP group (make_tcp_group, docs/ELASTIC.md)");
  }
  if (!dispatch) {  // agreements run at dispatches; this combine fails only if it cannot complete
    const int dead = members_.dead_unmasked();
    UBEP_CHECK(dead < 0, PeerFailedError, what, " (call ", next, "): rank ", dead, " ",
               members_.death_note(dead), "; dispatch again (with the rank masked)");
    const int ahead = members_.peer_ahead(next);
    UBEP_CHECK(ahead < 0, PeerFailedError, what, " (call ", next, "): rank ", ahead,
               " left to agree on a change of the group; dispatch again");
    return;
  }
  UBEP_CHECK_ARG(members_.can_mask_hosts(), what, ": masking ranks across ", group_.num_hosts(),
                 " hosts needs a TCP group (make_tcp_group, docs/ELASTIC.md)");
  WaitPolicy policy = waiter_.policy();
  policy.abort = nullptr;  // the agreement watches deaths and rounds itself
  if (shared) return agreement_->agree(this, policy, what);
  adopt(members_.agree(machine_.calls(), window_.seq(), cfg_.mask_dead_ranks, policy, what));
}

void HostEngine::begin_agreement(const char* what) {
  members_.pump();  // this Buffer's records from other hosts (the caller pumped its own)
  members_.begin_agreement(machine_.calls(), window_.seq(), cfg_.mask_dead_ranks, what);
}

bool HostEngine::poll_agreement(const char* what) {
  return members_.poll(cfg_.mask_dead_ranks, what);
}

void HostEngine::adopt(const Membership::Resume& resume) {
  machine_.ledger().resume_after(resume.calls);
  // +1: a rank that died may have begun one dispatch past the highest live one (it needs the
  // live ranks' count records to finish a dispatch, not to begin one), and its messages of that
  // dispatch may sit in our windows with that dispatch's tags; skipping its sequence number
  // keeps them from being taken for a new call's.
  window_.resume_after(resume.seq + 1);
  call_.set_masked(members_.masked_vector());
  if (relay_) relay_->abandon_call();  // what the calls of the old view left posted or queued
  machine_.forget_dispatch();
}

bool HostEngine::lost_a_rank() const {
  // A rank whose process ended while it was part of the group: the death watch wrote
  // kDeadWord for it. Not one that broke or departed first (its own word says so, and the
  // failure rules for broken buffers apply).
  for (int r = 0; r < ranks_; ++r)
    if (r != rank_ && !call_.masked(r) && members_.dead(r) &&
        protocol::is_dead(window_.failure_of(r)))
      return true;
  return false;
}

void HostEngine::mask(int r) {
  UBEP_CHECK_ARG(machine_.idle(), "mask: a split-phase call is outstanding");
  UBEP_CHECK_ARG(!multi_host(), "mask: masking ranks works on one host, the group spans ",
                 group_.num_hosts(), " (docs/ELASTIC.md)");
  members_.mask(r);
}

void HostEngine::rejoin() {
  UBEP_CHECK_ARG(machine_.idle(), "rejoin: a split-phase call is outstanding");
  members_.rejoin();
  machine_.ledger().reset();
}

}  // namespace ubep::ep
