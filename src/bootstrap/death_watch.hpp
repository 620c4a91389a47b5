// Liveness of the processes of this host's other ranks (docs/ELASTIC.md): a process that ends,
// even by SIGKILL, is known within milliseconds instead of at the next call's timeout.
//
// Mechanism: a pidfd per watched process (pidfd_open, Linux 5.3+), all in one epoll set, and
// one thread blocked in epoll_wait on it. A pidfd becomes readable when its process exits, so the
// thread sleeps in the kernel until a death (or a stop request through an eventfd): no polling,
// no core spent while every peer lives. Chosen over a robust lock held for life, which reports a
// death only to a thread that tries the lock (a poll again) and says nothing of how the process
// ended; the pidfd also gives the exit status (PIDFD_GET_INFO, Linux 6.15+; else read from
// /proc while the process is a zombie; else "exit status not visible").
//
// A process that is only stopped (SIGSTOP) or slow is not dead: its pidfd stays quiet, and the
// group's timeout still applies.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ubep::bootstrap {

class DeathWatch {
 public:
  // pids[r]: the process of rank r to watch, 0 for none (this rank, other hosts). A pid whose
  // pidfd cannot be opened (already gone) counts as dead at once.
  // before_published(pid): runs on the watch thread once a watched process has ended, before
  // dead() turns true (so before anyone can act on the death: a survivor that names it and
  // exits at once cannot outrun it), e.g. to unlink the segments it left named.
  explicit DeathWatch(const std::vector<pid_t>& pids,
                      std::function<void(pid_t)> before_published = {});
  ~DeathWatch();
  DeathWatch(const DeathWatch&) = delete;
  DeathWatch& operator=(const DeathWatch&) = delete;

  // Whether this watch works here (pidfd_open exists); when not, deaths show as timeouts.
  bool active() const { return epoll_fd_ >= 0; }
  int ranks() const { return ranks_; }
  // Acquire load, any thread: true once rank's process has ended (set before any subscriber
  // runs).
  bool dead(int rank) const;
  // "died (signal 9)", "exited with status 3", ...: empty while alive.
  std::string how(int rank) const;
  // The process watched for `rank` (the one that died, once dead() is true).
  pid_t pid_of(int rank) const;

  // fn(rank) runs on the watch thread once per death, after dead(rank) is true. unsubscribe
  // returns only once fn is not running and will not run again (so fn may capture its owner).
  // rewatch and revive_remote return only once every fn of the predecessor's death has returned,
  // so whatever a subscriber wrote for that death is there for the caller to undo, never after.
  int subscribe(std::function<void(int)> fn);
  void unsubscribe(int id);

  // A rank of another host died, as a notice from its host says (DeathNotices): dead() and the
  // subscribers as for a host-mate, how = what its host saw.
  // forwarded = false: judged here (a lost host, HostHeartbeat), `how` is said as given.
  void note_remote(int rank, const std::string& how, bool forwarded = true);
  // Local deaths are forwarded once per process: true for the first caller per rank.
  bool claim_forward(int rank);

  // A rank of another host is back (a replacement host's process connected, issue 32): alive
  // again, so its next death counts and is forwarded anew. Caller's thread, between calls.
  void revive_remote(int rank);
  // A replacement process now holds `rank` (rejoin): watch it instead, alive again.
  void rewatch(int rank, pid_t pid);

 private:
  void run();
  void watch_locked(int rank, pid_t pid);
  void record_death(int rank, uint32_t generation);

  struct Peer {
    pid_t pid = 0;
    int pidfd = -1;
    std::atomic<bool> dead{false};
    std::atomic<bool> forwarded{false};
    std::string how;
    // Which watch of this rank an epoll event belongs to (under info_mu_). Not the pidfd's
    // number: closing the old pidfd and opening the new one gives the same number back, so an
    // event of the dead predecessor that the thread already took would match the replacement.
    uint32_t generation = 0;
    // Held by a death's publication (dead set, subscribers run) and by rewatch/revive_remote:
    // one rank's publication never overlaps its revival (lock order: this, subs_mu_, info_mu_).
    std::mutex publish_mu;
  };
  std::unique_ptr<Peer[]> peers_;
  int ranks_ = 0;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  mutable std::mutex info_mu_;                         // guards Peer::pid/pidfd/how
  const std::function<void(pid_t)> before_published_;  // set before the thread starts
  // Guards subscribers_; held while they run, so unsubscribe waits for a running one.
  std::mutex subs_mu_;
  std::vector<std::pair<int, std::function<void(int)>>> subscribers_;
  int next_id_ = 0;
  std::thread thread_;
};

}  // namespace ubep::bootstrap
