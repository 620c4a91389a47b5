// The Remote transport over MPI point-to-point (Isend/Irecv/Test), used between hosts.
#pragma once

#include <mpi.h>

#include <vector>

#include "transport/remote.hpp"

namespace ubep::transport {

class MpiRemote : public Remote {
 public:
  explicit MpiRemote(MPI_Comm comm) : comm_(comm) {}
  int isend(int peer, int tag, const void* data, size_t bytes) override;
  int irecv(int peer, int tag, void* data, size_t capacity) override;
  bool test(int request, size_t* bytes) override;
  void cancel(int request) override;

 private:
  int slot();
  MPI_Comm comm_;
  std::vector<MPI_Request> requests_;
  std::vector<int> free_;
};

}  // namespace ubep::transport
