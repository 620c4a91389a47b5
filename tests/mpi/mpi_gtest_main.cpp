#include "mpi_gtest_main.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include "ubep/mpi_group.hpp"

namespace ubep::test {

Group* g_group = nullptr;

int mpi_gtest_main(int argc, char** argv, bool with_world_group,
                   void (*parse_args)(int argc, char** argv)) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  if (parse_args) parse_args(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = 0;
  {
    std::unique_ptr<Group> world;
    if (with_world_group) world = make_mpi_group();
    g_group = world.get();
    rc = RUN_ALL_TESTS();
    g_group = nullptr;
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

}  // namespace ubep::test
