// The bulk exchange the MPI baseline is built on: the all-to-all-v a user without ubep calls.
// The baseline owns it, not Group: nothing else in the library moves data through a collective
// (the EP algorithms write into peers' windows), so the public Group offers none.
#pragma once

#include <cstdint>
#include <memory>

#include "ubep/group.hpp"

namespace ubep::baseline {

class Exchange {
 public:
  virtual ~Exchange() = default;
  // Collective variable all-to-all of bytes: send_bytes[p] bytes from send + send_offsets[p] go
  // to rank p, which receives them at recv + recv_offsets[me]. A rank whose recv_bytes[p]
  // differs from what p sends gets InvalidArgument (on thread ranks; MPI reports its own error).
  virtual void alltoallv(const void* send, const int64_t* send_bytes, const int64_t* send_offsets,
                         void* recv, const int64_t* recv_bytes, const int64_t* recv_offsets) = 0;
  // "mpi" (MPI_Alltoallv) or "a2a" (the one-copy exchange between threads of one process).
  virtual const char* name() const = 0;
};

// Collective (set-up only): MPI_Alltoallv on the communicator of a group from make_mpi_group;
// between ranks that are threads of one process, a one-copy exchange through memory; any other
// group (processes without MPI) has no bulk exchange to offer and gets InvalidArgument.
std::unique_ptr<Exchange> make_exchange(Group& group);

}  // namespace ubep::baseline
