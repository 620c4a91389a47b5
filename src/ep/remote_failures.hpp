// The failure words of a Buffer's ranks on other hosts (issue 32). A rank publishes its failure
// word (protocol.hpp: it rejected call N, its buffer broke in call N, it departed) into its
// host-mates' windows; ranks of other hosts have no window in common with it, so the word also
// goes to them as a notice through the group (GroupHooks::tell_call_failure, DeathNotices), and
// each arriving word is kept here, by rank. FailureWatch and the call ledger read a remote rank's
// word here as they read a host-mate's in the window: a rank waiting in the relay for a rank of
// another host that already failed the call stops at once, naming it, instead of at the timeout.
//
// Concurrency: one writer at a time per word -- the thread that pumps the group's notices (the
// caller's thread of a call: DeathNotices calls `on` under its watchers' lock, which
// unwatch_call_failures also takes, so no store lands after the destructor unwatched) and clear()
// (the caller's thread, in an agreement, between calls). Readers are any thread of a call
// (FailureWatch on the role threads, the ledger on the caller's). A word is self-contained (it
// names its call), so release/acquire on the one atomic is all the ordering needed.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "bootstrap/group_hooks.hpp"
#include "ubep/group.hpp"

namespace ubep::ep {

class RemoteFailures {
 public:
  // buffer: the Buffer's number on the group (the same on every rank).
  RemoteFailures(Group& group, int buffer)
      : group_(group), buffer_(buffer), words_(static_cast<size_t>(group.size())) {
    if (group.single_host()) return;
    watch_ = bootstrap::hooks_of(group).watch_call_failures(buffer, [this](int r, uint32_t w) {
      if (r >= 0 && r < static_cast<int>(words_.size()) && !group_.same_host(r, group_.rank()))
        words_[static_cast<size_t>(r)].store(w, std::memory_order_release);
    });
  }
  ~RemoteFailures() {
    if (watch_ >= 0) bootstrap::hooks_of(group_).unwatch_call_failures(watch_);
  }
  RemoteFailures(const RemoteFailures&) = delete;
  RemoteFailures& operator=(const RemoteFailures&) = delete;

  // Rank r's last word that arrived (0: none, or r is on this host: read its window instead).
  uint32_t word(int r) const {
    return words_[static_cast<size_t>(r)].load(std::memory_order_acquire);
  }
  // r came back as a new incarnation (an agreement took its replacement): its predecessor's word
  // goes, as a host-mate's does from the window.
  void clear(int r) { words_[static_cast<size_t>(r)].store(0, std::memory_order_release); }
  // This rank's new word, to every rank of the other hosts (caller's thread).
  void tell(uint32_t word) {
    if (!group_.single_host()) bootstrap::hooks_of(group_).tell_call_failure(buffer_, word);
  }

 private:
  Group& group_;
  int buffer_;
  std::vector<std::atomic<uint32_t>> words_;
  int watch_ = -1;
};

}  // namespace ubep::ep
