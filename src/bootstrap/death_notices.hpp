// Deaths across hosts (docs/ELASTIC.md): a process group that spans hosts forwards the deaths
// its death watch sees on this host to every rank of the other hosts, through the transport the
// relay uses, and takes theirs into its own watch (DeathWatch::note_remote), so a rank waiting
// on a dead rank of another host gets the named PeerFailedError instead of the timeout.
//
// One per process group; only the caller's thread of a call pumps it (the transport is used
// from one thread at a time, like the relay's), from inside every caller wait.
#pragma once

#include <chrono>
#include <cstdint>
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

 private:
  enum Outcome { kPending, kDone, kDropped };
  Outcome settle(int& req);
  void post(size_t i);  // the receive from remotes_[i]
  struct Notice {
    int32_t rank = -1;
    char how[60] = {};
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
};

}  // namespace ubep::bootstrap
