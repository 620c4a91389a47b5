// How the MPI baseline splits its loops over the rank's worker threads (src/baseline only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>

#include "core/worker_team.hpp"
#include "ubep/group.hpp"

namespace ubep::baseline {

// fn(member, begin, end) over [0, n), cut into team.size() contiguous chunks; member 0 is the
// caller. The baseline's pack, unpack and reduce loops run on the same WorkerTeam as ubep's roles,
// so with workers > 0 the baseline gets the cores and the wake-up ubep gets (a fair comparison).
// WorkerTeam::run returns after every member's writes are visible to the caller.
template <typename F>
void for_range(cpu::WorkerTeam& team, int64_t n, F&& fn) {
  const int m = team.size();
  if (m == 1 || n < 2) {
    fn(0, int64_t{0}, n);
    return;
  }
  team.run([&fn, n, m](int i) { fn(i, n * i / m, n * (i + 1) / m); });
}

// Worker threads as ubep::Buffer sizes them: -1 = cores per rank on this host, minus the caller.
inline int resolve_workers(const Group& g, int n) {
  if (n >= 0) return n;
  int local = 0;
  for (int r = 0; r < g.size(); ++r) local += g.same_host(r, g.rank());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(0, cores / std::max(1, local) - 1);
}

}  // namespace ubep::baseline
