// The main of every GoogleTest binary that runs under mpirun: MPI with serialized threads, one
// result printer (rank 0's), a world group for the tests, and the worst rank's result as the
// exit code (so a failure on any rank fails the ctest).
#pragma once

#include "ubep/group.hpp"

namespace ubep::test {

// The world group that mpi_gtest_main created (null when it was asked not to).
extern Group* g_group;

// Runs every test; `with_world_group` = false for suites that build their own groups (with
// their own timeouts). Arguments GoogleTest did not consume stay in argc/argv for the caller,
// which reads them before calling this through `parse_args`.
int mpi_gtest_main(int argc, char** argv, bool with_world_group,
                   void (*parse_args)(int argc, char** argv) = nullptr);

}  // namespace ubep::test
