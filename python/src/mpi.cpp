// mpi4py communicators as the C++ make_mpi_group sees them: host discovery
// (MPI_COMM_TYPE_SHARED), shared memory within a host, the relay over MPI between hosts. Built
// with UBEP_WITH_MPI only; without it the module says so (has_mpi = False) and the Python layer
// falls back to its one-host bootstrap or names the build option.
//
// The communicator crosses as its Fortran handle (mpi4py's comm.py2f(), MPI_Comm_f2c here), not
// as the C handle (MPI._handleof): the Fortran handle is an integer in every MPI, while the C
// MPI_Comm is a pointer in Open MPI and an int in MPICH, so only the Fortran one has a type this
// module can take without knowing which MPI mpi4py was built for. Whether both sides are the
// same MPI is checked separately (the Python layer compares MPI_Get_library_version strings;
// here the converted handle must name a communicator of the rank and size mpi4py reports).
#include <pybind11/pybind11.h>

#include <chrono>
#include <string>

#include "interrupt.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"
#ifdef UBEP_WITH_MPI
#include "ubep/mpi_group.hpp"
#endif

namespace pb = pybind11;

namespace ubep::python {

#ifdef UBEP_WITH_MPI
namespace {

std::string library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(v, &len);  // callable before MPI_Init (MPI-3)
  return std::string(v, static_cast<size_t>(len));
}

std::unique_ptr<Group> group_of_handle(int64_t fortran_handle, int expect_rank, int expect_size,
                                       double timeout_s, int ranks_per_host,
                                       const std::string& elastic_name) {
  UBEP_CHECK_ARG(timeout_s > 0, "make_group: timeout must be > 0 seconds, got ", timeout_s);
  UBEP_CHECK_ARG(ranks_per_host >= 0, "make_group: ranks_per_host must be >= 0, got ",
                 ranks_per_host);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // mpi4py initialised *its* MPI; if ours is not, the two are different libraries.
  UBEP_CHECK_ARG(initialized && !finalized, "make_group: the MPI library ubep was built with (",
                 library_version(), ") is ", finalized ? "finalized" : "not initialised",
                 " in this process although mpi4py's is: mpi4py and ubep must use the same MPI");
  const MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
  // Open MPI's MPI_Comm_f2c returns a null pointer for an index it never handed out.
  UBEP_CHECK_ARG(comm != nullptr && comm != MPI_COMM_NULL,
                 "make_group: the communicator's "
                 "handle (Fortran handle ",
                 fortran_handle,
                 " from mpi4py's py2f()) does not "
                 "convert to a communicator of ubep's MPI (",
                 library_version(), ")");
  int rank = -1, size = -1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  UBEP_CHECK_ARG(rank == expect_rank && size == expect_size, "make_group: Fortran handle ",
                 fortran_handle, " is rank ", rank, " of ", size, " in ubep's MPI but rank ",
                 expect_rank, " of ", expect_size, " in mpi4py's: not the same MPI library");
  MpiGroupOptions o;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  o.ranks_per_host = ranks_per_host;
  o.elastic_name = elastic_name;
  // Collective over the communicator, bounded by the timeout; no Python inside.
  return without_gil([&] { return make_mpi_group(comm, o); });
}

}  // namespace
#endif

void bind_mpi(pb::module_& m) {
#ifdef UBEP_WITH_MPI
  m.attr("has_mpi") = true;
  m.def("mpi_library_version", &library_version,
        "MPI_Get_library_version of the MPI this module was built with.");
  m.def("make_mpi_group", &group_of_handle, pb::arg("fortran_handle"), pb::arg("rank"),
        pb::arg("size"), pb::arg("timeout") = 60.0, pb::arg("ranks_per_host") = 0,
        pb::arg("elastic_name") = "",
        "make_mpi_group on the communicator whose Fortran handle (mpi4py: comm.py2f()) is given; "
        "rank and size are mpi4py's, checked against what ubep's MPI says of the handle.");
#else
  m.attr("has_mpi") = false;
#endif
}

}  // namespace ubep::python
