// Topology model and point-to-point cost model of ubep's hop-aware scheduler.
//
// A Topology is a ladder of *levels*, from the closest (level 0: a rank talking to itself) to
// the farthest (the top level: every rank can reach every other one through it). Each level has
// one latency and one per-link bandwidth. Each rank has a *place*: for every middle level
// 1..L-2, the id of the domain (board, node, host, NUMA node...) it belongs to. Two ranks talk
// at the lowest level whose domain they share; domains nest (sharing a domain at level l implies
// sharing one at every level above).
//
// The cost of moving n bytes from a to b is latency(level) + n / bandwidth(level). Concurrent
// transfers from one sender share its link of that level; see concurrent_finish_ns() here and
// simulate_sharing() in ubep/scheduler.hpp. docs/SCHEDULING.md derives every preset figure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ubep {
class Group;
}

namespace ubep::sched {

// One rung of the ladder. Bandwidth is GB/s = 1e9 bytes/s = bytes per ns, per link and per
// direction; latency is the one-way time before the first byte lands.
struct Level {
  std::string name;
  double latency_ns = 0;
  double bandwidth_gbps = 0;
};

class Topology {
 public:
  // levels[0] is "same rank"; levels.back() joins every rank. domain_of has one entry per middle
  // level (levels.size() - 2 of them), each with one domain id per rank (ids are arbitrary
  // non-negative integers). Throws InvalidArgument naming the bad value: fewer than 2 levels,
  // latency < 0, bandwidth <= 0, ranks < 1, a domain vector of the wrong length, a negative id,
  // or domains that do not nest.
  Topology(std::string name, std::vector<Level> levels, int ranks,
           std::vector<std::vector<int>> domain_of = {});

  const std::string& name() const { return name_; }
  int ranks() const { return ranks_; }
  int num_levels() const { return static_cast<int>(levels_.size()); }
  const Level& level(int l) const;
  const std::vector<Level>& levels() const { return levels_; }
  // Domain id of `rank` at middle level l (1 <= l <= num_levels()-2).
  int domain_of(int l, int rank) const;

  // The level two ranks talk at: 0 when a == b, else the lowest level whose domain they share.
  int level_between(int a, int b) const;
  double latency_ns(int a, int b) const { return levels_[level_between(a, b)].latency_ns; }
  double bandwidth_gbps(int a, int b) const { return levels_[level_between(a, b)].bandwidth_gbps; }
  // Cost model: latency + bytes / bandwidth of the pair's level, for a transfer that has the
  // sender's link to itself.
  double transfer_ns(int a, int b, double bytes) const;

  // One-line description, e.g. "cm384(64 ranks: die 218ns 1600GB/s | ub1 929ns 392GB/s | ...)".
  std::string describe() const;

 private:
  void check_rank(int rank, const char* what) const;

  std::string name_;
  std::vector<Level> levels_;
  int ranks_ = 0;
  std::vector<std::vector<int>> domain_of_;  // [middle level - 1][rank]
};

// ---- Presets (figures and sources in docs/SCHEDULING.md) ----------------------------------------

// Huawei CloudMatrix384: ranks are NPU dies; 16 dies (8 Ascend 910C x 2 dies) share a node and
// reach each other through one tier of UB switches (929 ns); other dies are two hops away
// through the second tier (2500 ns). Local access 218 ns. UB ~392 GB/s per link.
// Levels: die, ub1, ub2. At most 768 dies (384 NPUs).
Topology cm384(int ranks);
// NVIDIA GB200 NVL72: up to 72 GPUs, one hop through NVSwitch. Levels: gpu, nvlink.
Topology nvl72(int ranks);
// H800 cluster: nodes of 8 GPUs on NVLink (~160 GB/s achieved), 400 Gb/s InfiniBand per GPU
// between nodes. Levels: gpu, nvlink, ib. ranks must be a multiple of 8 or below 8.
Topology h800(int ranks);
// `hosts` hosts x `ranks_per_host` CPU ranks (for tests and forced multi-host runs).
// Levels: self, shm, network. Rank r lives on host r / ranks_per_host.
Topology hosts_by_ranks(int hosts, int ranks_per_host);

// Reads a topology from a JSON file (format in docs/SCHEDULING.md). `ranks` = 0 takes the count
// from the file; otherwise it must match the file's. Strict: unknown keys, duplicate keys,
// wrong types and trailing text are errors; every error is an InvalidArgument naming the file,
// the line:column and the bad value.
Topology from_json(const std::string& path, int ranks = 0);
// Same, from JSON text (`origin` names it in error messages).
Topology from_json_text(const std::string& text, int ranks = 0,
                        const std::string& origin = "<json>");

// `spec` is a preset name (cm384, nvl72, h800), "HxR" (e.g. "2x4": H hosts x R ranks), or a path
// to a .json file. `ranks` is the group size (HxR and files must agree with it).
Topology parse_topology(const std::string& spec, int ranks);

// ---- Discovery --------------------------------------------------------------------------------

// Figures discovery cannot measure; defaults are documented estimates for a commodity x86 host.
struct DiscoverOptions {
  Level self{"self", 80, 10};             // a copy inside a rank's own memory
  Level numa{"numa", 150, 10};            // shared memory inside one NUMA node
  Level host{"host", 250, 8};             // shared memory across NUMA nodes / sockets of a host
  Level network{"network", 20000, 1.25};  // MPI between hosts (10 GbE)
  // Optional NUMA node of each rank inside its host (e.g. from its CPU binding). Empty: the
  // local ranks of a host are spread over its NUMA nodes in contiguous blocks, as mpirun
  // --map-by numa places them.
  std::vector<int> numa_of;
};

// True when the library was built with hwloc (libhwloc-dev found by pkg-config).
bool hwloc_available();
// Number of NUMA nodes and of sockets (packages) of this machine: hwloc when available, else 1.
int discover_numa_nodes();
int discover_sockets();

// Builds a topology from the host of every rank (Group::host_of gives it) and this machine's
// NUMA layout (hwloc; every host is assumed to look like this one). Levels: self, numa, host,
// network. host_of ids must be dense (0..H-1).
Topology discover(std::span<const int> host_of, const DiscoverOptions& options = {});
// Same, with host_of from the group. Local call, no communication.
Topology discover(const Group& group, const DiscoverOptions& options = {});

// ---- Link sharing -----------------------------------------------------------------------------

// One transfer from a sender: `bytes` go out through the sender's link, and the transfer is
// complete `latency_ns` after the last byte left (the flight to the destination). Alone on a
// link of bandwidth B it takes bytes / B + latency_ns, the cost model above.
struct Flow {
  double latency_ns = 0;
  double bytes = 0;
};

// Completion times of flows that start together on one link of `link_gbps`. While k flows are
// issuing bytes each gets min(flow_cap_gbps, link_gbps / k) (max-min fair share; a cap of 0
// means uncapped), so the link is work-conserving: when one flow's bytes are out the others
// speed up. Writes out[i] for flows[i]; out.size() must equal flows.size().
void concurrent_finish_ns(std::span<const Flow> flows, double link_gbps, double flow_cap_gbps,
                          std::span<double> out);

}  // namespace ubep::sched
