// Bootstrap: how the ranks of a group find each other at set-up. Never used on the data path.
//
// ubep needs only rank, size, an allgather of bytes, a barrier and which ranks share a host. An
// MPI communicator, threads of one process, a torch.distributed process group (the Python
// package) or a TCP store can provide them; make_bootstrap_group turns any of them into a Group
// of processes that share memory on one host.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ubep/group.hpp"

namespace ubep {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective: every rank passes `bytes` bytes; out receives size() * bytes, rank order.
  virtual void allgather(const void* in, void* out, size_t bytes) = 0;
  // Collective.
  virtual void barrier() = 0;
  // Host of every rank, dense ids 0..hosts-1 in order of first appearance. The default
  // allgathers host names (gethostname); override where the launcher knows better.
  virtual std::vector<int> host_map();
};

// Processes on one host over any Bootstrap: every rank contributes POSIX shared-memory windows
// whose names travel through the bootstrap, and maps its peers' windows; the data path is plain
// stores into them. Collective. Throws InvalidArgument when the ranks span hosts (moving data
// between hosts needs a transport: use make_mpi_group) and SystemError when memory cannot be
// mapped. The bootstrap must outlive the group.
std::unique_ptr<Group> make_bootstrap_group(std::shared_ptr<Bootstrap> bootstrap,
                                            GroupOptions options = {});

// Elastic EP (docs/ELASTIC.md): a new process takes the place of rank `rank` of the live process
// group that was made with GroupOptions::elastic_name == `elastic_name` on this host, after the
// rank's process died. Not collective: the live ranks notice it at their next dispatch, map its
// windows and unmask it from an agreed call on. Create the same Buffers, in the same order and
// with the same configs, as the other ranks did (their windows are matched by order). Throws
// InvalidArgument when no such group is on this host.
std::unique_ptr<Group> make_rejoin_group(const std::string& elastic_name, int rank,
                                         GroupOptions options = {});

}  // namespace ubep
