// A replacement host joins a live TCP group (issue 32; docs/ELASTIC.md, "A replacement host").
// After the live ranks masked a lost host, new processes for that host's ranks (in a new or the
// same network namespace) take its place without any collective call of the live ranks:
//
//  1. The replacement host's local rank 0 asks the group's rendezvous (host 0's rank 0, which
//     keeps it open) for the mesh: every rank's listening address and incarnation. Its
//     host-mates get it from it over their own star (RejoinBootstrap, below).
//  2. Each replacement rank takes incarnation = its predecessor's + 1, connects to every live
//     rank of the other hosts and says {rank, incarnation, its own listening address, its host
//     heartbeat's address}; its heartbeat beats to the live ranks' (from the mesh).
//  3. Each live rank takes that connection at its next call (RejoinDoor::pump, the caller's
//     thread, between calls): the transport starts the peer afresh on it, the death watch
//     counts the rank alive again, the heartbeat judges it at its new address (a second loss, a
//     cut cable included, is named as fast as the first), and the incarnation is what
//     Membership sees as a replacement.
//     It answers yes (or no: the old incarnation is still connected and not known dead).
//  4. The replacement's Buffers agree with the live ranks at their first dispatch, through the
//     membership records (config digest included): only then is the host unmasked, in one view.
//
// Host 0 cannot be replaced (it serves the rendezvous).
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "bootstrap/host_heartbeat.hpp"
#include "bootstrap/host_liveness.hpp"
#include "ubep/bootstrap.hpp"
#include "ubep/tcp_group.hpp"

namespace ubep::bootstrap {

// One rank's entry in the mesh a replacement asks for.
struct MeshEntry {
  sockaddr_in addr{};  // where the rank listens for replacements' connections
  uint32_t incarnation = 0;
  uint32_t pad = 0;
  BeatAddr beat;  // where its host heartbeat listens (port 0: none)
};

// The live side: accepts replacement connections (every rank) and serves the mesh (rank 0).
// Used on the caller's thread only, between calls (GroupHooks::pump_rejoins); nothing else
// touches it, so it holds no lock. It owns both listening sockets.
class RejoinDoor {
 public:
  // take(rank, incarnation, fd, its heartbeat's address) -> whether the connection was taken
  // (it then owns fd).
  using TakeFn = std::function<bool(int rank, uint32_t incarnation, int fd, const BeatAddr& beat)>;
  RejoinDoor(int rank, std::vector<int> host_of, std::vector<MeshEntry> mesh, int mesh_listener,
             int rendezvous_listener, TakeFn take);
  ~RejoinDoor();
  RejoinDoor(const RejoinDoor&) = delete;
  RejoinDoor& operator=(const RejoinDoor&) = delete;

  // Takes every connection waiting on the listeners, without blocking when none is.
  void pump();
  uint32_t incarnation(int r) const { return mesh_[static_cast<size_t>(r)].incarnation; }

 private:
  void serve_mesh(int fd);
  void take_rank(int fd);

  int rank_;
  std::vector<int> host_of_;
  std::vector<MeshEntry> mesh_;
  int mesh_listener_, rendezvous_listener_;
  TakeFn take_;
};

// The replacement side of steps 1-2 (make_tcp_group with TcpLaunch::rejoin).
struct Joined {
  std::shared_ptr<Bootstrap> bootstrap;  // RejoinBootstrap: collectives among host-mates only
  std::vector<int> fds;                  // [rank] connection to a live rank of another host
  std::vector<int> unreachable;          // ranks of other hosts nobody answered for (lost)
  std::vector<MeshEntry> mesh;           // with this host's ranks at their new incarnation
  int listener = -1;                     // this rank's own listening socket (the door's)
  // Bound, not started (its address went into the hellos): beat_to starts it once the group's
  // death watch exists. nullptr when UBEP_HOST_HEARTBEAT=off or without an address.
  std::unique_ptr<HostHeartbeat> heartbeat;
};
Joined join_live_group(const TcpLaunch& launch, std::chrono::milliseconds timeout);

}  // namespace ubep::bootstrap
