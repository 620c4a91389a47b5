// Deaths across hosts (docs/ELASTIC.md): a process group that spans hosts forwards the deaths
// its death watch sees on this host to every rank of the other hosts, through the transport the
// relay uses, and takes theirs into its own watch (DeathWatch::note_remote), so a rank waiting
// on a dead rank of another host gets the named PeerFailedError instead of the timeout.
//
// The same messages carry a Buffer's failure word to the other hosts (issue 32): a rank that
// rejects a call, breaks, or departs publishes its word into its host-mates' windows; ranks of
// other hosts share no window with it, so without a notice they waited in the relay for its part
// until the timeout. A notice names the Buffer by its number on the group
// (GroupHooks::next_buffer_number, the same on every rank) and reaches that Buffer's watcher.
//
// One per process group; only the caller's thread of a call pumps it (the transport is used
// from one thread at a time, like the relay's), from inside every caller wait.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <utility>
#include <vector>

#include "bootstrap/death_watch.hpp"
#include "transport/remote.hpp"

namespace ubep::bootstrap {

class DeathNotices {
 public:
  // Beside the mesh's (7105-7106), the relay's (8192 up) and the membership records' (24576 up).
  static constexpr int kTag = 7103;
  DeathNotices(transport::Remote& remote, DeathWatch& watch, int rank,
               const std::vector<int>& host_of);
  ~DeathNotices();
  DeathNotices(const DeathNotices&) = delete;
  DeathNotices& operator=(const DeathNotices&) = delete;

  void pump();
  // Progresses the notices this rank sent until they are delivered or `bound` has passed: a rank
  // that stops calling the transport once it has named a death (it throws, then does something
  // else) must not keep its notice from the other hosts. Caller's thread, like pump().
  void flush(std::chrono::milliseconds bound);

  // Buffer number `buffer`'s failure word on this rank, to every rank of the other hosts, then
  // flushed (bounded, as above: the rank may not call the transport again soon). Caller's thread.
  void tell_call_failure(int buffer, uint32_t word);
  // Calls `on(rank, word)` for every failure word of Buffer number `buffer` that arrives from a
  // rank of another host (on the thread that pumps, under a lock that unwatch also takes, so a
  // watcher is never called once unwatch returned); returns the id for unwatch.
  int watch_call_failures(int buffer, std::function<void(int, uint32_t)> on);
  void unwatch_call_failures(int id);

 private:
  enum Outcome { kPending, kDone, kDropped };
  Outcome settle(int& req);
  void post(size_t i);  // the receive from remotes_[i]
  // kind: kDeath (rank died, how says how) or kCallFailure (rank's Buffer number `buffer`
  // published `word`). One size for both, so one receive per remote rank takes either.
  enum Kind : int32_t { kDeath = 0, kCallFailure = 1 };
  struct Notice {
    int32_t rank = -1;
    int32_t kind = kDeath;
    int32_t buffer = 0;
    uint32_t word = 0;
    char how[60] = {};
  };
  void deliver(int from, const Notice& n);
  struct Outgoing {  // a failure notice in flight: its message lives until the send is done
    Notice notice;
    int request = -1;
  };
  struct Watcher {
    int id, buffer;
    std::function<void(int, uint32_t)> on;
  };
  transport::Remote& remote_;
  DeathWatch& watch_;
  int rank_;
  std::vector<int> host_of_;
  std::vector<int> remotes_;     // ranks of other hosts
  std::vector<Notice> inbox_;    // one posted receive per remote rank
  std::vector<int> recv_;        // its request (-1: none)
  std::vector<uint32_t> epoch_;  // the peer's connection it was posted on (Remote::epoch)
  std::vector<Notice> outbox_;   // notices in flight (stable: reserved)
  std::vector<int> send_;        // their requests (-1: done)
  // Failure notices in flight (a list: their addresses stay valid while others are erased).
  std::list<Outgoing> failures_out_;
  // Watchers of failure notices: added and removed by Buffers (any thread), called by the
  // pumping thread; the mutex orders the two.
  std::mutex watchers_mu_;
  std::vector<Watcher> watchers_;
  int next_watcher_ = 0;
};

}  // namespace ubep::bootstrap
