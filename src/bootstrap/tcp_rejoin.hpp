// A replacement host joins a live TCP group (issue 32; docs/ELASTIC.md, "A replacement host").
// After the live ranks masked a lost host, new processes for that host's ranks (in a new or the
// same network namespace) take its place without any collective call of the live ranks:
//
//  1. The replacement host's local rank 0 asks a live host's door for the mesh: every rank's
//     listening address and incarnation. Every host's local rank 0 keeps a door (door_of): host
//     0's is the rendezvous itself, host h's is its address at its door port (door_of); the
//     replacement asks the other hosts' doors in host order, so the lowest live host answers,
//     and host 0 can be replaced like any other. Its host-mates get the mesh from it over their
//     own star (RejoinBootstrap, below), whose listener (its own host's door address) is its
//     door from then on.
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
// Host 0 is replaced like any other host once the others went on without it, which the partition
// rule allows with 3 hosts or more (with 2, losing host 0 stops host 1 too: nobody is left).
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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

// Host h's door (issue 32): where its local rank 0 answers a replacement's request for the mesh,
// at its door port (TcpLaunch::door_ports, UBEP_DOOR_PORTS, else the rendezvous' port + h), on
// launch.host_ips[h] (or UBEP_HOST_IPS when that is empty), else
// on the rendezvous' address for host 0, or for every host when the rendezvous is on loopback
// (launchers on one machine). nullopt when the address is unknown. Throws InvalidArgument
// naming a malformed UBEP_HOST_IPS or door port list.
std::optional<sockaddr_in> door_of(const TcpLaunch& launch, int host);
// This host's door, listening on its own address (own_ip) at door_of's port: the local rank 0 of
// a host > 0 of a live elastic group (host 0's door is the rendezvous' listener).
int listen_door(const TcpLaunch& launch);

// The live side: accepts replacement connections (every rank) and serves the mesh (each host's
// local rank 0, at its door). Used on the caller's thread only, between calls and in its waits
// (GroupHooks::pump_rejoins); nothing else touches it, so it holds no lock. It owns both
// listening sockets.
class RejoinDoor {
 public:
  // take(rank, incarnation, fd, its heartbeat's address) -> whether the connection was taken
  // (it then owns fd).
  using TakeFn = std::function<bool(int rank, uint32_t incarnation, int fd, const BeatAddr& beat)>;
  // door_listener: the host's door (its local rank 0; -1 on the others).
  RejoinDoor(int rank, std::vector<int> host_of, std::vector<MeshEntry> mesh, int mesh_listener,
             int door_listener, TakeFn take);
  ~RejoinDoor();
  RejoinDoor(const RejoinDoor&) = delete;
  RejoinDoor& operator=(const RejoinDoor&) = delete;

  // Takes every connection waiting on the listeners, without blocking when none is.
  void pump();
  uint32_t incarnation(int r) const { return mesh_[static_cast<size_t>(r)].incarnation; }
  // How many replacement ranks this rank took.
  int replacements() const { return replacements_; }

 private:
  void serve_mesh(int fd);
  void take_rank(int fd);

  int rank_;
  std::vector<int> host_of_;
  std::vector<MeshEntry> mesh_;
  int mesh_listener_, door_listener_;
  TakeFn take_;
  int replacements_ = 0;
};

// The replacement side of steps 1-2 (make_tcp_group with TcpLaunch::rejoin).
struct Joined {
  std::shared_ptr<Bootstrap> bootstrap;  // RejoinBootstrap: collectives among host-mates only
  std::vector<int> fds;                  // [rank] connection to a live rank of another host
  std::vector<int> unreachable;          // ranks of other hosts nobody answered for (lost)
  std::vector<MeshEntry> mesh;           // with this host's ranks at their new incarnation
  int listener = -1;                     // this rank's own listening socket (for replacements)
  int door = -1;                         // local rank 0: its host's door (its star's listener)
  // Bound, not started (its address went into the hellos): beat_to starts it once the group's
  // death watch exists. nullptr when UBEP_HOST_HEARTBEAT=off or without an address.
  std::unique_ptr<HostHeartbeat> heartbeat;
};
Joined join_live_group(const TcpLaunch& launch, std::chrono::milliseconds timeout);

}  // namespace ubep::bootstrap
