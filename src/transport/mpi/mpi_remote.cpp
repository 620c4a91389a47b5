#include "transport/mpi/mpi_remote.hpp"

#include <climits>

#include "ubep/error.hpp"

namespace ubep::transport {

namespace {
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw SystemError(detail::concat(what, " failed with MPI error ", rc));
}
}  // namespace

int MpiRemote::slot() {
  if (!free_.empty()) {
    const int s = free_.back();
    free_.pop_back();
    return s;
  }
  requests_.push_back(MPI_REQUEST_NULL);
  return static_cast<int>(requests_.size()) - 1;
}

int MpiRemote::isend(int peer, int tag, const void* data, size_t bytes) {
  UBEP_CHECK_ARG(bytes <= INT_MAX, "remote message of ", bytes, " bytes exceeds 2 GiB");
  const int s = slot();
  check(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_,
                  &requests_[static_cast<size_t>(s)]),
        "MPI_Isend");
  return s;
}

int MpiRemote::irecv(int peer, int tag, void* data, size_t capacity) {
  UBEP_CHECK_ARG(capacity <= INT_MAX, "remote message capacity of ", capacity,
                 " bytes exceeds 2 GiB");
  const int s = slot();
  check(MPI_Irecv(data, static_cast<int>(capacity), MPI_BYTE, peer, tag, comm_,
                  &requests_[static_cast<size_t>(s)]),
        "MPI_Irecv");
  return s;
}

bool MpiRemote::test(int request, size_t* bytes) {
  int done = 0;
  MPI_Status status;
  check(MPI_Test(&requests_[static_cast<size_t>(request)], &done, &status), "MPI_Test");
  if (!done) return false;
  if (bytes) {
    int n = 0;
    MPI_Get_count(&status, MPI_BYTE, &n);
    *bytes = static_cast<size_t>(n);
  }
  free_.push_back(request);
  return true;
}

void MpiRemote::cancel(int request) {
  MPI_Request& r = requests_[static_cast<size_t>(request)];
  if (r != MPI_REQUEST_NULL) {
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);  // a cancelled receive completes at once
  }
  free_.push_back(request);
}

}  // namespace ubep::transport
