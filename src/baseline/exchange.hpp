// The bulk exchange the MPI baseline is built on: the all-to-all-v a user without ubep calls.
// The baseline owns it, not Group: nothing else in the library moves data through a collective
// (the EP algorithms write into peers' windows), so the public Group offers none.
#pragma once

#include <cstdint>
#include <memory>

#include "ubep/baseline.hpp"
#include "ubep/group.hpp"

namespace ubep::baseline {

// The interface is public (ubep::BulkExchange, ubep/baseline.hpp) so that a tool can plug in
// another library's all-to-all-v. A rank whose recv_bytes[p] differs from what p sends gets
// InvalidArgument on thread ranks; MPI reports its own error.
using Exchange = BulkExchange;

// Collective (set-up only): MPI_Alltoallv on the communicator of a group from make_mpi_group;
// between ranks that are threads of one process, a one-copy exchange through memory; any other
// group (processes without MPI) has no bulk exchange to offer and gets InvalidArgument.
std::unique_ptr<Exchange> make_exchange(Group& group);

}  // namespace ubep::baseline
