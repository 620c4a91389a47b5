// Instrumentation of one call: barriers it made, time per stage, bytes between hosts.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ubep {

struct CallStats {
  uint64_t barriers = 0;
  std::vector<std::pair<const char*, double>> stage_us;  // (stage, microseconds), in order
  // Of each stage in stage_us (same order), the microseconds spent waiting for a peer: bounded
  // waits on a count record, a row's tag or a flag that did not find it at once, summed over
  // the rank's role members (so with workers it can exceed the stage). The rest of a stage is
  // this rank's own work: copying, reducing, bookkeeping. Empty where not measured.
  std::vector<double> stage_wait_us;
  // Across hosts (0 on one host): bytes this rank sent over the network in the call, and token
  // rows among them (dispatch: one per (token, destination host)).
  uint64_t network_bytes = 0;
  uint64_t network_rows = 0;
};

}  // namespace ubep
