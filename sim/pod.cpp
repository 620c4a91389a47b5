// Pods beyond cm384: the ubmesh8k preset and a user's pod file (machine.hpp).
#include <string>

#include "sim/json_read.hpp"
#include "sim/machine.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

namespace {

// Sets the source of `name`, replacing the base preset's line.
void src(CostParams& c, const char* name, const std::string& text) {
  for (auto& [k, v] : c.sources)
    if (k == name) {
      v = text;
      return;
    }
  c.sources.emplace_back(name, text);
}

// The first `ranks` ranks of `t` (a pod used in part: its groups keep their places).
sched::Topology first_ranks(const sched::Topology& t, int ranks) {
  if (ranks == t.ranks()) return t;
  std::vector<std::vector<int>> domains;
  for (int l = 1; l + 1 < t.num_levels(); ++l) {
    std::vector<int> d(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) d[static_cast<size_t>(r)] = t.domain_of(l, r);
    domains.push_back(std::move(d));
  }
  return sched::Topology(t.name(), t.levels(), ranks, std::move(domains));
}

// The file's "sim" object: per-level ports (default: a port per level) and the base costs.
void read_sim_section(const std::string& path, int levels, Preset& p) {
  p.port_of_level.resize(static_cast<size_t>(levels));
  for (int l = 0; l < levels; ++l) p.port_of_level[static_cast<size_t>(l)] = l;
  const JsonValue doc = read_json_file(path, "pod topology file");
  const JsonValue* sim = doc.find("sim");
  if (!sim) return;
  if (const JsonValue* costs = sim->find("costs")) {
    UBEP_CHECK_ARG(costs->kind == JsonValue::Kind::kString, path, ": sim.costs must be a string");
    if (costs->text == "ubmesh8k")
      p.cost = ubmesh8k_preset(1).cost;
    else
      UBEP_CHECK_ARG(costs->text == "cm384", path, ": sim.costs '", costs->text,
                     "' is not a cost preset (cm384 | ubmesh8k)");
  }
  for (const auto& m : sim->object)
    UBEP_CHECK_ARG(m.first == "ports" || m.first == "costs", path, ": unknown key sim.", m.first,
                   " (allowed: ports, costs)");
  const JsonValue* ports = sim->find("ports");
  if (!ports) return;
  UBEP_CHECK_ARG(
      ports->kind == JsonValue::Kind::kArray && static_cast<int>(ports->array.size()) == levels,
      path, ": sim.ports must be an array of one port id per level (", levels, " levels)");
  for (int l = 0; l < levels; ++l) {
    const JsonValue& v = ports->array[static_cast<size_t>(l)];
    UBEP_CHECK_ARG(v.kind == JsonValue::Kind::kNumber && v.number >= 0 && v.number < levels &&
                       v.number == static_cast<int>(v.number),
                   path, ": sim.ports[", l, "] must be an integer in 0..", levels - 1, ", got ",
                   v.kind == JsonValue::Kind::kNumber ? v.text : v.kind_name());
    p.port_of_level[static_cast<size_t>(l)] = static_cast<int>(v.number);
  }
}

}  // namespace

Preset ubmesh8k_preset(int ranks) {
  UBEP_CHECK_ARG(ranks >= 1 && ranks <= 8192, "ubmesh8k has 1..8192 NPUs, got ", ranks, " ranks");
  const int cabinet = 64;
  std::vector<int> cab(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) cab[static_cast<size_t>(r)] = r / cabinet;
  Preset p{
      sched::Topology("ubmesh8k", {{"npu", 218, 4000}, {"cabinet", 929, 1000}, {"pod", 2500, 1000}},
                      ranks, {cab}),
      cm384_costs(),
      {0, 1, 1}};
  CostParams& c = p.cost;
  c.preset = "ubmesh8k";
  src(c, "pod",
      "8,192 NPUs = 128 cabinets x 64 [SPEC]: Huawei Atlas 950 SuperPoD (Huawei Connect 2025), "
      "a UB-mesh-class pod (UB-Mesh, arXiv 2503.20377)");
  src(c, "level npu",
      "218 ns [ASSUME: as cm384's local access, CMI], 4000 GB/s [SPEC: Ascend 950DT HBM 4 TB/s]");
  src(c, "level cabinet",
      "929 ns [ASSUME: one UB switch tier, as cm384's ub1, CMI]; 1000 GB/s per NPU each way "
      "[SPEC 2 TB/s UB interconnect per Ascend 950, ASSUME split evenly in and out]");
  src(c, "level pod",
      "2500 ns [ASSUME: two switch tiers, as cm384's ub2, CMI; optical links would add more]; "
      "1000 GB/s [ASSUME: the same UB ports as the cabinet level (port 1), as in cm384]");
  c.worker_GBps = 4000.0 / 48;
  src(c, "worker_GBps",
      "83.3 GB/s [SPEC 4 TB/s HBM / ASSUME 48 vector cores: Ascend 950's core count is not "
      "published, the 910C die's is kept]");
  c.local_copy_GBps = c.worker_GBps;
  src(c, "local_copy_GBps", "83.3 GB/s: as worker_GBps (HBM to HBM)");
  src(c, "other costs", "as cm384 [ASSUME: same UB protocol and core software]");
  return p;
}

Preset pod_file_preset(const std::string& path, int ranks) {
  // The library's reader: a malformed file is an InvalidArgument naming the line and the field.
  const sched::Topology pod = sched::from_json(path, 0);
  UBEP_CHECK_ARG(ranks <= pod.ranks(), path, ": --ranks ", ranks,
                 " is more than the pod's \"ranks\": ", pod.ranks());
  Preset p{first_ranks(pod, ranks), cm384_costs(), {}};
  read_sim_section(path, pod.num_levels(), p);
  p.cost.preset = pod.name();
  src(p.cost, "topology", "the pod file " + path + " (levels, groups, latencies, bandwidths)");
  return p;
}

}  // namespace ubep::sim
