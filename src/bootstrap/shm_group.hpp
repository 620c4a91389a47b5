// Processes on one host sharing POSIX shared memory, set up over any Bootstrap. The MPI group
// (src/bootstrap/mpi_group.cpp) is one with an MPI bootstrap and, across hosts, the MPI
// transport.
#pragma once

#include <memory>
#include <vector>

#include "bootstrap/death_watch.hpp"
#include "bootstrap/flag_barrier.hpp"
#include "transport/remote.hpp"
#include "ubep/bootstrap.hpp"

namespace ubep::bootstrap {

class ShmGroup : public Group {
 public:
  // host_of: host of every rank (from the bootstrap, or forced by options.ranks_per_host).
  // remote: the transport to other hosts (required when host_of names more than one host).
  ShmGroup(std::shared_ptr<Bootstrap> bootstrap, GroupOptions options, std::vector<int> host_of,
           std::unique_ptr<transport::Remote> remote);
  ~ShmGroup() override;

  std::unique_ptr<SharedWindow> allocate_window(size_t bytes) override;
  void allgather(const void* in, void* out, size_t bytes) override;
  transport::Remote* remote() override { return remote_.get(); }
  DeathWatch* death_watch() override { return deaths_.get(); }
  const char* kind() const override { return "processes"; }

 protected:
  void barrier_impl() override;
  Bootstrap& bootstrap() { return *bootstrap_; }

 private:
  std::shared_ptr<Bootstrap> bootstrap_;
  std::vector<int> host_vec_;
  std::unique_ptr<SharedWindow> control_;
  std::unique_ptr<FlagBarrier> barrier_;
  std::unique_ptr<transport::Remote> remote_;
  std::unique_ptr<DeathWatch> deaths_;  // this host's other ranks' processes
};

// Host ids from options.ranks_per_host (> 0: every N consecutive ranks form a host) or else
// from the bootstrap's host map.
std::vector<int> resolve_hosts(Bootstrap& bootstrap, const GroupOptions& options);

}  // namespace ubep::bootstrap
