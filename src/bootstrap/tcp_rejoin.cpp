#include "bootstrap/tcp_rejoin.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "bootstrap/tcp_bootstrap.hpp"
#include "core/log.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {

namespace {
using Clock = std::chrono::steady_clock;
constexpr uint32_t kAskMesh = 0x5542524Du;  // "UBRM": a replacement asks a door for the mesh
constexpr uint32_t kJoin = 0x5542524Au;     // "UBRJ": a replacement rank joins a live rank
// A live rank waits this long for a connection's hello inside its call loop (it is sent right
// after connecting); a replacement waits this long for a connection to a rank of a lost host.
constexpr auto kHelloBound = std::chrono::milliseconds(200);
constexpr auto kConnectBound = std::chrono::milliseconds(300);
// A replacement asks the doors again for this long when none answered: a host whose cable just
// came back may drop its first frames for up to a second (the kernel applies a carrier change
// to the bridge port late, and a lost ARP request is retried only after 1 s), longer than one
// connect bound. Bounded, so a replacement without any live group still fails by name.
constexpr auto kDoorWindow = std::chrono::seconds(2);

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

// ---- the doors --------------------------------------------------------------------------------

namespace {
// The hosts' IPv4s (TcpLaunch::host_ips, else UBEP_HOST_IPS), or none.
std::vector<in_addr> host_ips(const TcpLaunch& launch) {
  std::vector<std::string> text = launch.host_ips;
  const char* env = std::getenv("UBEP_HOST_IPS");
  if (text.empty() && env && *env) {
    std::string all = env;
    for (size_t at = 0; at <= all.size();) {
      const size_t comma = std::min(all.find(',', at), all.size());
      text.push_back(all.substr(at, comma - at));
      at = comma + 1;
    }
  }
  std::vector<in_addr> ips(text.size());
  UBEP_CHECK_ARG(text.empty() || static_cast<int>(text.size()) == launch.hosts, "host IPs (",
                 env && launch.host_ips.empty() ? "UBEP_HOST_IPS" : "TcpLaunch::host_ips",
                 "): ", text.size(), " given for ", launch.hosts, " hosts");
  for (size_t h = 0; h < text.size(); ++h)
    UBEP_CHECK_ARG(inet_pton(AF_INET, text[h].c_str(), &ips[h]) == 1, "host IPs: host ", h, "'s '",
                   text[h], "' is not an IPv4");
  return ips;
}

// Host h's door port: TcpLaunch::door_ports (else UBEP_DOOR_PORTS="p0,p1,...") when given, else
// the rendezvous' port + h. Host 0's door is the rendezvous: its entry is 0 or that port.
uint16_t door_port(const TcpLaunch& launch, int host, uint16_t rendezvous_port) {
  std::vector<int> ports = launch.door_ports;
  const char* env = std::getenv("UBEP_DOOR_PORTS");
  const char* from = ports.empty() && env && *env ? "UBEP_DOOR_PORTS" : "TcpLaunch::door_ports";
  if (ports.empty() && env && *env)
    for (const char* p = env; *p;) {
      char* end = nullptr;
      ports.push_back(static_cast<int>(std::strtol(p, &end, 10)));
      UBEP_CHECK_ARG(end != p && (*end == ',' || *end == 0), from, "='", env,
                     "' is not a list of ports");
      p = *end ? end + 1 : end;
    }
  if (ports.empty()) return static_cast<uint16_t>(rendezvous_port + host);
  UBEP_CHECK_ARG(static_cast<int>(ports.size()) == launch.hosts, from, ": ", ports.size(),
                 " door ports for ", launch.hosts, " hosts");
  const int p = ports[static_cast<size_t>(host)];
  UBEP_CHECK_ARG(host > 0 ? p > 0 && p < 65536 : p == 0 || p == rendezvous_port, from, ": host ",
                 host, "'s door port ", p,
                 host > 0 ? " is not a port" : " is not the rendezvous' (host 0's door is it)");
  return static_cast<uint16_t>(host > 0 ? p : rendezvous_port);
}
}  // namespace

std::optional<sockaddr_in> door_of(const TcpLaunch& launch, int host) {
  sockaddr_in at = parse_endpoint(launch.rendezvous, "rendezvous");
  at.sin_port = htons(door_port(launch, host, ntohs(at.sin_port)));
  const std::vector<in_addr> ips = host_ips(launch);
  if (!ips.empty())
    at.sin_addr = ips[static_cast<size_t>(host)];
  else if (host != 0 && (ntohl(at.sin_addr.s_addr) >> 24) != 127)
    return std::nullopt;  // another host's address: unknown without the list
  return at;
}

int listen_door(const TcpLaunch& launch) {
  sockaddr_in at = parse_endpoint(launch.rendezvous, "rendezvous");
  at.sin_port = htons(door_port(launch, launch.host, ntohs(at.sin_port)));
  at.sin_addr = own_ip(at);
  return listen_on(at);
}

// ---- the live side ----------------------------------------------------------------------------

RejoinDoor::RejoinDoor(int rank, std::vector<int> host_of, std::vector<MeshEntry> mesh,
                       int mesh_listener, int door_listener, TakeFn take)
    : rank_(rank),
      host_of_(std::move(host_of)),
      mesh_(std::move(mesh)),
      mesh_listener_(mesh_listener),
      door_listener_(door_listener),
      take_(std::move(take)) {
  if (mesh_listener_ >= 0) non_blocking(mesh_listener_);
  if (door_listener_ >= 0) non_blocking(door_listener_);
}

RejoinDoor::~RejoinDoor() {
  if (mesh_listener_ >= 0) close(mesh_listener_);
  if (door_listener_ >= 0) close(door_listener_);
}

void RejoinDoor::pump() {
  for (int fd; (fd = try_accept(door_listener_)) >= 0;) serve_mesh(fd);
  for (int fd; (fd = try_accept(mesh_listener_)) >= 0;) take_rank(fd);
}

// A host's local rank 0: a replacement host's local rank 0 asks for the mesh. Errors end only
// that connection (the replacement then asks the next door, or fails named on its side).
void RejoinDoor::serve_mesh(int fd) {
  try {
    const auto until = Clock::now() + kHelloBound;
    AskMesh ask{};
    recv_all(fd, &ask, sizeof ask, until, nullptr, -1, "a replacement's request for the mesh");
    const int n = static_cast<int>(mesh_.size());
    UBEP_CHECK_ARG(
        ask.magic == kAskMesh && ask.size == n && ask.rank >= 0 && ask.rank < n &&
            host_of_[static_cast<size_t>(ask.rank)] != host_of_[static_cast<size_t>(rank_)],
        "rejoin: a request for the mesh from rank ", ask.rank, " of ", ask.size, " (magic ",
        ask.magic, ") does not fit rank ", rank_, "'s group of ", n,
        " (a live host is not replaced)");
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
  ++replacements_;
  log::info("rank ", rank_, ": rank ", j.rank, " is back as incarnation ", j.incarnation, " (",
            ip_port(j.listen), ")");
}

// ---- the replacement side ---------------------------------------------------------------------

namespace {
// Asks the door at `at` for the mesh; false when nobody answers there (a lost host's door).
bool ask_door(const sockaddr_in& at, int host, const TcpLaunch& launch, Clock::time_point until,
              std::vector<MeshEntry>& mesh) {
  int fd = -1;
  try {
    fd = connect_to(at, std::min(until, Clock::now() + kConnectBound), host, "a host's door");
  } catch (const TimeoutError&) {
    return false;
  }
  try {
    const AskMesh ask{kAskMesh, launch.rank(), static_cast<int32_t>(mesh.size()), launch.host};
    send_all(fd, &ask, sizeof ask, until, nullptr, -1, "the request for the mesh");
    recv_all(fd, mesh.data(), mesh.size() * sizeof(MeshEntry), until, nullptr, -1,
             "the mesh from a live host's door (is this host's index right?)");
  } catch (const PeerFailedError& e) {  // it closed the connection: refused, or lost meanwhile
    log::warn("rank ", launch.rank(), ": host ", host, "'s door gave no mesh: ", e.what());
    close(fd);
    return false;
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  return true;
}

// Local rank 0 asks the other hosts' doors in host order (the lowest live one answers); its
// host-mates get the mesh over their star.
std::vector<MeshEntry> fetch_mesh(TcpBootstrap& local, const TcpLaunch& launch,
                                  Clock::time_point until) {
  const auto n = static_cast<size_t>(launch.hosts * launch.ranks_per_host);
  std::vector<MeshEntry> mesh(n);
  if (launch.local_rank == 0) {
    std::string asked;
    bool got = false;
    const Clock::time_point give_up = std::min(until, Clock::now() + kDoorWindow);
    for (int pass = 0; !got && (pass == 0 || Clock::now() < give_up); ++pass) {
      asked.clear();
      for (int h = 0; h < launch.hosts && !got; ++h) {
        const std::optional<sockaddr_in> at = h == launch.host ? std::nullopt : door_of(launch, h);
        if (!at) continue;
        asked += (asked.empty() ? "" : ", ") + ip_port(*at);
        got = ask_door(*at, h, launch, until, mesh);
      }
      if (!got) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    UBEP_CHECK(got, PeerFailedError, "rejoin: rank ", launch.rank(),
               " found no live host's door to ask for the group (asked ",
               asked.empty() ? "none" : asked,
               "; does the live group keep them open: TcpLaunch::elastic, UBEP_ELASTIC=1? a "
               "replacement of host 0 knows the other hosts' doors from UBEP_HOST_IPS)");
  }
  std::vector<MeshEntry> all(n * static_cast<size_t>(launch.ranks_per_host));
  local.allgather(mesh.data(), all.data(), n * sizeof(MeshEntry));
  return {all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n)};  // local rank 0's
}

// Connects to every rank of the other hosts and says hello to each: j.fds[q], or -1 with q in
// j.unreachable when q does not answer (its host lost too, or cut off). The connects run at once
// under one bound (kConnectBound): one after another, every unreachable rank cost its own bound
// (on 3x2 with a host cut, 0.6 s of a replacement's 0.77 s before it served). Each hello goes
// out as its connect completes and the answers are read after the connects: each live rank
// answers at its own next pump, so those waits overlap too. j.fds owns every socket from the
// connects on (the caller closes them on a throw).
void join_ranks(const TcpLaunch& launch, Joined& j, const Join& hello, Clock::time_point until) {
  std::vector<int> qs;
  std::vector<sockaddr_in> at;
  for (int q = 0; q < static_cast<int>(j.mesh.size()); ++q) {
    if (q / launch.ranks_per_host == launch.host) continue;
    qs.push_back(q);
    at.push_back(j.mesh[static_cast<size_t>(q)].addr);
  }
  // The hello goes out as each connect completes: a live rank waits only kHelloBound for it
  // after accepting, less than a silent rank's connect bound.
  const std::vector<int> fds =
      connect_all(at, std::min(until, Clock::now() + kConnectBound), [&](size_t k, int fd) {
        try {
          send_all(fd, &hello, sizeof hello, until, nullptr, qs[k], "the hello to a live rank");
          return true;
        } catch (const PeerFailedError&) {
          return false;
        }
      });
  for (size_t k = 0; k < qs.size(); ++k) j.fds[static_cast<size_t>(qs[k])] = fds[k];
  const auto drop = [&](int q) {
    int& fd = j.fds[static_cast<size_t>(q)];
    if (fd >= 0) close(fd);
    fd = -1;
  };
  for (int q : qs) {
    uint32_t answer = 0;
    try {
      if (j.fds[static_cast<size_t>(q)] >= 0)
        recv_all(j.fds[static_cast<size_t>(q)], &answer, sizeof answer, until, nullptr, q,
                 "a live rank's answer to the hello");
    } catch (const PeerFailedError&) {
      drop(q);
    }
    if (j.fds[static_cast<size_t>(q)] < 0) {
      j.unreachable.push_back(q);
      continue;
    }
    if (answer != 1)
      throw PeerFailedError(
          detail::concat("rank ", hello.rank, " cannot rejoin: live rank ", q,
                         " still holds its previous incarnation (not known lost)"));
  }
}
}  // namespace

Joined join_live_group(const TcpLaunch& launch, std::chrono::milliseconds timeout) {
  UBEP_CHECK_ARG(launch.hosts > 1 && launch.host >= 0 && launch.host < launch.hosts,
                 "rejoin: host ", launch.host, " of ", launch.hosts, " is not a host to replace");
  UBEP_CHECK_ARG(launch.host != 0 || launch.hosts > 2, "rejoin: host 0 of 2 cannot be replaced: ",
                 "losing it leaves host 1 at a tie without host 0, and that side stops (the "
                 "partition rule), so no live rank is left to join (3 hosts or more: it can)");
  const auto until = Clock::now() + timeout;
  const sockaddr_in rdv = parse_endpoint(launch.rendezvous, "rendezvous");
  // The host's own star: its local rank 0 listens at the host's door (its address, its door
  // port: distinct when hosts share an address, as launchers on one machine do), free since the
  // host was lost; it stays the host's door after the join.
  sockaddr_in star{};
  star.sin_family = AF_INET;
  star.sin_addr = own_ip(rdv);
  star.sin_port = htons(door_port(launch, launch.host, ntohs(rdv.sin_port)));
  TcpLaunch local{.rendezvous = ip_port(star),
                  .hosts = 1,
                  .host = 0,
                  .ranks_per_host = launch.ranks_per_host,
                  .local_rank = launch.local_rank,
                  .host_ips = {},
                  .door_ports = {}};
  auto boot = std::make_unique<TcpBootstrap>(local, timeout, true);
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
    // The host-mates' new addresses: the whole host comes back at once, at one incarnation; the
    // host's door serves them to later replacements of other hosts.
    const MeshEntry mine{addr, inc, 0, beat};
    std::vector<MeshEntry> mates(static_cast<size_t>(launch.ranks_per_host));
    boot->allgather(&mine, mates.data(), sizeof mine);
    for (int l = 0; l < launch.ranks_per_host; ++l)
      j.mesh[static_cast<size_t>(launch.host * launch.ranks_per_host + l)] =
          mates[static_cast<size_t>(l)];
    join_ranks(launch, j, hello, until);
  } catch (...) {
    for (int fd : j.fds)
      if (fd >= 0) close(fd);
    close(j.listener);
    throw;
  }
  j.door = boot->take_listener();  // local rank 0's star: the host's door from now on
  j.bootstrap = std::make_shared<RejoinBootstrap>(std::move(boot), launch);
  log::info("rank ", me, ": joined the live group as incarnation ", inc, " (", j.unreachable.size(),
            " ranks unreachable)");
  return j;
}

}  // namespace ubep::bootstrap
