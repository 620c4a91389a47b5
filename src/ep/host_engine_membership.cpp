// ep::HostEngine's side of elastic EP (docs/ELASTIC.md): agreeing on masked ranks at a
// dispatch, mask/rejoin, and telling a group change from a fault.
#include "bootstrap/death_watch.hpp"
#include "ep/host_engine.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

void HostEngine::settle_membership(const char* what, bool dispatch) {
  if (multi_host()) grp.pump_deaths();
  if (!members.change_pending()) return;
  const uint64_t next = ledger.calls() + 1;
  if (multi_host()) {  // no masking across hosts: a death ends the buffer's use, named
    const int dead = members.dead_unmasked();
    UBEP_CHECK(dead < 0, PeerFailedError, what, " (call ", next, "): rank ", dead, " ",
               members.death_note(dead), "; masking ranks works on one host (docs/ELASTIC.md)");
  }
  if (!dispatch) {  // agreements run at dispatches; this combine fails only if it cannot complete
    const int dead = members.dead_unmasked();
    UBEP_CHECK(dead < 0, PeerFailedError, what, " (call ", next, "): rank ", dead, " ",
               members.death_note(dead), "; dispatch again (with the rank masked)");
    const int ahead = members.peer_ahead(next);
    UBEP_CHECK(ahead < 0, PeerFailedError, what, " (call ", next, "): rank ", ahead,
               " left to agree on a change of the group; dispatch again");
    return;
  }
  UBEP_CHECK_ARG(!multi_host(), what, ": masking ranks works on one host, the group spans ",
                 grp.num_hosts(), " (docs/ELASTIC.md)");
  WaitPolicy policy = waiter.policy();
  policy.abort = nullptr;  // the agreement watches deaths and rounds itself
  const Membership::Resume resume =
      members.agree(ledger.calls(), win.seq(), cfg.mask_dead_ranks, policy, what);
  ledger.resume_after(resume.calls);
  // +1: a rank that died may have begun one dispatch past the highest live one (it needs the
  // live ranks' count records to finish a dispatch, not to begin one), and its messages of that
  // dispatch may sit in our windows with that dispatch's tags; skipping its sequence number
  // keeps them from being taken for a new call's.
  win.resume_after(resume.seq + 1);
  call.set_masked(members.masked_vector());
  have_dispatch = false;
}

bool HostEngine::lost_a_rank() const {
  // A rank whose process ended while it was part of the group: the death watch wrote
  // kDeadWord for it. Not one that broke or departed first (its own word says so, and the
  // failure rules for broken buffers apply).
  for (int r = 0; r < ranks; ++r)
    if (r != rank && !call.masked(r) && members.dead(r) && protocol::is_dead(win.failure_of(r)))
      return true;
  return false;
}

void HostEngine::mask(int r) {
  UBEP_CHECK_ARG(phase == Phase::kIdle, "mask: a split-phase call is outstanding");
  UBEP_CHECK_ARG(!multi_host(), "mask: masking ranks works on one host, the group spans ",
                 grp.num_hosts(), " (docs/ELASTIC.md)");
  members.mask(r);
}

void HostEngine::rejoin() {
  UBEP_CHECK_ARG(phase == Phase::kIdle, "rejoin: a split-phase call is outstanding");
  members.rejoin();
  ledger.reset();
}

}  // namespace ubep::ep
