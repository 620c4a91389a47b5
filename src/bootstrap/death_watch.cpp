#include "bootstrap/death_watch.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/log.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {

namespace {

// PIDFD_GET_INFO (Linux 6.15, <linux/pidfd.h>), spelled out: the build machine's headers
// predate it. An older kernel answers ENOTTY and the /proc fallback is used.
struct PidfdInfo {
  uint64_t mask;
  uint64_t cgroupid;
  uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int32_t exit_code;
};
static_assert(sizeof(PidfdInfo) == 64);
constexpr uint64_t kPidfdInfoExit = 1u << 3;
constexpr unsigned long kPidfdGetInfo = _IOWR(0xFF, 11, PidfdInfo);

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return detail::concat("died (signal ", WTERMSIG(status), ")");
  if (WIFEXITED(status)) return detail::concat("exited with status ", WEXITSTATUS(status));
  return detail::concat("ended (wait status ", status, ")");
}

// How process `pid` (whose pidfd is readable) ended, from whatever this kernel shows a process
// that is not its parent.
std::string how_it_ended(int pidfd, pid_t pid) {
  PidfdInfo info{};
  info.mask = kPidfdInfoExit;
  if (ioctl(pidfd, kPidfdGetInfo, &info) == 0 && (info.mask & kPidfdInfoExit))
    return describe_status(info.exit_code);
  // A zombie's /proc/<pid>/stat still has its exit code (field 52), until the parent reaps it.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (std::getline(stat, line)) {
    const size_t close = line.rfind(')');
    if (close != std::string::npos) {
      std::istringstream rest(line.substr(close + 2));
      std::string field;
      int index = 3;  // the state is field 3
      char state = 0;
      while (rest >> field) {
        if (index == 3) state = field[0];
        if (index == 52 && state == 'Z') return describe_status(std::stoi(field));
        ++index;
      }
    }
  }
  return "ended (exit status not visible to its peers)";
}

}  // namespace

DeathWatch::DeathWatch(const std::vector<pid_t>& pids, std::function<void(pid_t)> before_published)
    : peers_(new Peer[pids.size()]),
      ranks_(static_cast<int>(pids.size())),
      before_published_(std::move(before_published)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0)
    throw SystemError(detail::concat("death watch: epoll/eventfd: ", std::strerror(errno)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = ~0ull;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  const int probe = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  if (probe < 0) {
    log::warn("death watch: pidfd_open: ", std::strerror(errno),
              " (Linux < 5.3?): a dead peer is noticed at the timeout");
    close(epoll_fd_);
    close(wake_fd_);
    epoll_fd_ = wake_fd_ = -1;
    return;
  }
  close(probe);
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    for (int r = 0; r < ranks_; ++r)
      if (pids[static_cast<size_t>(r)] > 0) {
        watch_locked(r, pids[static_cast<size_t>(r)]);
        any = true;
      }
  }
  if (any) thread_ = std::thread([this] { run(); });
}

DeathWatch::~DeathWatch() {
  stop_.store(true, std::memory_order_release);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  for (int r = 0; r < ranks_; ++r)
    if (peers_[r].pidfd >= 0) close(peers_[r].pidfd);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void DeathWatch::watch_locked(int rank, pid_t pid) {
  Peer& p = peers_[rank];
  if (p.pidfd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.pidfd, nullptr);
    close(p.pidfd);
    p.pidfd = -1;
  }
  ++p.generation;  // the old watch's events no longer count (see below); wraps harmlessly
  p.pid = pid;
  p.how.clear();
  p.forwarded.store(false, std::memory_order_relaxed);
  p.pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (p.pidfd < 0) {  // gone before we looked (ESRCH), or no pidfds at all (ENOSYS)
    if (errno == ESRCH) {
      p.how = "ended before its peers could watch it";
      p.dead.store(true, std::memory_order_release);
    }
    return;
  }
  p.dead.store(false, std::memory_order_release);
  epoll_event ev{};
  ev.events = EPOLLIN;
  // The event names this watch's generation: after a rewatch, an event of the old process that
  // the thread already took must not count against the new one. (It named the pidfd before, and
  // the new pidfd gets the old one's number: ubep-elastic, CI of fec9263, a replacement masked at
  // its own incarnation and never served;
  // DeathWatch.AnEventOfThePredecessorDoesNotKillTheReplacement.)
  ev.data.u64 = static_cast<uint64_t>(p.generation) << 32 | static_cast<uint32_t>(rank);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, p.pidfd, &ev);
}

void DeathWatch::note_remote(int rank, const std::string& how, bool forwarded) {
  const std::lock_guard publishing(peers_[rank].publish_mu);
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    Peer& p = peers_[rank];
    if (p.dead.load(std::memory_order_relaxed)) return;
    p.how = forwarded ? how + " (on its host; forwarded)" : how;
    p.dead.store(true, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lock(subs_mu_);
  for (auto& [id, fn] : subscribers_) fn(rank);
}

// Concurrency: dead goes false only here, on the caller's thread between calls, for a rank the
// membership keeps masked until the replacement is agreed; readers on other threads that still
// saw it dead acted on a death the masking already covers. how is cleared under info_mu_ before
// the release store, so a reader that sees it alive (acquire) never reads the old death's how.
// The rank has no pidfd here (another host's), so the watch thread never writes it.
void DeathWatch::revive_remote(int rank) {
  const std::lock_guard publishing(peers_[rank].publish_mu);  // see rewatch
  std::lock_guard<std::mutex> lock(info_mu_);
  Peer& p = peers_[rank];
  UBEP_CHECK_ARG(p.pidfd < 0, "revive_remote: rank ", rank, " is watched on this host");
  p.how.clear();
  p.forwarded.store(false, std::memory_order_relaxed);
  p.dead.store(false, std::memory_order_release);
}

bool DeathWatch::claim_forward(int rank) {
  return !peers_[rank].forwarded.exchange(true, std::memory_order_acq_rel);
}

// A death published just before (dead set, subscribers not yet run: the watch thread was
// preempted between the two) must not reach the subscribers after the replacement is watched:
// a HostEngine clears its kDeadWord for the rank once the replacement is agreed, and a
// subscriber's late store put it back for good (a survivor then failed every dispatch naming
// the live replacement dead: 7,359 dispatches in 5 s, in 1 of 8 ubep-elastic runs under
// load). Holding the rank's publish_mu makes this wait for such a publication to finish; one
// that has not taken the lock yet finds the new generation and drops the stale event.
void DeathWatch::rewatch(int rank, pid_t pid) {
  if (epoll_fd_ < 0) return;
  const std::lock_guard publishing(peers_[rank].publish_mu);
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    watch_locked(rank, pid);
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

bool DeathWatch::dead(int rank) const {
  return rank >= 0 && rank < ranks_ && peers_[rank].dead.load(std::memory_order_acquire);
}

std::string DeathWatch::how(int rank) const {
  std::lock_guard<std::mutex> lock(info_mu_);
  return rank >= 0 && rank < ranks_ ? peers_[rank].how : std::string();
}

pid_t DeathWatch::pid_of(int rank) const {
  std::lock_guard<std::mutex> lock(info_mu_);
  return peers_[rank].pid;
}

int DeathWatch::subscribe(std::function<void(int)> fn) {
  std::lock_guard<std::mutex> lock(subs_mu_);
  subscribers_.emplace_back(next_id_, std::move(fn));
  return next_id_++;
}

void DeathWatch::unsubscribe(int id) {
  std::lock_guard<std::mutex> lock(subs_mu_);
  for (auto it = subscribers_.begin(); it != subscribers_.end(); ++it)
    if (it->first == id) {
      subscribers_.erase(it);
      return;
    }
}

void DeathWatch::record_death(int rank, uint32_t generation) {
  const std::lock_guard publishing(peers_[rank].publish_mu);  // see rewatch
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    Peer& p = peers_[rank];
    if (p.pidfd < 0 || p.generation != generation || p.dead.load(std::memory_order_relaxed)) return;
    p.how = how_it_ended(p.pidfd, p.pid);
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.pidfd, nullptr);
    close(p.pidfd);
    p.pidfd = -1;
    if (before_published_) before_published_(p.pid);
    // Release: a thread that sees dead() also sees how (and what before_published_ did).
    p.dead.store(true, std::memory_order_release);
  }
  log::info("rank ", rank, " ", how(rank));
  std::lock_guard<std::mutex> lock(subs_mu_);
  for (auto& [id, fn] : subscribers_) fn(rank);
}

// The watch thread: asleep in epoll_wait until a pidfd turns readable (its process ended) or the
// eventfd is written (stop). Nothing here polls.
void DeathWatch::run() {
  pthread_setname_np(pthread_self(), "ubep-deathwatch");  // so its cost can be read in /proc
  epoll_event events[16];
  while (!stop_.load(std::memory_order_acquire)) {
    const int n = epoll_wait(epoll_fd_, events, 16, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      log::warn("death watch: epoll_wait: ", std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == ~0ull) continue;  // the stop request: checked by the loop
      record_death(static_cast<int>(events[i].data.u64 & 0xFFFFFFFFu),
                   static_cast<uint32_t>(events[i].data.u64 >> 32));
    }
  }
}

}  // namespace ubep::bootstrap
