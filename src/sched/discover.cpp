// Topology discovery: hosts from the caller (the Group knows them), NUMA layout from hwloc.
// hwloc is optional: without it (libhwloc-dev not found at configure time) every host is taken
// to have one NUMA node and one socket.
#include <algorithm>
#include <vector>

#include "ubep/error.hpp"
#include "ubep/group.hpp"
#include "ubep/topology.hpp"

#ifdef UBEP_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace ubep::sched {

namespace {
#ifdef UBEP_HAVE_HWLOC
int hwloc_count(hwloc_obj_type_t type) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return 1;
  int n = 1;
  if (hwloc_topology_load(topo) == 0) n = hwloc_get_nbobjs_by_type(topo, type);
  hwloc_topology_destroy(topo);
  return std::max(n, 1);  // 0 (type absent) or -1 (type on several depths) -> treat as one
}
#endif
}  // namespace

bool hwloc_available() {
#ifdef UBEP_HAVE_HWLOC
  return true;
#else
  return false;
#endif
}

int discover_numa_nodes() {
#ifdef UBEP_HAVE_HWLOC
  return hwloc_count(HWLOC_OBJ_NUMANODE);
#else
  return 1;
#endif
}

int discover_sockets() {
#ifdef UBEP_HAVE_HWLOC
  return hwloc_count(HWLOC_OBJ_PACKAGE);
#else
  return 1;
#endif
}

Topology discover(std::span<const int> host_of, const DiscoverOptions& options) {
  const int ranks = static_cast<int>(host_of.size());
  UBEP_CHECK_ARG(ranks >= 1, "discover: host_of must name the host of at least one rank");
  int hosts = 0;
  for (int r = 0; r < ranks; ++r) {
    UBEP_CHECK_ARG(host_of[static_cast<size_t>(r)] >= 0 && host_of[static_cast<size_t>(r)] < ranks,
                   "discover: host id ", host_of[static_cast<size_t>(r)], " of rank ", r,
                   " out of range [0, ", ranks, ")");
    hosts = std::max(hosts, host_of[static_cast<size_t>(r)] + 1);
  }
  std::vector<int> local_count(static_cast<size_t>(hosts), 0);
  for (int h : host_of) ++local_count[static_cast<size_t>(h)];
  for (int h = 0; h < hosts; ++h)
    UBEP_CHECK_ARG(local_count[static_cast<size_t>(h)] > 0,
                   "discover: host ids must be dense "
                   "(0..",
                   hosts - 1, "), but no rank is on host ", h);

  const int numa = discover_numa_nodes();
  std::vector<int> numa_of(static_cast<size_t>(ranks));
  if (!options.numa_of.empty()) {
    UBEP_CHECK_ARG(options.numa_of.size() == static_cast<size_t>(ranks), "discover: numa_of has ",
                   options.numa_of.size(), " entries for ", ranks, " ranks");
    for (int r = 0; r < ranks; ++r) {
      const int n = options.numa_of[static_cast<size_t>(r)];
      UBEP_CHECK_ARG(n >= 0 && n < numa, "discover: NUMA node ", n, " of rank ", r,
                     " out of range [0, ", numa, ") on this machine");
      numa_of[static_cast<size_t>(r)] = n;
    }
  } else {
    // Contiguous blocks of a host's local ranks per NUMA node (mpirun --map-by numa).
    std::vector<int> seen(static_cast<size_t>(hosts), 0);
    for (int r = 0; r < ranks; ++r) {
      const size_t h = static_cast<size_t>(host_of[static_cast<size_t>(r)]);
      numa_of[static_cast<size_t>(r)] = seen[h]++ * numa / local_count[h];
    }
  }
  std::vector<int> numa_domain(static_cast<size_t>(ranks)),
      host_domain(host_of.begin(), host_of.end());
  for (int r = 0; r < ranks; ++r)
    numa_domain[static_cast<size_t>(r)] =
        host_of[static_cast<size_t>(r)] * numa + numa_of[static_cast<size_t>(r)];
  return Topology("discovered", {options.self, options.numa, options.host, options.network}, ranks,
                  {std::move(numa_domain), std::move(host_domain)});
}

Topology discover(const Group& group, const DiscoverOptions& options) {
  std::vector<int> host_of(static_cast<size_t>(group.size()));
  for (int r = 0; r < group.size(); ++r) host_of[static_cast<size_t>(r)] = group.host_of(r);
  return discover(host_of, options);
}

}  // namespace ubep::sched
