// Deaths of a group's processes, for waits that run outside a Buffer's calls on several threads
// at once (the expert layer's roles, src/moe): a wait on one peer ends as soon as that peer's
// process has died, naming it, instead of at the timeout (issue 29: every wait watches deaths).
//
// Correctness: only the group's DeathWatch flags are read (DeathWatch::dead is an acquire load
// of a flag the watch thread stores with release after recording how the rank ended), so any
// thread may ask at any time. Notices from other hosts are not pumped here: only the caller's
// thread may touch the transport (death_notices.hpp), and the waits this serves are between
// ranks of one host. Groups without a watch (threads of one process) wait as before.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "bootstrap/death_check.hpp"
#include "bootstrap/group_hooks.hpp"
#include "core/wait.hpp"

namespace ubep::ep {

class PeerDeaths {
 public:
  explicit PeerDeaths(Group& group) {
    if (const bootstrap::DeathWatch* w = bootstrap::hooks_of(group).death_watch())
      check_.emplace(*w, nullptr, group.rank());
  }

  // wait_until(ready, policy, what), ended by PeerFailedError once rank `awaited` has died.
  template <typename Ready>
  void wait_for(int awaited, Ready&& ready, const WaitPolicy& policy,
                const std::function<std::string()>& what) const {
    bootstrap::DeathAbort abort(check_ ? &*check_ : nullptr, awaited, what);
    wait_until(std::forward<Ready>(ready), abort.applied_to(policy), what);
  }

 private:
  std::optional<bootstrap::DeathCheck> check_;
};

}  // namespace ubep::ep
