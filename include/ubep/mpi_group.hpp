// Ranks as processes, started by mpirun. Include only when built with UBEP_WITH_MPI.
#pragma once

#include <mpi.h>

#include <memory>

#include "ubep/group.hpp"

namespace ubep {

// ranks_per_host = 0 discovers hosts (MPI_COMM_TYPE_SHARED).
using MpiGroupOptions = GroupOptions;

// Collective over `comm` (which must outlive the group). MPI must be initialised; ubep needs
// MPI_THREAD_MULTIPLE only if several threads call MPI at once (the library does not).
std::unique_ptr<Group> make_mpi_group(MPI_Comm comm = MPI_COMM_WORLD, MpiGroupOptions options = {});

}  // namespace ubep
