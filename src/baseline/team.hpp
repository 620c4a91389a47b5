// How the MPI baseline splits its loops over the rank's worker threads (src/baseline only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <thread>

#include "backend/data_path.hpp"
#include "backend/factory/factory.hpp"
#include "ubep/group.hpp"

namespace ubep::baseline {

// fn(member, begin, end) over [0, n), cut into dp.members() contiguous chunks; member 0 is the
// caller. The baseline's pack, unpack and reduce loops run on the roles of the same data path as
// ubep's (backend::make_data_path), so with workers > 0 the baseline gets the cores and the
// wake-up ubep gets (a fair comparison). run_roles returns after every member's writes are
// visible to the caller.
template <typename F>
void for_range(backend::DataPath& dp, int64_t n, F&& fn) {
  const int m = dp.members();
  if (m == 1 || n < 2) {
    fn(0, int64_t{0}, n);
    return;
  }
  dp.run_roles([&fn, n, m](int i) { fn(i, n * i / m, n * (i + 1) / m); });
}

// Worker threads as ubep::Buffer sizes them: -1 = cores per rank on this host, minus the caller.
inline int resolve_workers(const Group& g, int n) {
  if (n >= 0) return n;
  int local = 0;
  for (int r = 0; r < g.size(); ++r) local += g.same_host(r, g.rank());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(0, cores / std::max(1, local) - 1);
}

// The CPU data path the baseline's loops run on: host memory, whatever device the tensors are
// tagged with (the baseline moves host memory only), with the workers resolve_workers gives.
inline std::unique_ptr<backend::DataPath> make_roles(const Group& g, BufferConfig c) {
  c.num_workers = resolve_workers(g, c.num_workers);
  c.device = Device{};
  return backend::make_data_path(c);
}

}  // namespace ubep::baseline
