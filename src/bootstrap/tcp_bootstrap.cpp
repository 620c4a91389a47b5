#include "bootstrap/tcp_bootstrap.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "core/log.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {

namespace {
using Clock = std::chrono::steady_clock;
constexpr uint32_t kHello = 0x55424854u;  // "UBHT"

[[noreturn]] void sys_fail(const std::string& what) {
  throw SystemError(detail::concat(what, ": ", std::strerror(errno)));
}
}  // namespace

sockaddr_in parse_endpoint(const std::string& text, const char* what) {
  const size_t colon = text.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  const std::string ip = colon == std::string::npos ? "" : text.substr(0, colon);
  const int port = colon == std::string::npos ? -1 : std::atoi(text.c_str() + colon + 1);
  UBEP_CHECK_ARG(inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1 && port > 0 && port < 65536, what,
                 " '", text, "': want IPv4:port, e.g. 10.77.0.1:29500");
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

namespace {
int new_socket() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) sys_fail("socket");
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

int listen_on(sockaddr_in addr) {
  const int fd = new_socket();
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
    const int err = errno;
    close(fd);
    errno = err;
    sys_fail(detail::concat("cannot listen on ", ip, ":", ntohs(addr.sin_port)));
  }
  return fd;
}

namespace {
// Waits (in slices of <= 10 ms, asking the death check) until fd is ready for `events`.
void wait_ready(int fd, short events, Clock::time_point until, const DeathCheck* deaths, int peer,
                const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, 10);
    if (n > 0) return;
    if (n < 0 && errno != EINTR) sys_fail(detail::concat("poll (", what, ")"));
    if (deaths) deaths->check(peer, [&] { return std::string(what); });
    if (Clock::now() > until)  // peer -1: not known yet (a hello, or a door asked by address)
      throw TimeoutError(
          detail::concat("timed out waiting for ",
                         peer < 0 ? std::string("a peer") : detail::concat("rank ", peer), " in ",
                         what, " (is its host's launcher running?)"));
  }
}

}  // namespace

int accept_one(int listener, Clock::time_point until, const char* what) {
  wait_ready(listener, POLLIN, until, nullptr, -1, what);
  const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) sys_fail(detail::concat("accept (", what, ")"));
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

namespace {
// One connect bounded by `until` (0, or the errno): non-blocking, so a peer that never answers
// (a cut cable: its SYNs dropped; a full backlog) costs at most the bound, not the kernel's SYN
// retries (minutes). The socket is blocking again afterwards, as the set-up expects.
int connect_until(int fd, const sockaddr_in& addr, Clock::time_point until) {
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int err = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 ? 0 : errno;
  while (err == EINPROGRESS || err == EINTR) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) {
      err = ETIMEDOUT;
      break;
    }
    pollfd p{fd, POLLOUT, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<long long>(left, 10)));
    if (n < 0 && errno != EINTR) {
      err = errno;
      break;
    }
    if (n <= 0) continue;  // err stays EINPROGRESS: wait on
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  }
  fcntl(fd, F_SETFL, flags);
  return err;
}
}  // namespace

namespace {
// connect_all's state for one address: its socket while a connect is under way, when to try again
// after a refusal, and whether it is connected (then fd is blocking again, as the set-up expects).
struct Pending {
  int fd = -1;
  Clock::time_point retry_at{};
  bool connected = false;
};

void start_connect(Pending& p, const sockaddr_in& addr, Clock::time_point now) {
  p.fd = new_socket();
  fcntl(p.fd, F_SETFL, fcntl(p.fd, F_GETFL) | O_NONBLOCK);
  const int err =
      connect(p.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 ? 0 : errno;
  if (err == 0) {
    fcntl(p.fd, F_SETFL, fcntl(p.fd, F_GETFL) & ~O_NONBLOCK);
    p.connected = true;
  } else if (err != EINPROGRESS && err != EINTR) {  // refused, unreachable: again in 10 ms
    close(p.fd);
    p.fd = -1;
    p.retry_at = now + std::chrono::milliseconds(10);
  }
}

// A connect under way reported (POLLOUT/POLLERR): connected, or closed to be tried again.
void finish_connect(Pending& p, Clock::time_point now) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err == 0) {
    fcntl(p.fd, F_SETFL, fcntl(p.fd, F_GETFL) & ~O_NONBLOCK);
    p.connected = true;
    return;
  }
  close(p.fd);
  p.fd = -1;
  p.retry_at = now + std::chrono::milliseconds(10);
}
}  // namespace

std::vector<int> connect_all(const std::vector<sockaddr_in>& addrs, Clock::time_point until,
                             const std::function<bool(size_t, int)>& on_connect) {
  std::vector<Pending> ps(addrs.size());
  std::vector<bool> done(addrs.size(), false);
  std::vector<pollfd> polled;
  std::vector<size_t> of;
  // At once on connecting (a peer may bound its wait for what follows): on_connect's false
  // closes it for good (-1, not tried again).
  const auto greet = [&](size_t i) {
    done[i] = true;
    if (on_connect && !on_connect(i, ps[i].fd)) {
      close(ps[i].fd);
      ps[i] = Pending{};
    }
  };
  try {
    for (;;) {
      const auto now = Clock::now();
      polled.clear();
      of.clear();
      bool open = false;
      for (size_t i = 0; i < ps.size(); ++i) {
        if (done[i]) continue;
        open = true;
        if (ps[i].fd < 0 && now >= ps[i].retry_at) start_connect(ps[i], addrs[i], now);
        if (ps[i].connected) {
          greet(i);
        } else if (ps[i].fd >= 0) {
          polled.push_back({ps[i].fd, POLLOUT, 0});
          of.push_back(i);
        }
      }
      if (!open || now > until) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
      // In slices of <= 10 ms: a refused address is tried again after 10 ms.
      const int n =
          poll(polled.data(), polled.size(), static_cast<int>(std::clamp<long long>(left, 0, 10)));
      if (n < 0 && errno != EINTR) sys_fail("poll (connect_all)");
      for (size_t k = 0; n > 0 && k < polled.size(); ++k) {
        if (!polled[k].revents) continue;
        finish_connect(ps[of[k]], Clock::now());
        if (ps[of[k]].connected) greet(of[k]);
      }
    }
  } catch (...) {
    for (const Pending& p : ps)
      if (p.fd >= 0) close(p.fd);
    throw;
  }
  std::vector<int> fds(ps.size(), -1);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (ps[i].connected)
      fds[i] = ps[i].fd;
    else if (ps[i].fd >= 0)
      close(ps[i].fd);  // still under way at the bound: a silent peer
  }
  return fds;
}

// Connects, retrying while nobody listens yet (its launcher may start later), within `until`.
int connect_to(sockaddr_in addr, Clock::time_point until, int peer, const char* what) {
  for (;;) {
    const int fd = new_socket();
    const int err = connect_until(fd, addr, until);
    if (err == 0) return fd;
    close(fd);
    if (Clock::now() > until) {
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
      throw TimeoutError(detail::concat(
          "timed out connecting to rank ", peer, " at ", ip, ":", ntohs(addr.sin_port), " (", what,
          "; last error: ", std::strerror(err), "; is its host's launcher running?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

namespace {
struct Hello {
  uint32_t magic;
  int32_t rank, size, host;
};
}  // namespace

// This host's IPv4 for the mesh: UBEP_TCP_IP, else what the hostname resolves to, else loopback
// when the rendezvous is on loopback (hosts as launchers on one machine).
in_addr own_ip(const sockaddr_in& rendezvous) {
  in_addr ip{};
  if (const char* env = std::getenv("UBEP_TCP_IP"); env && *env) {
    UBEP_CHECK_ARG(inet_pton(AF_INET, env, &ip) == 1, "UBEP_TCP_IP '", env, "' is not an IPv4");
    return ip;
  }
  if ((ntohl(rendezvous.sin_addr.s_addr) >> 24) == 127) return rendezvous.sin_addr;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  UBEP_CHECK_ARG(getaddrinfo(host, nullptr, &hints, &res) == 0 && res, "host '", host,
                 "' has no IPv4 address for the TCP mesh (set UBEP_TCP_IP)");
  ip = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return ip;
}

void send_all(int fd, const void* data, size_t bytes, Clock::time_point until,
              const DeathCheck* deaths, int peer, const char* what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    wait_ready(fd, POLLOUT, until, deaths, peer, what);
    const ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0)
      throw PeerFailedError(detail::concat("rank ", peer, " unreachable in ", what,
                                           " (send: ", std::strerror(errno), ")"));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void recv_all(int fd, void* data, size_t bytes, Clock::time_point until, const DeathCheck* deaths,
              int peer, const char* what) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    wait_ready(fd, POLLIN, until, deaths, peer, what);
    const ssize_t n = recv(fd, p, bytes, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0)
      throw PeerFailedError(detail::concat("rank ", peer, " lost in ", what, " (",
                                           n == 0 ? "connection closed" : std::strerror(errno),
                                           ")"));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

TcpBootstrap::TcpBootstrap(const TcpLaunch& launch, std::chrono::milliseconds timeout,
                           bool keep_listener)
    : launch_(launch),
      timeout_(timeout),
      rank_(launch.rank()),
      size_(launch.hosts * launch.ranks_per_host) {
  UBEP_CHECK_ARG(launch.hosts >= 1 && launch.ranks_per_host >= 1 && launch.host >= 0 &&
                     launch.host < launch.hosts && launch.local_rank >= 0 &&
                     launch.local_rank < launch.ranks_per_host,
                 "TcpLaunch: host ", launch.host, " of ", launch.hosts, ", local rank ",
                 launch.local_rank, " of ", launch.ranks_per_host, " is not a rank");
  const sockaddr_in rdv = parse_endpoint(launch.rendezvous, "rendezvous");
  const auto until = Clock::now() + timeout_;
  const Hello mine{kHello, rank_, size_, launch.host};
  if (rank_ == 0) {
    const int listener = listen_on(rdv);
    fds_.assign(static_cast<size_t>(size_), -1);
    try {
      for (int i = 1; i < size_; ++i) {
        const int fd = accept_one(listener, until, "the rendezvous (rank 0 accepting)");
        Hello h{};
        recv_all(fd, &h, sizeof h, until, nullptr, -1, "the rendezvous hello");
        if (h.magic != kHello || h.size != size_ || h.rank <= 0 || h.rank >= size_ ||
            fds_[static_cast<size_t>(h.rank)] >= 0) {
          close(fd);
          throw InvalidArgument(detail::concat("rendezvous: a hello from rank ", h.rank, " of ",
                                               h.size, " (magic ", h.magic,
                                               ") does not fit a group of ", size_));
        }
        fds_[static_cast<size_t>(h.rank)] = fd;
      }
    } catch (...) {
      close(listener);
      throw;
    }
    // An elastic group across hosts keeps the rendezvous open: a replacement host asks it for
    // the mesh (issue 32, RejoinDoor takes it over); otherwise nobody comes any more.
    if (keep_listener)
      listener_ = listener;
    else
      close(listener);
  } else {
    fds_.assign(1, connect_to(rdv, until, 0, "the rendezvous"));
    send_all(fds_[0], &mine, sizeof mine, until, nullptr, 0, "the rendezvous hello");
  }
  log::debug("tcp bootstrap: rank ", rank_, " of ", size_, " met at ", launch.rendezvous);
}

TcpBootstrap::~TcpBootstrap() {
  if (listener_ >= 0) close(listener_);
  for (int fd : fds_)
    if (fd >= 0) close(fd);
}

// Through rank 0: every rank sends its part, rank 0 sends the whole back.
void TcpBootstrap::allgather(const void* in, void* out, size_t bytes) {
  const auto until = Clock::now() + timeout_;
  auto* all = static_cast<char*>(out);
  if (rank_ != 0) {
    send_all(fds_[0], in, bytes, until, deaths_, 0, "the set-up allgather (to rank 0)");
    recv_all(fds_[0], all, bytes * static_cast<size_t>(size_), until, deaths_, 0,
             "the set-up allgather (from rank 0)");
    return;
  }
  std::memcpy(all, in, bytes);
  for (int r = 1; r < size_; ++r)
    recv_all(fds_[static_cast<size_t>(r)], all + bytes * static_cast<size_t>(r), bytes, until,
             deaths_, r, "the set-up allgather (rank 0 gathering)");
  for (int r = 1; r < size_; ++r)
    send_all(fds_[static_cast<size_t>(r)], all, bytes * static_cast<size_t>(size_), until, deaths_,
             r, "the set-up allgather (rank 0 sending)");
}

void TcpBootstrap::barrier() {
  char one = 1;
  std::vector<char> all(static_cast<size_t>(size_));
  allgather(&one, all.data(), 1);
}

std::vector<int> TcpBootstrap::host_map() {
  std::vector<int> hosts(static_cast<size_t>(size_));
  allgather(&launch_.host, hosts.data(), sizeof(int));
  return hosts;
}

Mesh connect_mesh(TcpBootstrap& boot, const std::vector<int>& host_of) {
  const int me = boot.rank(), n = boot.size();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr = own_ip(parse_endpoint(boot.launch().rendezvous, "rendezvous"));
  const int listener = listen_on(addr);
  socklen_t len = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::vector<sockaddr_in> all(static_cast<size_t>(n));
  std::vector<int> fds(static_cast<size_t>(n), -1);
  const auto until = Clock::now() + boot.timeout();
  try {
    boot.allgather(&addr, all.data(), sizeof addr);
    int expect = 0;  // lower ranks of other hosts connect to this one
    for (int q = 0; q < n; ++q) {
      if (q == me || host_of[static_cast<size_t>(q)] == host_of[static_cast<size_t>(me)]) continue;
      if (q < me) {
        ++expect;
        continue;
      }
      fds[static_cast<size_t>(q)] = connect_to(all[static_cast<size_t>(q)], until, q, "the mesh");
      const int32_t id = me;
      send_all(fds[static_cast<size_t>(q)], &id, sizeof id, until, boot.deaths(), q, "the mesh");
    }
    for (int i = 0; i < expect; ++i) {
      const int fd = accept_one(listener, until, "the mesh (accepting)");
      int32_t id = -1;
      recv_all(fd, &id, sizeof id, until, boot.deaths(), -1, "the mesh hello");
      if (id < 0 || id >= me || fds[static_cast<size_t>(id)] >= 0) {
        close(fd);
        throw InvalidArgument(detail::concat("mesh: rank ", me, " got a hello from rank ", id));
      }
      fds[static_cast<size_t>(id)] = fd;
    }
  } catch (...) {
    close(listener);
    for (int fd : fds)
      if (fd >= 0) close(fd);
    throw;
  }
  // Kept open (RejoinDoor): a replacement host's ranks connect here later (issue 32).
  return Mesh{std::move(fds), std::move(all), listener};
}

}  // namespace ubep::bootstrap
