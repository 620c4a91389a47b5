// Topology model, presets and the single-link sharing function. Figures and their sources are
// in docs/SCHEDULING.md; every preset states below which figures are datasheet values and which
// are estimates.
#include "ubep/topology.hpp"

#include <cctype>
#include <cmath>
#include <map>
#include <sstream>
#include <vector>

#include "fluid.hpp"
#include "ubep/error.hpp"

namespace ubep::sched {

Topology::Topology(std::string name, std::vector<Level> levels, int ranks,
                   std::vector<std::vector<int>> domain_of)
    : name_(std::move(name)),
      levels_(std::move(levels)),
      ranks_(ranks),
      domain_of_(std::move(domain_of)) {
  UBEP_CHECK_ARG(ranks_ >= 1, "topology '", name_, "': ranks must be >= 1, got ", ranks_);
  UBEP_CHECK_ARG(levels_.size() >= 2, "topology '", name_,
                 "' needs at least 2 levels (same rank, and one joining all ranks), got ",
                 levels_.size());
  for (size_t l = 0; l < levels_.size(); ++l) {
    const Level& lv = levels_[l];
    UBEP_CHECK_ARG(!lv.name.empty(), "topology '", name_, "': level ", l, " has no name");
    UBEP_CHECK_ARG(std::isfinite(lv.latency_ns) && lv.latency_ns >= 0, "topology '", name_,
                   "': level '", lv.name, "' latency_ns must be >= 0, got ", lv.latency_ns);
    UBEP_CHECK_ARG(std::isfinite(lv.bandwidth_gbps) && lv.bandwidth_gbps > 0, "topology '", name_,
                   "': level '", lv.name, "' bandwidth_gbps must be > 0, got ", lv.bandwidth_gbps);
  }
  const size_t middle = levels_.size() - 2;
  UBEP_CHECK_ARG(domain_of_.size() == middle, "topology '", name_, "': ", levels_.size(),
                 " levels need ", middle, " domain vectors (one per middle level), got ",
                 domain_of_.size());
  for (size_t m = 0; m < middle; ++m) {
    const auto& d = domain_of_[m];
    UBEP_CHECK_ARG(d.size() == static_cast<size_t>(ranks_), "topology '", name_, "': level '",
                   levels_[m + 1].name, "' places ", d.size(), " ranks, expected ", ranks_);
    for (size_t r = 0; r < d.size(); ++r)
      UBEP_CHECK_ARG(d[r] >= 0, "topology '", name_, "': level '", levels_[m + 1].name,
                     "' gives rank ", r, " the negative domain id ", d[r]);
  }
  // Domains must nest: ranks sharing a level-l domain share one at level l+1, i.e. each
  // level-l domain lies inside exactly one level-(l+1) domain.
  for (size_t m = 0; m + 1 < middle; ++m) {
    std::map<int, std::pair<int, int>> parent;  // domain -> (parent domain, first rank seen)
    for (int r = 0; r < ranks_; ++r) {
      const int d = domain_of_[m][static_cast<size_t>(r)];
      const int p = domain_of_[m + 1][static_cast<size_t>(r)];
      auto [it, fresh] = parent.try_emplace(d, p, r);
      UBEP_CHECK_ARG(fresh || it->second.first == p, "topology '", name_,
                     "': domains do not nest: ", "ranks ", it->second.second, " and ", r,
                     " share domain ", d, " of level '", levels_[m + 1].name,
                     "' but not a domain of level '", levels_[m + 2].name, "' (", it->second.first,
                     " vs ", p, ")");
    }
  }
}

const Level& Topology::level(int l) const {
  UBEP_CHECK_ARG(l >= 0 && l < num_levels(), "topology '", name_, "': level ", l,
                 " out of range [0, ", num_levels(), ")");
  return levels_[static_cast<size_t>(l)];
}

int Topology::domain_of(int l, int rank) const {
  UBEP_CHECK_ARG(l >= 1 && l <= num_levels() - 2, "topology '", name_, "': level ", l,
                 " has no domains (middle levels are 1..", num_levels() - 2, ")");
  check_rank(rank, "rank");
  return domain_of_[static_cast<size_t>(l - 1)][static_cast<size_t>(rank)];
}

void Topology::check_rank(int rank, const char* what) const {
  UBEP_CHECK_ARG(rank >= 0 && rank < ranks_, "topology '", name_, "': ", what, " ", rank,
                 " out of range [0, ", ranks_, ")");
}

int Topology::level_between(int a, int b) const {
  check_rank(a, "rank");
  check_rank(b, "rank");
  if (a == b) return 0;
  for (size_t m = 0; m < domain_of_.size(); ++m)
    if (domain_of_[m][static_cast<size_t>(a)] == domain_of_[m][static_cast<size_t>(b)])
      return static_cast<int>(m) + 1;
  return num_levels() - 1;
}

double Topology::transfer_ns(int a, int b, double bytes) const {
  UBEP_CHECK_ARG(bytes >= 0, "transfer of ", bytes, " bytes: must be >= 0");
  const Level& lv = levels_[static_cast<size_t>(level_between(a, b))];
  // GB/s = 1e9 B/s = 1 byte per ns.
  return lv.latency_ns + bytes / lv.bandwidth_gbps;
}

std::string Topology::describe() const {
  std::ostringstream os;
  os << name_ << "(" << ranks_ << " ranks:";
  for (size_t l = 0; l < levels_.size(); ++l)
    os << (l ? " |" : "") << " " << levels_[l].name << " " << levels_[l].latency_ns << "ns "
       << levels_[l].bandwidth_gbps << "GB/s";
  os << ")";
  return os.str();
}

// ---- Presets --------------------------------------------------------------------------------

namespace {
// Rank r belongs to domain r / group at a middle level.
std::vector<int> blocks(int ranks, int group) {
  std::vector<int> d(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) d[static_cast<size_t>(r)] = r / group;
  return d;
}
}  // namespace

Topology cm384(int ranks) {
  // CloudMatrix384: 48 nodes x 8 Ascend 910C NPUs x 2 dies = 768 dies; the 16 dies of a node
  // reach each other through the node's L1 UB switches (one hop), other nodes through the L2 UB
  // switches (two hops). Latencies are the UBEP paper's memory-access figures; 392 GB/s is
  // the UB bandwidth per link quoted by the paper (the CloudMatrix384 paper gives 392 GB/s
  // unidirectional per NPU; we apply it per die, see docs). Local: one die's HBM, 1.6 TB/s
  // (3.2 TB/s per two-die 910C package).
  UBEP_CHECK_ARG(ranks >= 1 && ranks <= 768, "cm384 has 1..768 NPU dies, got ", ranks, " ranks");
  return Topology("cm384", {{"die", 218, 1600}, {"ub1", 929, 392}, {"ub2", 2500, 392}}, ranks,
                  {blocks(ranks, 16)});
}

Topology nvl72(int ranks) {
  // GB200 NVL72 datasheet: 1.8 TB/s NVLink 5 per GPU (bidirectional) -> 900 GB/s per direction,
  // every GPU one NVSwitch hop from every other; HBM3e 8 TB/s per GPU. Latencies are estimates
  // (no vendor figure): ~0.5 us for a local HBM access, ~1 us for a store through NVSwitch.
  UBEP_CHECK_ARG(ranks >= 1 && ranks <= 72, "nvl72 has 1..72 GPUs, got ", ranks, " ranks");
  return Topology("nvl72", {{"gpu", 500, 8000}, {"nvlink", 1000, 900}}, ranks);
}

Topology h800(int ranks) {
  // H800 SXM: HBM3 3.35 TB/s; NVLink 400 GB/s bidirectional -> 200 GB/s per direction nominal,
  // ~160 GB/s achieved (DeepEP's intranode measurements reach 153-158 GB/s); one 400 Gb/s
  // (50 GB/s) ConnectX-7 InfiniBand NIC per GPU. Latencies are estimates: ~1 us NVLink store,
  // ~3 us GPU-initiated RDMA write through one IB switch.
  UBEP_CHECK_ARG(ranks >= 1 && (ranks <= 8 || ranks % 8 == 0),
                 "h800 clusters have nodes of 8 GPUs: ranks must be 1..8 or a multiple of 8, got ",
                 ranks);
  return Topology("h800", {{"gpu", 500, 3350}, {"nvlink", 1000, 160}, {"ib", 3000, 50}}, ranks,
                  {blocks(ranks, 8)});
}

Topology hosts_by_ranks(int hosts, int ranks_per_host) {
  UBEP_CHECK_ARG(hosts >= 1, "HxR topology: hosts must be >= 1, got ", hosts);
  UBEP_CHECK_ARG(ranks_per_host >= 1, "HxR topology: ranks per host must be >= 1, got ",
                 ranks_per_host);
  // CPU ranks: rough figures for tests (a memcpy, a cache-line handoff through shared memory,
  // MPI over TCP). The simulator's `local` preset measures this machine instead.
  const int ranks = hosts * ranks_per_host;
  return Topology(std::to_string(hosts) + "x" + std::to_string(ranks_per_host),
                  {{"self", 100, 10}, {"shm", 300, 8}, {"network", 30000, 1}}, ranks,
                  {blocks(ranks, ranks_per_host)});
}

namespace {
// Parses "HxR" with both parts positive decimal integers; false if `s` has another shape.
bool parse_hxr(const std::string& s, int& h, int& r) {
  const size_t x = s.find('x');
  if (x == std::string::npos || x == 0 || x + 1 >= s.size()) return false;
  for (size_t i = 0; i < s.size(); ++i)
    if (i != x && !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  if (x > 6 || s.size() - x - 1 > 6) return false;  // keeps the product within int
  h = std::stoi(s.substr(0, x));
  r = std::stoi(s.substr(x + 1));
  return true;
}
}  // namespace

Topology parse_topology(const std::string& spec, int ranks) {
  UBEP_CHECK_ARG(ranks >= 1, "parse_topology('", spec, "'): ranks must be >= 1, got ", ranks);
  if (spec == "cm384") return cm384(ranks);
  if (spec == "nvl72") return nvl72(ranks);
  if (spec == "h800") return h800(ranks);
  int h = 0, r = 0;
  if (parse_hxr(spec, h, r)) {
    UBEP_CHECK_ARG(h >= 1 && r >= 1, "topology '", spec,
                   "': hosts and ranks per host must be >= 1");
    UBEP_CHECK_ARG(h * r == ranks, "topology '", spec, "' has ", h * r, " ranks but the group has ",
                   ranks);
    return hosts_by_ranks(h, r);
  }
  const bool json = spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".json") == 0;
  if (json || spec.find('/') != std::string::npos) return from_json(spec, ranks);
  UBEP_CHECK_ARG(false, "unknown topology '", spec,
                 "': expected cm384, nvl72, h800, HxR (e.g. 2x4) or a path to a .json file");
  return hosts_by_ranks(1, 1);  // unreachable
}

void concurrent_finish_ns(std::span<const Flow> flows, double link_gbps, double flow_cap_gbps,
                          std::span<double> out) {
  UBEP_CHECK_ARG(out.size() == flows.size(), "concurrent_finish_ns: out has ", out.size(),
                 " entries for ", flows.size(), " flows");
  UBEP_CHECK_ARG(link_gbps > 0, "link bandwidth must be > 0 GB/s, got ", link_gbps);
  // One stream per flow, all on link 0.
  std::vector<detail::FluidItem> items(flows.size());
  std::vector<int32_t> begin(flows.size() + 1);
  for (size_t i = 0; i < flows.size(); ++i) {
    items[i] = {0, flows[i].latency_ns, flows[i].bytes};
    begin[i] = static_cast<int32_t>(i);
  }
  begin[flows.size()] = static_cast<int32_t>(flows.size());
  const double links[1] = {link_gbps};
  detail::fluid_finish(items, begin, links, flow_cap_gbps, out);
}

}  // namespace ubep::sched
