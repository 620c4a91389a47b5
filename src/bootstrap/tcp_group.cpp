// Ranks on several hosts, one launcher per host, joined by a TCP rendezvous (ubep/tcp_group.hpp):
// the shared-memory group of each host (ShmGroup) over a TcpBootstrap, with TcpRemote between
// hosts. A rank whose connection closes without a goodbye is a death in the group's DeathWatch at
// once (a killed host: its kernel closes the sockets), named "lost with host H"; a silent host (a
// cut cable) is named by the heartbeat (host_liveness), as for MPI groups.
#include <unistd.h>
#include <cstdlib>
#include <cstring>

#include "bootstrap/host_liveness.hpp"
#include "bootstrap/mesh_collective.hpp"
#include "bootstrap/shm_group.hpp"
#include "bootstrap/tcp_bootstrap.hpp"
#include "bootstrap/tcp_rejoin.hpp"
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
  l.rejoin = env_int("UBEP_REJOIN", 0) == 1;
  l.elastic = env_int("UBEP_ELASTIC", 0) == 1;
  return l;  // host_ips: the replacement reads UBEP_HOST_IPS itself when they are not given
}

namespace {
// The group of one launcher per host: a ShmGroup whose transport takes replacement hosts
// (issue 32, tcp_rejoin.hpp). Its door is pumped by the caller's thread between calls.
class TcpGroup final : public bootstrap::ShmGroup {
 public:
  TcpGroup(std::shared_ptr<Bootstrap> boot, GroupOptions options, std::vector<int> hosts,
           std::unique_ptr<transport::TcpRemote> remote, bool rejoining)
      : ShmGroup(std::move(boot), options, std::move(hosts), std::move(remote), !rejoining),
        rejoining_(rejoining) {}
  // The door calls into the transport and the death watch: it goes before them (the mesh
  // collective, a member, goes before the transport, the base's).
  ~TcpGroup() override { door_.reset(); }
  void open_door(std::unique_ptr<bootstrap::RejoinDoor> door) { door_ = std::move(door); }
  uint32_t incarnation_of(int r) const override { return door_ ? door_->incarnation(r) : 0; }
  bool rejoining() const override { return rejoining_; }
  void pump_rejoins() override {
    if (door_) door_->pump();
  }
  // Group barriers and allgathers after the set-up go over the mesh (TcpRemote between hosts),
  // which reaches a replacement host as it reaches any live one (mesh_collective.hpp); the
  // set-up's own exchanges (pids, heartbeat) still go through its star. A replacement's first
  // one that completes makes it a member like any other (mirrors_buffers).
  void allgather(const void* in, void* out, size_t bytes) override {
    if (bootstrap::MeshCollective* m = mesh()) {
      m->allgather(in, out, bytes);
      caught_up_ = true;
    } else {
      ShmGroup::allgather(in, out, bytes);
    }
  }
  // A replacement first makes its predecessor's Buffers, without a collective (the live ranks
  // are in their calls); once it took part in a group collective it is in step with the live
  // ranks, and new Buffers are made by every rank together, their windows over the mesh.
  bool mirrors_buffers() const override { return rejoining_ && !caught_up_; }

 protected:
  void barrier_impl() override {
    if (bootstrap::MeshCollective* m = mesh()) {
      m->barrier();
      caught_up_ = true;
    } else {
      ShmGroup::barrier_impl();
    }
  }
  // A window's segment names are exchanged over the mesh, so a Buffer can be made after a
  // replacement host joined (issue 32); a replacement's mirrored Buffers only among its
  // host-mates (its set-up's bootstrap), as their segments are all it maps.
  Bootstrap& window_bootstrap() override {
    bootstrap::MeshCollective* m = mirrors_buffers() ? nullptr : mesh();
    if (!m) return ShmGroup::window_bootstrap();
    if (!mesh_boot_) mesh_boot_ = std::make_unique<MeshBootstrap>(*m, rank(), size(), hosts());
    return *mesh_boot_;
  }

 private:
  // The mesh collective as a Bootstrap, for ShmWindow's set-up.
  class MeshBootstrap final : public Bootstrap {
   public:
    MeshBootstrap(bootstrap::MeshCollective& m, int rank, int size, std::vector<int> hosts)
        : m_(m), rank_(rank), size_(size), hosts_(std::move(hosts)) {}
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void allgather(const void* in, void* out, size_t bytes) override {
      m_.allgather(in, out, bytes);
    }
    void barrier() override { m_.barrier(); }
    std::vector<int> host_map() override { return hosts_; }

   private:
    bootstrap::MeshCollective& m_;
    int rank_, size_;
    std::vector<int> hosts_;
  };

  std::vector<int> hosts() const {
    std::vector<int> h(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) h[static_cast<size_t>(r)] = host_of(r);
    return h;
  }
  bootstrap::MeshCollective* mesh() {
    if (!mesh_ && remote()) {
      bootstrap::MeshHooks hooks{[this](int r) { return incarnation_of(r); },
                                 [this] { pump_rejoins(); }, death_check()};
      mesh_ = std::make_unique<bootstrap::MeshCollective>(rank(), hosts(), *remote(),
                                                          std::move(hooks), options().timeout);
    }
    return mesh_.get();
  }

  bool rejoining_;
  std::unique_ptr<bootstrap::RejoinDoor> door_;
  std::unique_ptr<bootstrap::MeshCollective> mesh_;  // made at the first group call
  std::unique_ptr<MeshBootstrap> mesh_boot_;         // over mesh_, for windows
  bool caught_up_ = false;  // a replacement's group collective completed (caller's thread only)
};

// Errors name a peer with its host; a connection that breaks without a goodbye is a lost rank
// (its process ended; with every rank of a host at once, the host). on_peer_lost runs on the
// caller's thread inside a transport call; the watch lives as long as the group, and the
// transport (destroyed with the group) never calls it from its destructor.
void label_peers(transport::TcpRemote* tcp, bootstrap::DeathWatch* watch, int me,
                 const std::vector<int>& hosts) {
  const auto host_of = [&](int r) { return hosts[static_cast<size_t>(r)]; };
  for (int p = 0; p < static_cast<int>(hosts.size()); ++p)
    if (host_of(p) != host_of(me))
      tcp->set_peer_label(p, detail::concat(" with host ", host_of(p), " (ranks ",
                                            ranks_of(hosts, host_of(p)), ")"));
  if (watch)
    tcp->on_peer_lost([watch, hosts](int peer, const std::string& why) {
      const int h = hosts[static_cast<size_t>(peer)];
      watch->note_remote(
          peer, detail::concat("lost with host ", h, " (ranks ", ranks_of(hosts, h), "): ", why),
          false);
    });
}

// A replacement rank's connection is taken only where its predecessor is gone: the transport
// saw its connection end, or the death watch names it (a cut link: the heartbeat); the old
// connection is then failed for good. Runs in RejoinDoor::pump (caller's thread, between calls).
// The heartbeat stops judging the predecessor before the rank is revived (a verdict on it that
// came after would name the replacement lost), and judges the replacement from then on.
bootstrap::RejoinDoor::TakeFn taker(bootstrap::ShmGroup* group, transport::TcpRemote* tcp,
                                    bootstrap::DeathWatch* watch) {
  return [group, tcp, watch](int r, uint32_t incarnation, int fd, const bootstrap::BeatAddr& beat) {
    const bool dead = watch && watch->dead(r);
    if (tcp->peer_failure(r).empty() && !dead) return false;
    if (tcp->peer_failure(r).empty()) tcp->fail_peer(r, "lost: " + watch->how(r));
    tcp->replace_peer(r, fd);
    group->rearm_heartbeat(r, beat, incarnation);
    if (watch) watch->revive_remote(r);
    return true;
  };
}

std::unique_ptr<Group> make_replacement(const TcpLaunch& launch, GroupOptions options) {
  bootstrap::Joined j = bootstrap::join_live_group(launch, options.timeout);
  std::vector<int> hosts = j.bootstrap->host_map();
  auto remote = std::make_unique<transport::TcpRemote>(launch.rank(), std::move(j.fds));
  transport::TcpRemote* tcp = remote.get();
  // Before the group posts its receives: a rank nobody answered for is lost from the start.
  for (int q : j.unreachable) tcp->fail_peer(q, "lost: unreachable when this replacement joined");
  auto group = std::make_unique<TcpGroup>(j.bootstrap, options, hosts, std::move(remote), true);
  bootstrap::DeathWatch* watch = bootstrap::hooks_of(*group).death_watch();
  label_peers(tcp, watch, launch.rank(), hosts);
  for (int q : j.unreachable)
    if (watch)
      watch->note_remote(q,
                         detail::concat("lost with host ", hosts[static_cast<size_t>(q)],
                                        ": unreachable when this replacement joined"),
                         false);
  // Its heartbeat (bound in the join, its address in the hellos) beats to the live ranks'.
  if (j.heartbeat && watch) {
    std::vector<bootstrap::BeatAddr> beats(j.mesh.size());
    for (size_t r = 0; r < beats.size(); ++r) beats[r] = j.mesh[r].beat;
    bootstrap::beat_to(*j.heartbeat, launch.rank(), hosts, beats, *watch);
    group->adopt_heartbeat(std::move(j.heartbeat));
  }
  group->open_door(std::make_unique<bootstrap::RejoinDoor>(
      launch.rank(), hosts, std::move(j.mesh), j.listener, j.door, taker(group.get(), tcp, watch)));
  return group;
}
}  // namespace

std::unique_ptr<Group> make_tcp_group(const TcpLaunch& launch, GroupOptions options) {
  UBEP_CHECK_ARG(options.timeout.count() > 0, "make_tcp_group: timeout must be positive, got ",
                 options.timeout.count(), " ms");
  UBEP_CHECK_ARG(options.ranks_per_host == 0 || options.ranks_per_host == launch.ranks_per_host,
                 "make_tcp_group: ranks_per_host ", options.ranks_per_host,
                 " contradicts the launch's ", launch.ranks_per_host);
  if (launch.rejoin) return make_replacement(launch, options);
  const bool doors = launch.hosts > 1 && launch.elastic;
  auto boot = std::make_shared<bootstrap::TcpBootstrap>(launch, options.timeout, doors);
  std::vector<int> hosts = boot->host_map();
  if (launch.hosts == 1)
    return std::make_unique<TcpGroup>(boot, options, std::move(hosts), nullptr, false);
  bootstrap::Mesh mesh = bootstrap::connect_mesh(*boot, hosts);
  auto remote = std::make_unique<transport::TcpRemote>(boot->rank(), std::move(mesh.fds));
  transport::TcpRemote* tcp = remote.get();
  auto group = std::make_unique<TcpGroup>(boot, options, hosts, std::move(remote), false);
  bootstrap::DeathWatch* watch = bootstrap::hooks_of(*group).death_watch();
  label_peers(tcp, watch, boot->rank(), hosts);
  std::vector<bootstrap::MeshEntry> entries(mesh.addrs.size());
  const std::vector<bootstrap::BeatAddr>& beats = group->beat_addrs();
  for (size_t r = 0; r < entries.size(); ++r) {
    entries[r].addr = mesh.addrs[r];
    if (r < beats.size()) entries[r].beat = beats[r];
  }
  // Every host's local rank 0 keeps a door for replacement hosts (host 0's: the rendezvous'
  // listener), so any host can be replaced while a live one answers (tcp_rejoin.hpp).
  int door = boot->take_listener();
  if (doors && launch.host > 0 && launch.local_rank == 0) door = bootstrap::listen_door(launch);
  group->open_door(std::make_unique<bootstrap::RejoinDoor>(boot->rank(), hosts, std::move(entries),
                                                           mesh.listener, door,
                                                           taker(group.get(), tcp, watch)));
  return group;
}

}  // namespace ubep
