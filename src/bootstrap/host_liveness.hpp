// A lost host made a named death (issue 32; docs/ELASTIC.md, "A lost host"): a group that spans
// hosts runs a HostHeartbeat per rank, beating to every rank of the other hosts. A rank silent for
// the threshold is recorded in the group's DeathWatch (note_remote), so every wait and call that
// watches deaths names it: "lost with host H (ranks a, b): no heartbeat for N ms". Nobody on the
// lost host has to help, which DeathNotices needs.
//
// Per rank, not per host leader: each process judges for itself, so no host-local forwarding is
// needed and a host whose ranks are all gone is named by all of its ranks going silent at once.
// A single stopped (SIGSTOP) or fully descheduled process silent past the threshold is named too:
// past that threshold it cannot take part in a call anyway.
//
// UBEP_HOST_HEARTBEAT: unset = period 10 ms, threshold 60 ms; "off" = none; "P,T" = P and T ms.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/host_heartbeat.hpp"
#include "ubep/bootstrap.hpp"

namespace ubep::bootstrap {

class DeathWatch;

// Where a rank's heartbeat listens (issue 32: handed to a replacement host in the mesh, and by
// it to the live ranks in its hello). ip in network order; port 0: the rank runs none.
struct BeatAddr {
  uint32_t ip = 0;
  uint16_t port = 0;
  uint16_t pad = 0;
};

// Collective over `bootstrap` (one allgather) when the group spans hosts; nullptr when it does
// not, when UBEP_HOST_HEARTBEAT=off, or when this host's address cannot be found (logged).
// The result must be destroyed before `watch`. `addrs` (if given) gets every rank's address.
std::unique_ptr<HostHeartbeat> start_host_liveness(Bootstrap& bootstrap, int rank,
                                                   const std::vector<int>& host_of,
                                                   DeathWatch& watch,
                                                   std::vector<BeatAddr>* addrs = nullptr);

// A replacement rank's heartbeat (no collective: the live ranks' addresses come in the mesh):
// bound now, so that its address goes into the hello (*me; port 0 and nullptr when off or
// without an address), started by beat_to once the group's death watch exists.
std::unique_ptr<HostHeartbeat> bind_heartbeat(int rank, int size, uint32_t incarnation,
                                              BeatAddr* me);
// Starts `hb` beating to every rank of the other hosts that has an address in `addrs`; its
// verdicts go into `watch` as in start_host_liveness. `watch` must outlive hb.
void beat_to(HostHeartbeat& hb, int rank, const std::vector<int>& host_of,
             const std::vector<BeatAddr>& addrs, DeathWatch& watch);
// The address as the dotted IPv4 HostHeartbeat takes.
std::string dotted(const BeatAddr& a);

}  // namespace ubep::bootstrap
