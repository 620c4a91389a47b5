#include "ep/group_agreement.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "ubep/error.hpp"

namespace ubep::ep {

namespace {
// The agreements of the groups of this process that have such Buffers now: made by the first
// Buffer that joins, gone with the last (a later group at the same address finds it expired).
std::mutex registry_mu;
std::map<const Group*, std::weak_ptr<GroupAgreement>>& registry() {
  static std::map<const Group*, std::weak_ptr<GroupAgreement>> r;
  return r;
}
}  // namespace

std::shared_ptr<GroupAgreement> GroupAgreement::join(Group& group, Member* m) {
  std::shared_ptr<GroupAgreement> a;
  {
    const std::lock_guard lock(registry_mu);
    std::erase_if(registry(), [](const auto& kv) { return kv.second.expired(); });
    std::weak_ptr<GroupAgreement>& slot = registry()[&group];
    a = slot.lock();
    if (!a) {
      a = std::make_shared<GroupAgreement>();
      slot = a;
    }
  }
  const std::lock_guard lock(a->mu_);
  a->members_.push_back(m);
  std::sort(a->members_.begin(), a->members_.end(), [](const Member* x, const Member* y) {
    return x->buffer_number() < y->buffer_number();
  });
  return a;
}

void GroupAgreement::leave(Member* m) {
  const std::lock_guard lock(mu_);
  std::erase(members_, m);
}

std::vector<GroupAgreement::Member*> GroupAgreement::snapshot() const {
  const std::lock_guard lock(mu_);
  return members_;
}

bool GroupAgreement::change_pending() {
  const std::vector<Member*> ms = snapshot();
  for (Member* m : ms) m->pump_records();  // a replacement is taken once all have its records
  for (const Member* m : ms)
    if (m->change_pending()) return true;
  return false;
}

bool GroupAgreement::replaced_elsewhere(int rank, const Member* except) const {
  for (const Member* m : snapshot())
    if (m != except && !m->replaced_here(rank)) return false;
  return true;
}

void GroupAgreement::agree(const Member* caller, const WaitPolicy& policy, const char* what) {
  const std::vector<Member*> ms = snapshot();
  for (const Member* m : ms)
    UBEP_CHECK_ARG(m == caller || m->between_calls(), what,
                   ": the group's membership changed and its Buffers agree on it together, but "
                   "Buffer number ",
                   m->buffer_number(),
                   " of this group has a split-phase call outstanding; finish it first "
                   "(docs/ELASTIC.md)");
  // 1. Every member's new round out before any wait: a peer held in a call of any of them sees
  // this rank left it and abandons that call instead of waiting for it.
  for (Member* m : ms) m->begin_agreement(what);
  // 2. One wait over all of them; each concluded stays so (its records do not change again
  // until the next change, agreements end the same on every live rank).
  std::vector<bool> done(ms.size(), false);
  wait_until(
      [&] {
        bool all = true;
        for (size_t i = 0; i < ms.size(); ++i) {
          if (!done[i]) done[i] = ms[i]->poll_agreement(what);
          all = all && done[i];
        }
        return all;
      },
      policy,
      [&] {
        std::string state;
        for (size_t i = 0; i < ms.size(); ++i)
          if (!done[i])
            state += detail::concat(state.empty() ? "" : "; ", "Buffer number ",
                                    ms[i]->buffer_number(), ": ", ms[i]->agreement_state(what));
        return state;
      });
  // 3. Each resumes at its own agreed call.
  for (Member* m : ms) m->finish_agreement();
  // 4. With two Buffers or more, this call ends here, unsent: ranks reach the agreement at a
  // dispatch of different Buffers (one completed A's call that the others abandoned, and came in
  // at B's), so the first call after it would be A on some ranks and B on others, each waiting
  // for the other. Every rank that agreed fails exactly this one call, and the application
  // starts its step again at its first Buffer (docs/ELASTIC.md): every rank then calls the
  // Buffers in one order again, in the new view.
  if (ms.size() > 1)
    throw PeerFailedError(detail::concat(
        what, ": the group changed and its ", ms.size(),
        " Buffers agreed on the new view at this call, which did not start (nothing sent): "
        "call again from the first Buffer of the step (docs/ELASTIC.md)"));
}

}  // namespace ubep::ep
