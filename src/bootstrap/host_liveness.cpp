#include "bootstrap/host_liveness.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "bootstrap/death_watch.hpp"
#include "core/log.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {

namespace {
struct Endpoint {
  uint32_t ip = 0;  // network order; 0: none
  uint16_t port = 0;
  char host[64] = {};
};

bool loopback(uint32_t ip) { return (ntohl(ip) >> 24) == 127; }

// This host's IPv4 as its hostname resolves (/etc/hosts, DNS): 0 when it does not.
uint32_t own_ip(const char* hostname) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(hostname, nullptr, &hints, &res) != 0 || !res) return 0;
  uint32_t ip = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr;
  freeaddrinfo(res);
  return ip;
}

bool parse_options(HostHeartbeat::Options& opt) {
  const char* env = std::getenv("UBEP_HOST_HEARTBEAT");
  if (!env || !*env) return true;
  if (std::strcmp(env, "off") == 0) return false;
  int p = 0, t = 0;
  UBEP_CHECK_ARG(std::sscanf(env, "%d,%d", &p, &t) == 2 && p > 0 && t > p, "UBEP_HOST_HEARTBEAT='",
                 env, "': want off or PERIOD_MS,THRESHOLD_MS (0 < P < T)");
  opt.period = std::chrono::milliseconds(p);
  opt.threshold = std::chrono::milliseconds(t);
  return true;
}

std::string host_ranks(const std::vector<int>& host_of, int host) {
  std::string s;
  for (size_t r = 0; r < host_of.size(); ++r)
    if (host_of[r] == host) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}
}  // namespace

std::string dotted(const BeatAddr& a) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.ip, ip, sizeof ip);
  return ip;
}

namespace {
// Verdicts into the watch, on the heartbeat thread: the watch outlives hb (its owner destroys
// hb first).
HostHeartbeat::LostFn into(DeathWatch& watch, const std::vector<int>& host_of) {
  return [&watch, host_of](int r, std::chrono::nanoseconds silent) {
    const int host = host_of[static_cast<size_t>(r)];
    watch.note_remote(r,
                      detail::concat("lost with host ", host, " (ranks ", host_ranks(host_of, host),
                                     "): no heartbeat for ", silent.count() / 1000000, " ms"),
                      false);
  };
}

// This rank's heartbeat bound to its hostname's address (rank = its "host" id), or nullptr.
std::unique_ptr<HostHeartbeat> bind_own(int rank, int size, const HostHeartbeat::Options& opt,
                                        Endpoint& me) {
  gethostname(me.host, sizeof me.host - 1);
  if ((me.ip = own_ip(me.host)) == 0) return nullptr;
  auto hb = std::make_unique<HostHeartbeat>(rank, size, dotted({me.ip, 0, 0}), 0, opt);
  me.port = hb->port();
  return hb;
}
}  // namespace

std::unique_ptr<HostHeartbeat> start_host_liveness(Bootstrap& bootstrap, int rank,
                                                   const std::vector<int>& host_of,
                                                   DeathWatch& watch,
                                                   std::vector<BeatAddr>* addrs) {
  const int size = static_cast<int>(host_of.size());
  bool spans = false;
  for (int h : host_of) spans = spans || h != host_of[0];
  if (!spans) return nullptr;
  HostHeartbeat::Options opt;
  const bool on = parse_options(opt);
  Endpoint me;
  std::unique_ptr<HostHeartbeat> hb = on ? bind_own(rank, size, opt, me) : nullptr;
  std::vector<Endpoint> all(static_cast<size_t>(size));
  bootstrap.allgather(&me, all.data(), sizeof me);  // every rank, also those without a beat
  if (addrs)
    for (const Endpoint& e : all) addrs->push_back({e.ip, e.port, 0});
  if (!hb) {
    if (on) log::warn("host heartbeat off: hostname '", me.host, "' has no IPv4 address");
    return nullptr;
  }
  std::vector<HostHeartbeat::Peer> peers;
  for (int r = 0; r < size; ++r) {
    const Endpoint& e = all[static_cast<size_t>(r)];
    if (host_of[static_cast<size_t>(r)] == host_of[static_cast<size_t>(rank)]) continue;
    // A loopback address is reachable only from the same machine (forced hosts on one kernel).
    const bool reachable =
        e.ip != 0 && (!loopback(e.ip) || std::strncmp(e.host, me.host, sizeof me.host) == 0);
    if (!reachable) {
      log::warn("host heartbeat: rank ", r, " on '", e.host,
                "' gave no reachable address; its"
                " host's loss is named only at the timeout");
      continue;
    }
    peers.push_back({r, dotted({e.ip, 0, 0}), e.port});
  }
  hb->start(peers, into(watch, host_of), host_of);
  return hb;
}

std::unique_ptr<HostHeartbeat> bind_heartbeat(int rank, int size, uint32_t incarnation,
                                              BeatAddr* me) {
  *me = {};
  HostHeartbeat::Options opt;
  if (!parse_options(opt)) return nullptr;
  opt.incarnation = incarnation;
  Endpoint own;
  auto hb = bind_own(rank, size, opt, own);
  if (!hb)
    log::warn("host heartbeat off: hostname '", own.host, "' has no IPv4 address");
  else
    *me = {own.ip, own.port, 0};
  return hb;
}

void beat_to(HostHeartbeat& hb, int rank, const std::vector<int>& host_of,
             const std::vector<BeatAddr>& addrs, DeathWatch& watch) {
  // No host names here: a loopback address counts only when this rank's is loopback too (ranks
  // of one machine), as start_host_liveness's rule does for forced hosts.
  Endpoint own;
  gethostname(own.host, sizeof own.host - 1);
  const bool own_loopback = loopback(own_ip(own.host));
  std::vector<HostHeartbeat::Peer> peers;
  for (int r = 0; r < static_cast<int>(host_of.size()); ++r) {
    const BeatAddr& a = addrs[static_cast<size_t>(r)];
    if (host_of[static_cast<size_t>(r)] == host_of[static_cast<size_t>(rank)]) continue;
    if (a.ip == 0 || a.port == 0 || (loopback(a.ip) && !own_loopback)) {
      log::warn("host heartbeat: rank ", r,
                " gave no reachable address; its host's loss is "
                "named only at the timeout");
      continue;
    }
    peers.push_back({r, dotted(a), a.port});
  }
  hb.start(peers, into(watch, host_of), host_of);
}

}  // namespace ubep::bootstrap
