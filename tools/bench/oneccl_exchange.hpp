// oneCCL's all-to-all-v as the bulk exchange of ubep's baseline (ubep::BulkExchange): `ubep-bench
// --algo oneccl` runs the same pack, unpack and reduce as the MPI baseline over ccl::alltoallv,
// so the row beside "mpi" isolates the transport (docs/INTEGRATIONS.md, "oneCCL"); so does
// python -m ubep.bench --algo oneccl (python/src/baseline.cpp). Compiled into both only when
// CMake is given oneCCL (-DUBEP_ONECCL_ROOT, PyPI oneccl-cpu-devel; cmake/oneccl.cmake).
#pragma once

#include <memory>

#include "ubep/baseline.hpp"
#include "ubep/group.hpp"

namespace ubep::tools {

// Collective over `group` (its set-up exchange carries the address of rank 0's oneCCL key-value
// store): a oneCCL communicator of the group's ranks, rank for rank. ubep-bench registers it
// as the exchange of --algo oneccl (register_exchange, bench.hpp).
std::unique_ptr<BulkExchange> make_oneccl_exchange(Group& group);

}  // namespace ubep::tools
