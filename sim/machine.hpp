// The simulated machine: the library's Topology (levels, latencies, bandwidths, places) turned
// into links of the event engine, plus the cost parameters of a preset.
//
// Links per rank: one copy engine per worker, one local-memory link (level 0), and for each
// *port* a send link and a receive link. By default every level >= 1 is its own port, as the
// scheduler's cost model assumes (a rank has one link per level); a preset may map several
// levels onto one physical port (CloudMatrix: one-hop and two-hop UB traffic leave a die
// through the same UB links).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "sim/engine.hpp"
#include "sim/params.hpp"
#include "ubep/topology.hpp"

namespace ubep::sim {

struct Preset {
  sched::Topology topology;
  CostParams cost;
  std::vector<int> port_of_level;  // level -> port id (level 0 unused)
};

// `name`: cm384 | ubmesh8k | nvl72 | h800 | local | a path ending in .json (a user's pod,
// pod_file_preset). `local` reads the calibration file written by `ubep-sim calibrate`
// (default path: sim-calibration.json in the working directory).
Preset make_preset(const std::string& name, int ranks, const std::string& calibration_file = "");
// The cost parameters of cm384 (Ascend 910C dies), the base of the presets below.
CostParams cm384_costs();
// An 8,192-NPU SuperPoD of the UB-mesh class (Huawei's Atlas 950 SuperPoD figures; every value
// with its source in CostParams::sources): 128 cabinets of 64 NPUs. 1..8192 ranks.
Preset ubmesh8k_preset(int ranks);
// A user's pod: the topology through the library's reader (sched::from_json), plus the file's
// "sim" object: "ports" (a port id per level) and "costs" (the base cost preset: cm384 or
// ubmesh8k). `ranks` <= the file's "ranks"; fewer take the first ranks. docs/sim/TOPOLOGY.md.
Preset pod_file_preset(const std::string& path, int ranks);

// Links of one simulation run over a Network.
class Machine {
 public:
  Machine(const Preset& preset, Network& net, int workers_per_rank);
  const sched::Topology& topology() const { return preset_.topology; }
  const CostParams& cost() const { return preset_.cost; }
  int ranks() const { return preset_.topology.ranks(); }
  // Path of a transfer by `worker` of `src` to `dst` (worker < 0: no copy-engine cap).
  const std::vector<int>& path(int src, int worker, int dst);
  double latency_ns(int src, int dst) const { return preset_.topology.latency_ns(src, dst); }
  // Largest latency between any two ranks (a barrier round's wire time).
  double max_latency_ns() const { return max_latency_; }

 private:
  const Preset& preset_;
  int workers_;
  int ports_;
  std::vector<int> worker_link_;  // [rank * workers + w]
  std::vector<int> local_link_;   // [rank]
  std::vector<int> tx_, rx_;      // [rank * ports + port]
  double max_latency_ = 0;
  std::vector<int> scratch_;
};

}  // namespace ubep::sim
