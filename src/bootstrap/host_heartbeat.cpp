#include "bootstrap/host_heartbeat.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ubep/error.hpp"

namespace ubep::bootstrap {

namespace {
constexpr uint32_t kMagic = 0x55424842;  // "UBHB"
constexpr uint64_t kGoodbye = ~uint64_t{0};
struct Beat {
  uint32_t magic;
  int32_t host;
  uint64_t seq;
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

void HostHeartbeat::start(const std::vector<Peer>& peers, LostFn on_lost) {
  UBEP_CHECK_ARG(!thread_.joinable(), "HostHeartbeat: started twice");
  for (const Peer& p : peers) {
    UBEP_CHECK_ARG(p.host >= 0 && p.host < hosts_ && p.host != self_ && index_of_[p.host] < 0,
                   "HostHeartbeat: bad or repeated peer host ", p.host);
    index_of_[p.host] = static_cast<int>(to_.size());
    to_.push_back(address_of(p.ip, p.port));
    peer_host_.push_back(p.host);
  }
  last_seen_.assign(to_.size(), Clock::now());
  departed_.assign(to_.size(), false);
  on_lost_ = std::move(on_lost);
  thread_ = std::thread([this] { run(); });  // everything above happens-before the thread
}

bool HostHeartbeat::heard(int host) const {
  return host >= 0 && host < hosts_ && heard_[host].load(std::memory_order_acquire);
}

bool HostHeartbeat::lost(int host) const {
  return host >= 0 && host < hosts_ && lost_[host].load(std::memory_order_acquire);
}

void HostHeartbeat::send_beats(uint64_t seq) {
  Beat b{kMagic, self_, seq};
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
    if (i < 0) continue;
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
  uint64_t seq = 0;
  auto next_send = Clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    auto now = Clock::now();
    if (now >= next_send) {
      send_beats(seq++);
      next_send += opt_.period;
      if (next_send < now) next_send = now + opt_.period;  // late: no burst of catch-up beats
    }
    pollfd p{fd_, POLLIN, 0};
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_send - now).count();
    (void)poll(&p, 1, static_cast<int>(wait < 0 ? 0 : wait + 1));
    now = Clock::now();
    drain(now);  // first: only what a sender failed to send counts as silence
    for (size_t i = 0; i < to_.size(); ++i) {
      int host = peer_host_[i];
      if (departed_[i] || lost_[host].load(std::memory_order_relaxed)) continue;
      auto silent = now - last_seen_[i];
      if (silent <=
          (heard_[host].load(std::memory_order_relaxed) ? opt_.threshold : opt_.startup_grace))
        continue;
      // Under verdict_mu_: forget() must not return while a verdict is under way (see there).
      std::lock_guard<std::mutex> lock(verdict_mu_);
      if (lost_[host].load(std::memory_order_relaxed)) continue;  // forgotten meanwhile
      lost_[host].store(true, std::memory_order_release);
      if (on_lost_) on_lost_(host, silent);
    }
  }
}

void HostHeartbeat::forget(int host) {
  if (host < 0 || host >= hosts_) return;
  std::lock_guard<std::mutex> lock(verdict_mu_);
  lost_[host].store(true, std::memory_order_release);
}

}  // namespace ubep::bootstrap
