// The communicator under a group from make_mpi_group, for the MPI baseline's MPI_Alltoallv
// (src/baseline/exchange.cpp): Group itself offers no bulk exchange. Built with UBEP_WITH_MPI only.
#pragma once

#include <mpi.h>

#include "ubep/group.hpp"

namespace ubep::detail {

// Throws SystemError naming `what` and MPI's message unless rc is MPI_SUCCESS.
void mpi_check(int rc, const char* what);

// MPI_COMM_NULL when `group` was not made by make_mpi_group.
MPI_Comm mpi_comm_of(Group& group);

}  // namespace ubep::detail
