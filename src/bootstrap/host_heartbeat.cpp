#include "bootstrap/host_heartbeat.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ubep/error.hpp"

namespace ubep::bootstrap {

namespace {
constexpr uint32_t kMagic = 0x55424842;  // "UBHB"
constexpr uint32_t kGoodbye = ~uint32_t{0};
struct Beat {
  uint32_t magic;
  int32_t host;
  uint32_t incarnation;  // the sender's: a replacement's beats are told from its predecessor's
  uint32_t seq;          // wraps after 497 days at 10 ms; only kGoodbye means anything
};
using Clock = std::chrono::steady_clock;

sockaddr_in address_of(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  UBEP_CHECK_ARG(inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1, "HostHeartbeat: bad IPv4 '", ip,
                 "'");
  return a;
}
}  // namespace

HostHeartbeat::HostHeartbeat(int self_host, int hosts, const std::string& bind_ip, uint16_t port,
                             Options opt)
    : self_(self_host), hosts_(hosts), opt_(opt) {
  UBEP_CHECK_ARG(hosts >= 2, "HostHeartbeat: hosts ", hosts, " < 2");
  UBEP_CHECK_ARG(self_host >= 0 && self_host < hosts, "HostHeartbeat: self_host ", self_host,
                 " not in [0, ", hosts, ")");
  UBEP_CHECK_ARG(opt.period.count() > 0 && opt.threshold > opt.period, "HostHeartbeat: period ",
                 opt.period.count(), " ms must be > 0 and < threshold ", opt.threshold.count(),
                 " ms");
  sockaddr_in a = address_of(bind_ip, port);
  fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  UBEP_CHECK(fd_ >= 0, SystemError, "HostHeartbeat: socket: ", std::strerror(errno));
  if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int e = errno;
    close(fd_);
    UBEP_CHECK(false, SystemError, "HostHeartbeat: bind ", bind_ip, ":", port, ": ",
               std::strerror(e));
  }
  socklen_t len = sizeof a;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  lost_ = std::make_unique<std::atomic<bool>[]>(hosts);
  heard_ = std::make_unique<std::atomic<bool>[]>(hosts);
  index_of_.assign(hosts, -1);
}

void HostHeartbeat::go_silent() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
  silent_ = true;
}

HostHeartbeat::~HostHeartbeat() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable() && !silent_) {
    thread_.join();  // the thread looks at stop_ at least every period
    // A clean end says goodbye, so the peers still running do not take it for a lost host (a
    // goodbye that is dropped makes it look lost: the same as a crash at that moment).
    send_beats(kGoodbye);
  }
  close(fd_);
}

void HostHeartbeat::start(const std::vector<Peer>& peers, LostFn on_lost,
                          std::vector<int> group_of) {
  UBEP_CHECK_ARG(!thread_.joinable(), "HostHeartbeat: started twice");
  if (group_of.empty())
    for (int h = 0; h < hosts_; ++h) group_of.push_back(h);
  UBEP_CHECK_ARG(static_cast<int>(group_of.size()) == hosts_, "HostHeartbeat: group_of has ",
                 group_of.size(), " entries for ", hosts_, " hosts");
  for (int g : group_of)
    UBEP_CHECK_ARG(g >= 0 && g < hosts_, "HostHeartbeat: group ", g, " not in [0, ", hosts_, ")");
  group_of_ = std::move(group_of);
  vouched_.assign(static_cast<size_t>(hosts_), 0);
  for (const Peer& p : peers) {
    UBEP_CHECK_ARG(p.host >= 0 && p.host < hosts_ && p.host != self_ && index_of_[p.host] < 0,
                   "HostHeartbeat: bad or repeated peer host ", p.host);
    index_of_[p.host] = static_cast<int>(to_.size());
    to_.push_back(address_of(p.ip, p.port));
    peer_host_.push_back(p.host);
  }
  last_seen_.assign(to_.size(), Clock::now());
  departed_.assign(to_.size(), false);
  min_incarnation_.assign(to_.size(), 0);
  on_lost_ = std::move(on_lost);
  thread_ = std::thread([this] { run(); });  // everything above happens-before the thread
}

bool HostHeartbeat::heard(int host) const {
  return host >= 0 && host < hosts_ && heard_[host].load(std::memory_order_acquire);
}

bool HostHeartbeat::lost(int host) const {
  return host >= 0 && host < hosts_ && lost_[host].load(std::memory_order_acquire);
}

void HostHeartbeat::send_beats(uint32_t seq) {
  Beat b{kMagic, self_, opt_.incarnation, seq};
  for (const sockaddr_in& to : to_) {
    // Errors (ENETDOWN, ENETUNREACH, ECONNREFUSED from an earlier ICMP) are the peers' silence
    // by another name: the judgement below decides, not the send.
    (void)sendto(fd_, &b, sizeof b, MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&to), sizeof to);
  }
}

void HostHeartbeat::drain(Clock::time_point now) {
  Beat b;
  for (int n = 0; n < 4096; ++n) {  // bounded: a flood cannot keep the thread here
    ssize_t got = recv(fd_, &b, sizeof b, MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR || errno == ECONNREFUSED) continue;
      return;  // EAGAIN: empty
    }
    if (got != sizeof b || b.magic != kMagic || b.host < 0 || b.host >= hosts_) continue;
    int i = index_of_[b.host];
    if (i < 0 || b.incarnation < min_incarnation_[i]) continue;
    last_seen_[i] = now;
    if (b.seq == kGoodbye) departed_[i] = true;
    if (!heard_[b.host].load(std::memory_order_relaxed))
      heard_[b.host].store(true, std::memory_order_release);
  }
}

void HostHeartbeat::run() {
  // A starved sender is a false verdict: with ranks spinning on every core (and other load), a
  // normal thread was measured silent for > 60 ms (vhosts_mpi_3x2 under 8 busy loops: 1 run in
  // 3). SCHED_FIFO puts this thread, which sleeps almost all the time, before every normal one.
  // Needs CAP_SYS_NICE (or an RLIMIT_RTPRIO); without it, the threshold must allow for the load.
  sched_param prio{};
  prio.sched_priority = 1;
  rt_ = pthread_setschedparam(pthread_self(), SCHED_FIFO, &prio) == 0;
  uint32_t seq = 0;
  auto next_send = Clock::now();
  auto last_turn = next_send;
  while (!stop_.load(std::memory_order_relaxed)) {
    auto now = Clock::now();
    apply_rearms(now);
    if (now >= next_send) {
      send_beats(seq++);
      next_send += opt_.period;
      if (next_send < now) next_send = now + opt_.period;  // late: no burst of catch-up beats
      if (seq == kGoodbye) seq = 0;
    }
    pollfd p{fd_, POLLIN, 0};
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_send - now).count();
    (void)poll(&p, 1, static_cast<int>(wait < 0 ? 0 : wait + 1));
    now = Clock::now();
    drain(now);  // first: only what a sender failed to send counts as silence
    discount_own_stall(now - last_turn, now);
    last_turn = now;
    find_vouched(now);
    for (size_t i = 0; i < to_.size(); ++i) {
      int host = peer_host_[i];
      if (departed_[i] || lost_[host].load(std::memory_order_relaxed)) continue;
      auto silent = now - last_seen_[i];
      if (silent <=
          (heard_[host].load(std::memory_order_relaxed) ? opt_.threshold : opt_.startup_grace))
        continue;
      if (vouched_[static_cast<size_t>(group_of_[static_cast<size_t>(host)])]) continue;
      // Under verdict_mu_: forget() must not return while a verdict is under way (see there).
      std::lock_guard<std::mutex> lock(verdict_mu_);
      if (lost_[host].load(std::memory_order_relaxed)) continue;  // forgotten meanwhile
      lost_[host].store(true, std::memory_order_release);
      if (on_lost_) on_lost_(host, silent);
    }
  }
}

// Which machines are alive by their beats: a group is vouched for by any host of it that was heard
// (since its rearm, if any), has not said goodbye or been judged or forgotten, and beat within the
// threshold. One in its start-up grace does not vouch: it has not shown it runs. CI stop 46
// (vhosts_tcp_host_rejoin): rank 1 named rank 3's host lost and rank 2 named rank 0's, 60-69 ms,
// while ranks 1 and 2 ran and beat (each was a judge); a sender silent while its machine-mate beats
// is not a lost machine. Heartbeat thread only, like last_seen_.
void HostHeartbeat::find_vouched(Clock::time_point now) {
  std::fill(vouched_.begin(), vouched_.end(), 0);
  for (size_t i = 0; i < to_.size(); ++i) {
    const int host = peer_host_[i];
    if (departed_[i] || lost_[host].load(std::memory_order_relaxed) ||
        !heard_[host].load(std::memory_order_relaxed) || now - last_seen_[i] > opt_.threshold)
      continue;
    vouched_[static_cast<size_t>(group_of_[static_cast<size_t>(host)])] = 1;
  }
}

// A turn normally ends within one period (+1 ms of poll rounding) of the last. A much later one
// means this thread did not run: the machine or VM was descheduled (steal), the process stopped,
// the host suspended. Beats that live peers sent meanwhile were drained just now; but where the
// stall was shared (virtual hosts on one kernel, a VM's vCPUs stolen together: measured, CI
// stop 45, every rank of 3 hosts "silent for 61-69 ms" at once), the peers sent nothing either,
// and counting that time would name every host lost. So silence counts only time this thread
// was awake: every peer's last_seen_ moves on by the stall's excess, never past `now`. A host
// that really died is then named later by at most the stall's length; its peers that did not
// stall name it on time. Single-threaded: last_seen_ belongs to the heartbeat thread.
void HostHeartbeat::discount_own_stall(Clock::duration since_last_turn, Clock::time_point now) {
  const auto expected = opt_.period + std::chrono::milliseconds(1);
  if (since_last_turn <= 2 * expected) return;  // scheduling jitter: counted as silence
  const auto excess = since_last_turn - expected;
  for (auto& seen : last_seen_) seen = std::min(seen + excess, now);
  stalls_.fetch_add(1, std::memory_order_relaxed);
}

void HostHeartbeat::forget(int host) {
  if (host < 0 || host >= hosts_) return;
  std::lock_guard<std::mutex> lock(verdict_mu_);
  lost_[host].store(true, std::memory_order_release);
}

void HostHeartbeat::rearm(int host, const std::string& ip, uint16_t port, uint32_t incarnation) {
  UBEP_CHECK_ARG(host >= 0 && host < hosts_ && host != self_, "HostHeartbeat: rearm of bad host ",
                 host);
  const sockaddr_in to = address_of(ip, port);
  std::lock_guard<std::mutex> lock(verdict_mu_);
  // As forget(): from here no verdict names `host` until the thread has applied the rearm.
  lost_[host].store(true, std::memory_order_release);
  rearms_.push_back({host, to, incarnation});
}

// On the heartbeat thread, the only one that touches the per-peer vectors after start(); under
// verdict_mu_, so a rearm is applied whole between two verdicts. lost_ goes false last: until
// then no verdict can name the host, and from then it is judged from `now` (start-up grace until
// the new incarnation's first beat: heard_ false).
void HostHeartbeat::apply_rearms(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(verdict_mu_);
  for (const Rearm& r : rearms_) {
    int i = index_of_[r.host];
    if (i < 0) {  // not a peer before (no address then): one from now on
      i = index_of_[r.host] = static_cast<int>(to_.size());
      to_.push_back(r.to);
      peer_host_.push_back(r.host);
      last_seen_.push_back(now);
      departed_.push_back(false);
      min_incarnation_.push_back(0);
    }
    to_[i] = r.to;
    last_seen_[i] = now;
    departed_[i] = false;
    min_incarnation_[i] = r.incarnation;
    heard_[r.host].store(false, std::memory_order_release);
    lost_[r.host].store(false, std::memory_order_release);
  }
  rearms_.clear();
}

}  // namespace ubep::bootstrap
