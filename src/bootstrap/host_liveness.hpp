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

#include <memory>
#include <vector>

#include "bootstrap/host_heartbeat.hpp"
#include "ubep/bootstrap.hpp"

namespace ubep::bootstrap {

class DeathWatch;

// Collective over `bootstrap` (one allgather) when the group spans hosts; nullptr when it does
// not, when UBEP_HOST_HEARTBEAT=off, or when this host's address cannot be found (logged).
// The result must be destroyed before `watch`.
std::unique_ptr<HostHeartbeat> start_host_liveness(Bootstrap& bootstrap, int rank,
                                                   const std::vector<int>& host_of,
                                                   DeathWatch& watch);

}  // namespace ubep::bootstrap
