// Ranks on several hosts, one launcher per host, joined by a TCP rendezvous (ubep/tcp_group.hpp):
// the shared-memory group of each host (ShmGroup) over a TcpBootstrap, with TcpRemote between
// hosts. A rank whose connection closes without a goodbye is a death in the group's DeathWatch at
// once (a killed host: its kernel closes the sockets), named "lost with host H"; a silent host (a
// cut cable) is named by the heartbeat (host_liveness), as for MPI groups.
#include <cstdlib>
#include <cstring>

#include "bootstrap/shm_group.hpp"
#include "bootstrap/tcp_bootstrap.hpp"
#include "transport/tcp/tcp_remote.hpp"
#include "ubep/error.hpp"
#include "ubep/tcp_group.hpp"

namespace ubep {

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    UBEP_CHECK_ARG(fallback != -1, name, " is not set (a host's launcher sets it)");
    return fallback;
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  UBEP_CHECK_ARG(*end == 0 && x >= 0 && x < (1 << 20), name, "='", v,
                 "' is not a non-negative integer");
  return static_cast<int>(x);
}

std::string ranks_of(const std::vector<int>& host_of, int host) {
  std::string s;
  for (size_t r = 0; r < host_of.size(); ++r)
    if (host_of[r] == host) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}
}  // namespace

TcpLaunch TcpLaunch::from_env(int local_rank) {
  TcpLaunch l;
  const char* rdv = std::getenv("UBEP_RENDEZVOUS");
  UBEP_CHECK_ARG(rdv && *rdv, "UBEP_RENDEZVOUS is not set (want IPv4:port of host 0's rank 0)");
  l.rendezvous = rdv;
  l.hosts = env_int("UBEP_HOSTS", -1);
  l.host = env_int("UBEP_HOST_INDEX", -1);
  l.ranks_per_host = env_int("UBEP_RANKS_PER_HOST", -1);
  l.local_rank = local_rank >= 0 ? local_rank : env_int("UBEP_LOCAL_RANK", -1);
  return l;
}

std::unique_ptr<Group> make_tcp_group(const TcpLaunch& launch, GroupOptions options) {
  UBEP_CHECK_ARG(options.timeout.count() > 0, "make_tcp_group: timeout must be positive, got ",
                 options.timeout.count(), " ms");
  UBEP_CHECK_ARG(options.ranks_per_host == 0 || options.ranks_per_host == launch.ranks_per_host,
                 "make_tcp_group: ranks_per_host ", options.ranks_per_host,
                 " contradicts the launch's ", launch.ranks_per_host);
  auto boot = std::make_shared<bootstrap::TcpBootstrap>(launch, options.timeout);
  std::vector<int> hosts = boot->host_map();
  std::unique_ptr<transport::TcpRemote> remote;
  if (launch.hosts > 1)
    remote =
        std::make_unique<transport::TcpRemote>(boot->rank(), bootstrap::connect_mesh(*boot, hosts));
  transport::TcpRemote* tcp = remote.get();
  auto group = std::make_unique<bootstrap::ShmGroup>(boot, options, hosts, std::move(remote));
  // A connection that breaks without a goodbye is a lost rank (its process ended; with every
  // rank of a host at once, the host). Runs on the caller's thread inside a transport call; the
  // watch lives as long as the group, and the transport (destroyed with the group) never calls
  // it from its destructor.
  for (int p = 0; tcp && p < boot->size(); ++p)
    if (hosts[static_cast<size_t>(p)] != hosts[static_cast<size_t>(boot->rank())])
      tcp->set_peer_label(p,
                          detail::concat(" with host ", hosts[static_cast<size_t>(p)], " (ranks ",
                                         ranks_of(hosts, hosts[static_cast<size_t>(p)]), ")"));
  if (bootstrap::DeathWatch* watch = bootstrap::hooks_of(*group).death_watch(); tcp && watch)
    tcp->on_peer_lost([watch, hosts](int peer, const std::string& why) {
      const int h = hosts[static_cast<size_t>(peer)];
      watch->note_remote(
          peer, detail::concat("lost with host ", h, " (ranks ", ranks_of(hosts, h), "): ", why),
          false);
    });
  return group;
}

}  // namespace ubep
