#include "bootstrap/tcp_rejoin.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "bootstrap/tcp_bootstrap.hpp"
#include "core/log.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {

namespace {
using Clock = std::chrono::steady_clock;
constexpr uint32_t kAskMesh = 0x5542524Du;  // "UBRM": a replacement asks rank 0 for the mesh
constexpr uint32_t kJoin = 0x5542524Au;     // "UBRJ": a replacement rank joins a live rank
// A live rank waits this long for a connection's hello inside its call loop (it is sent right
// after connecting); a replacement waits this long for a connection to a rank of a lost host.
constexpr auto kHelloBound = std::chrono::milliseconds(200);
constexpr auto kConnectBound = std::chrono::milliseconds(300);

struct AskMesh {
  uint32_t magic;
  int32_t rank, size, host;
};
struct Join {
  uint32_t magic;
  int32_t rank;
  uint32_t incarnation, pad;
  sockaddr_in listen;
  BeatAddr beat;
};

void non_blocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// A connection waiting on a non-blocking listener, or -1.
int try_accept(int listener) {
  if (listener < 0) return -1;
  const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return -1;  // EAGAIN: nobody; other errors: the peer gave up, nothing to take
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Collectives among the ranks of this host only (the live ranks of the other hosts are in their
// calls). A set-up allgather's entries of other hosts' ranks repeat this rank's own: every
// set-up exchange of a rejoining group reads only its host-mates' entries (pids, window names)
// or a verdict every rank gives alike (the windows' "mapped" flags).
class RejoinBootstrap final : public Bootstrap {
 public:
  RejoinBootstrap(std::unique_ptr<TcpBootstrap> local, const TcpLaunch& launch)
      : local_(std::move(local)), launch_(launch) {}
  int rank() const override { return launch_.rank(); }
  int size() const override { return launch_.hosts * launch_.ranks_per_host; }
  void allgather(const void* in, void* out, size_t bytes) override {
    const auto R = static_cast<size_t>(launch_.ranks_per_host);
    std::vector<char> mine(R * bytes);
    local_->allgather(in, mine.data(), bytes);
    auto* all = static_cast<char*>(out);
    for (int r = 0; r < size(); ++r) std::memcpy(all + static_cast<size_t>(r) * bytes, in, bytes);
    std::memcpy(all + static_cast<size_t>(launch_.host) * R * bytes, mine.data(), R * bytes);
  }
  void barrier() override { local_->barrier(); }
  std::vector<int> host_map() override {
    std::vector<int> hosts(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) hosts[static_cast<size_t>(r)] = r / launch_.ranks_per_host;
    return hosts;
  }

 private:
  std::unique_ptr<TcpBootstrap> local_;
  TcpLaunch launch_;
};

std::string ip_port(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return detail::concat(ip, ":", ntohs(a.sin_port));
}
}  // namespace

// ---- the live side ----------------------------------------------------------------------------

RejoinDoor::RejoinDoor(int rank, std::vector<int> host_of, std::vector<MeshEntry> mesh,
                       int mesh_listener, int rendezvous_listener, TakeFn take)
    : rank_(rank),
      host_of_(std::move(host_of)),
      mesh_(std::move(mesh)),
      mesh_listener_(mesh_listener),
      rendezvous_listener_(rendezvous_listener),
      take_(std::move(take)) {
  if (mesh_listener_ >= 0) non_blocking(mesh_listener_);
  if (rendezvous_listener_ >= 0) non_blocking(rendezvous_listener_);
}

RejoinDoor::~RejoinDoor() {
  if (mesh_listener_ >= 0) close(mesh_listener_);
  if (rendezvous_listener_ >= 0) close(rendezvous_listener_);
}

void RejoinDoor::pump() {
  for (int fd; (fd = try_accept(rendezvous_listener_)) >= 0;) serve_mesh(fd);
  for (int fd; (fd = try_accept(mesh_listener_)) >= 0;) take_rank(fd);
}

// Rank 0: a replacement host's local rank 0 asks for the mesh. Errors end only that
// connection (the replacement's set-up then fails or times out, named, on its side).
void RejoinDoor::serve_mesh(int fd) {
  try {
    const auto until = Clock::now() + kHelloBound;
    AskMesh ask{};
    recv_all(fd, &ask, sizeof ask, until, nullptr, -1, "a replacement's request for the mesh");
    const int n = static_cast<int>(mesh_.size());
    UBEP_CHECK_ARG(ask.magic == kAskMesh && ask.size == n && ask.rank > 0 && ask.rank < n &&
                       host_of_[static_cast<size_t>(ask.rank)] != host_of_[0],
                   "rejoin: a request for the mesh from rank ", ask.rank, " of ", ask.size,
                   " (magic ", ask.magic, ") does not fit this group of ", n,
                   " (host 0 cannot be replaced)");
    send_all(fd, mesh_.data(), mesh_.size() * sizeof(MeshEntry), until, nullptr, ask.rank,
             "the mesh for a replacement");
    log::info("rank ", rank_, ": sent the mesh to a replacement of rank ", ask.rank);
  } catch (const std::exception& e) {
    log::warn("rank ", rank_, ": a replacement's request for the mesh failed: ", e.what());
  }
  close(fd);
}

// Every live rank: a replacement rank connects. Its predecessor must be gone (lost or departed,
// as the transport or the death watch knows it); then the transport takes the connection.
void RejoinDoor::take_rank(int fd) {
  bool taken = false;
  Join j{};
  try {
    const auto until = Clock::now() + kHelloBound;
    recv_all(fd, &j, sizeof j, until, nullptr, -1, "a replacement rank's hello");
    const auto n = static_cast<int>(mesh_.size());
    UBEP_CHECK_ARG(
        j.magic == kJoin && j.rank >= 0 && j.rank < n &&
            host_of_[static_cast<size_t>(j.rank)] != host_of_[static_cast<size_t>(rank_)] &&
            j.incarnation > mesh_[static_cast<size_t>(j.rank)].incarnation,
        "rejoin: a hello from rank ", j.rank, " incarnation ", j.incarnation, " (magic ", j.magic,
        ") does not fit rank ", rank_, "'s group of ", n);
    taken = take_(j.rank, j.incarnation, fd, j.beat);
    const uint32_t answer = taken ? 1u : 0u;
    send_all(fd, &answer, sizeof answer, until, nullptr, j.rank, "the answer to a replacement");
  } catch (const std::exception& e) {
    log::warn("rank ", rank_, ": a replacement rank's connection failed: ", e.what());
    // Taken: the transport owns the fd and sees the failure itself; else it is ours to close.
  }
  if (!taken) {
    close(fd);
    return;
  }
  mesh_[static_cast<size_t>(j.rank)] = MeshEntry{j.listen, j.incarnation, 0, j.beat};
  log::info("rank ", rank_, ": rank ", j.rank, " is back as incarnation ", j.incarnation, " (",
            ip_port(j.listen), ")");
}

// ---- the replacement side ---------------------------------------------------------------------

namespace {
// Local rank 0 asks the rendezvous for the mesh; its host-mates get it over their star.
std::vector<MeshEntry> fetch_mesh(TcpBootstrap& local, const TcpLaunch& launch,
                                  Clock::time_point until) {
  const auto n = static_cast<size_t>(launch.hosts * launch.ranks_per_host);
  std::vector<MeshEntry> mesh(n);
  if (launch.local_rank == 0) {
    const int fd = connect_to(parse_endpoint(launch.rendezvous, "rendezvous"), until, 0,
                              "the rendezvous (a replacement asking for the mesh; does the live "
                              "group keep it open: TcpLaunch::elastic, UBEP_ELASTIC=1?)");
    try {
      const AskMesh ask{kAskMesh, launch.rank(), static_cast<int32_t>(n), launch.host};
      send_all(fd, &ask, sizeof ask, until, nullptr, 0, "the request for the mesh");
      recv_all(fd, mesh.data(), n * sizeof(MeshEntry), until, nullptr, 0,
               "the mesh from rank 0 (is this host's index right? host 0 cannot be replaced)");
    } catch (...) {
      close(fd);
      throw;
    }
    close(fd);
  }
  std::vector<MeshEntry> all(n * static_cast<size_t>(launch.ranks_per_host));
  local.allgather(mesh.data(), all.data(), n * sizeof(MeshEntry));
  return {all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n)};  // local rank 0's
}

// Connects to live rank q and says hello; -1 when q is unreachable (its host lost too).
int join_rank(const sockaddr_in& at, int q, const Join& hello, Clock::time_point until) {
  int fd = -1;
  try {
    fd = connect_to(at, std::min(until, Clock::now() + kConnectBound), q, "a live rank (rejoin)");
  } catch (const TimeoutError&) {
    return -1;
  }
  uint32_t answer = 0;
  try {
    send_all(fd, &hello, sizeof hello, until, nullptr, q, "the hello to a live rank");
    recv_all(fd, &answer, sizeof answer, until, nullptr, q, "a live rank's answer to the hello");
  } catch (const PeerFailedError&) {
    close(fd);
    return -1;
  } catch (...) {
    close(fd);
    throw;
  }
  if (answer != 1) {
    close(fd);
    throw PeerFailedError(detail::concat("rank ", hello.rank, " cannot rejoin: live rank ", q,
                                         " still holds its previous incarnation (not known lost)"));
  }
  return fd;
}
}  // namespace

Joined join_live_group(const TcpLaunch& launch, std::chrono::milliseconds timeout) {
  UBEP_CHECK_ARG(launch.hosts > 1 && launch.host > 0 && launch.host < launch.hosts, "rejoin: host ",
                 launch.host, " of ", launch.hosts,
                 " cannot be replaced (host 0 serves the rendezvous)");
  const auto until = Clock::now() + timeout;
  const sockaddr_in rdv = parse_endpoint(launch.rendezvous, "rendezvous");
  // The host's own star: its local rank 0 listens on the host's address, at the rendezvous'
  // port + 1 + host (distinct when hosts share an address, as launchers on one machine do).
  sockaddr_in star{};
  star.sin_family = AF_INET;
  star.sin_addr = own_ip(rdv);
  star.sin_port = htons(static_cast<uint16_t>(ntohs(rdv.sin_port) + 1 + launch.host));
  TcpLaunch local{ip_port(star), 1, 0, launch.ranks_per_host, launch.local_rank};
  auto boot = std::make_unique<TcpBootstrap>(local, timeout);
  Joined j;
  j.mesh = fetch_mesh(*boot, launch, until);
  const int me = launch.rank(), n = launch.hosts * launch.ranks_per_host;
  const uint32_t inc = j.mesh[static_cast<size_t>(me)].incarnation + 1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr = star.sin_addr;
  j.listener = listen_on(addr);
  socklen_t len = sizeof addr;
  getsockname(j.listener, reinterpret_cast<sockaddr*>(&addr), &len);
  BeatAddr beat;
  j.heartbeat = bind_heartbeat(me, n, inc, &beat);
  const Join hello{kJoin, me, inc, 0, addr, beat};
  j.fds.assign(static_cast<size_t>(n), -1);
  try {
    for (int q = 0; q < n; ++q) {
      if (q / launch.ranks_per_host == launch.host) {
        j.mesh[static_cast<size_t>(q)].incarnation = inc;  // the whole host comes back at once
        continue;
      }
      j.fds[static_cast<size_t>(q)] =
          join_rank(j.mesh[static_cast<size_t>(q)].addr, q, hello, until);
      if (j.fds[static_cast<size_t>(q)] < 0) j.unreachable.push_back(q);
    }
  } catch (...) {
    for (int fd : j.fds)
      if (fd >= 0) close(fd);
    close(j.listener);
    throw;
  }
  j.mesh[static_cast<size_t>(me)].addr = addr;
  j.mesh[static_cast<size_t>(me)].beat = beat;
  j.bootstrap = std::make_shared<RejoinBootstrap>(std::move(boot), launch);
  log::info("rank ", me, ": joined the live group as incarnation ", inc, " (", j.unreachable.size(),
            " ranks unreachable)");
  return j;
}

}  // namespace ubep::bootstrap
