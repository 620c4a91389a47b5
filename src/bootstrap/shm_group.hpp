// Processes on one host sharing POSIX shared memory, set up over any Bootstrap. The MPI group
// (src/bootstrap/mpi_group.cpp) is one with an MPI bootstrap and, across hosts, the MPI
// transport.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "bootstrap/death_check.hpp"
#include "bootstrap/death_notices.hpp"
#include "bootstrap/death_watch.hpp"
#include "bootstrap/flag_barrier.hpp"
#include "bootstrap/group_hooks.hpp"
#include "bootstrap/host_heartbeat.hpp"
#include "bootstrap/host_liveness.hpp"
#include "bootstrap/rendezvous.hpp"
#include "transport/remote.hpp"
#include "ubep/bootstrap.hpp"

namespace ubep::bootstrap {

class ShmGroup : public Group, private GroupHooks {
 public:
  // host_of: host of every rank (from the bootstrap, or forced by options.ranks_per_host).
  // remote: the transport to other hosts (required when host_of names more than one host).
  // beat: run the host heartbeat across hosts (a replacement host's group has none: its set-up
  // collectives reach only its host-mates).
  ShmGroup(std::shared_ptr<Bootstrap> bootstrap, GroupOptions options, std::vector<int> host_of,
           std::unique_ptr<transport::Remote> remote, bool beat = true);
  ~ShmGroup() override;

  std::unique_ptr<SharedWindow> allocate_window(size_t bytes) override;
  void allgather(const void* in, void* out, size_t bytes) override;
  transport::Remote* remote() override { return remote_.get(); }
  DeathWatch* death_watch() override { return deaths_.get(); }
  uint32_t incarnation_of(int rank) const override {
    return rendezvous_ ? rendezvous_->incarnation(rank) : 0;
  }
  void peer_replaced(int rank) override;
  void pump_deaths() override {
    if (notices_) notices_->pump();
  }
  void forward_deaths_now() override {
    if (!notices_) return;
    notices_->pump();
    notices_->flush(std::chrono::milliseconds(100));
  }
  // Counted per process from 0 (a replacement counts its mirrored Buffers from 0 as its
  // predecessor did). Atomic: Buffers may be made by several threads of one process.
  int next_buffer_number() override { return buffers_made_.fetch_add(1); }
  void tell_call_failure(int buffer, uint32_t word) override {
    if (notices_) notices_->tell_call_failure(buffer, word);
  }
  int watch_call_failures(int buffer, std::function<void(int, uint32_t)> on) override {
    return notices_ ? notices_->watch_call_failures(buffer, std::move(on)) : -1;
  }
  void unwatch_call_failures(int id) override {
    if (notices_ && id >= 0) notices_->unwatch_call_failures(id);
  }
  const char* kind() const override { return "processes"; }
  // A replacement of `rank` (another host's) was taken (tcp_group.cpp): the heartbeat stops
  // judging its predecessor, so no late verdict names the replacement lost, and judges the
  // replacement at `at` instead (port 0: it runs none, so it is not judged).
  void rearm_heartbeat(int rank, const BeatAddr& at, uint32_t incarnation) {
    if (!heartbeat_) return;
    if (at.port == 0)
      heartbeat_->forget(rank);
    else
      heartbeat_->rearm(rank, dotted(at), at.port, incarnation);
  }
  // Every rank's heartbeat address as the group's set-up exchanged it (empty: none ran).
  const std::vector<BeatAddr>& beat_addrs() const { return beat_addrs_; }
  // A replacement host's group runs no set-up exchange with the other hosts: its heartbeat is
  // made by its own set-up (tcp_group.cpp) and handed over here, started, after the watch.
  void adopt_heartbeat(std::unique_ptr<HostHeartbeat> hb) { heartbeat_ = std::move(hb); }

 protected:
  void barrier_impl() override;
  Bootstrap& bootstrap() { return *bootstrap_; }
  // What a window's set-up exchanges its segment names over (collective over the group's ranks,
  // or those the group's Buffers are made with). The set-up's bootstrap, unless a subclass has
  // a collective that outlives it (TcpGroup: the mesh, which reaches a replacement host). Not
  // called by the constructor's own window.
  virtual Bootstrap& window_bootstrap() { return *bootstrap_; }
  // What the group's own waits ask about deaths (TcpGroup's collectives over the mesh).
  const DeathCheck* death_check() const { return death_check_.get(); }

 private:
  std::shared_ptr<Bootstrap> bootstrap_;
  std::vector<int> host_vec_;
  std::unique_ptr<SharedWindow> control_;
  std::unique_ptr<FlagBarrier> barrier_;
  std::unique_ptr<transport::Remote> remote_;
  std::unique_ptr<DeathWatch> deaths_;  // this host's other ranks' processes
  // Elastic groups: the host's rendezvous (GroupOptions::elastic_name) and the windows made so
  // far (their index there).
  std::unique_ptr<Rendezvous> rendezvous_;
  std::atomic<int> windows_{0};
  std::atomic<int> buffers_made_{0};          // next_buffer_number
  std::unique_ptr<DeathNotices> notices_;     // across hosts: deaths forwarded over remote_
  std::unique_ptr<HostHeartbeat> heartbeat_;  // across hosts: a lost host named (host_liveness)
  std::vector<BeatAddr> beat_addrs_;          // by rank, from heartbeat_'s set-up
  // What the group's own waits (barriers, set-up exchanges) ask about deaths.
  std::unique_ptr<DeathCheck> death_check_;
};

// A replacement process's group (make_rejoin_group): the live group's windows, mapped through
// the rendezvous; no collective calls.
class RejoinGroup : public Group, private GroupHooks {
 public:
  RejoinGroup(std::unique_ptr<Rendezvous> rdv, int rank, GroupOptions options);
  ~RejoinGroup() override;
  std::unique_ptr<SharedWindow> allocate_window(size_t bytes) override;
  void allgather(const void* in, void* out, size_t bytes) override;
  const char* kind() const override { return "processes (rejoined)"; }
  DeathWatch* death_watch() override { return deaths_.get(); }
  uint32_t incarnation_of(int rank) const override { return rdv_->incarnation(rank); }
  bool rejoining() const override { return true; }
  void peer_replaced(int rank) override;

 protected:
  void barrier_impl() override;

 private:
  std::unique_ptr<Rendezvous> rdv_;
  std::vector<int> host_vec_;
  uint32_t incarnation_ = 0;
  int windows_ = 0;
  std::unique_ptr<DeathWatch> deaths_;
  std::unique_ptr<SharedWindow> control_;  // index 0, as in the live ranks' ShmGroup
};

// Host ids from options.ranks_per_host (> 0: every N consecutive ranks form a host) or else
// from the bootstrap's host map.
std::vector<int> resolve_hosts(Bootstrap& bootstrap, const GroupOptions& options);

}  // namespace ubep::bootstrap
