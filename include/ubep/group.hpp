// A Group is the set of ranks that exchange tokens.
//
// Two ways to make one, behind the same interface:
//  * ranks as threads in one process (ThreadGroup, the embedded default: no launcher, no service);
//  * ranks as processes started by mpirun (see ubep/mpi_group.hpp), which map each other's
//    shared-memory segments at set-up and write into them directly afterwards.
// Ranks on the same host share memory: windows give each rank a pointer into every local
// peer's memory, so the data path is plain loads and stores, one copy, no MPI call.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ubep {

class Group;
namespace transport {
class Remote;
}
namespace bootstrap {
class GroupHooks;  // internal (src/bootstrap/group_hooks.hpp)
GroupHooks& hooks_of(const Group& group);
}  // namespace bootstrap

struct GroupOptions {
  // How long any wait on a peer may last before a TimeoutError names the peer.
  std::chrono::milliseconds timeout{60000};
  // 0: ranks on one host share memory (threads), or hosts are discovered (mpirun). N > 0: pretend
  // every N consecutive ranks form a host, so the cross-host paths (relay over the transport
  // between hosts) can be tested on one machine.
  int ranks_per_host = 0;
  // Elastic EP (docs/ELASTIC.md), process groups on one host: a name for the group there, so a
  // process that replaces a dead rank can join it (make_rejoin_group). Empty: no rejoin (and
  // every shared-memory name is unlinked as soon as the ranks mapped it).
  std::string elastic_name;
};

// Memory that every rank of a host contributes and every local peer can address.
class SharedWindow {
 public:
  virtual ~SharedWindow() = default;
  size_t bytes() const { return bytes_; }
  // Base address of `rank`'s region in this process, or nullptr if `rank` is on another host.
  void* base(int rank) const { return bases_[static_cast<size_t>(rank)]; }
  void* local() const { return local_; }
  // Elastic groups (docs/ELASTIC.md): the stamp under which `rank`'s part of this window is
  // published on the host's rendezvous (0: none; it changes when a replacement takes over), and
  // mapping a newer part in place of the old one (true if it did). Between calls only.
  virtual uint32_t peer_incarnation(int /*rank*/) const { return 0; }
  virtual bool refresh_peer(int /*rank*/) { return false; }

 protected:
  size_t bytes_ = 0;
  void* local_ = nullptr;
  std::vector<void*> bases_;
};

class Group {
 public:
  virtual ~Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const GroupOptions& options() const { return options_; }

  // Host of every rank (ranks on one host share memory). Ids are dense, 0..num_hosts-1.
  int host_of(int rank) const { return host_of_[static_cast<size_t>(rank)]; }
  int num_hosts() const { return num_hosts_; }
  bool same_host(int a, int b) const { return host_of(a) == host_of(b); }
  bool single_host() const { return num_hosts_ == 1; }

  // Group-wide barrier. Counted, so algorithms can prove how many they make.
  void barrier();
  uint64_t barrier_count() const { return barriers_; }

  // Collective: every rank passes the same byte count; returns zero-filled memory that every
  // rank of the same host can write. Not for the hot path.
  virtual std::unique_ptr<SharedWindow> allocate_window(size_t bytes) = 0;

  // Collective gather of `bytes` from every rank into out[size * bytes]. Set-up path only.
  virtual void allgather(const void* in, void* out, size_t bytes) = 0;

  // Process groups watch the processes of this host's other ranks (docs/ELASTIC.md): how rank
  // `rank`'s process ended, e.g. "died (signal 9)"; empty while it lives or is not watched
  // (thread groups, other hosts).
  std::string death_of(int rank);

  // Short description for logs and benchmark tables, e.g. "threads(4)" or "mpi(2 ranks, 1 host)".
  virtual const char* kind() const = 0;

 protected:
  Group(int rank, int size, GroupOptions options);
  virtual void barrier_impl() = 0;
  void set_hosts(std::vector<int> host_of);
  // Implementations hand the library's internals what they have beyond this interface (the
  // transport between hosts, the death watch, elastic membership); it outlives the group's use.
  void set_hooks(bootstrap::GroupHooks* hooks) { hooks_ = hooks; }

 private:
  int rank_;
  int size_;
  GroupOptions options_;
  std::vector<int> host_of_;
  int num_hosts_ = 1;
  uint64_t barriers_ = 0;
  bootstrap::GroupHooks* hooks_ = nullptr;
  friend bootstrap::GroupHooks& bootstrap::hooks_of(const Group& group);
};

// Runs fn(group) on `ranks` threads, one Group per thread (gloo's spawn). After every thread
// has finished, rethrows the earliest exception a rank raised, preferring any other error over
// a TimeoutError (which is usually the echo of a peer that failed first).
void run_on_threads(int ranks, const std::function<void(Group&)>& fn, GroupOptions options = {});

// Lower-level form: a shared world that hands out one Group per rank; the caller runs the threads.
class ThreadWorld {
 public:
  explicit ThreadWorld(int ranks, GroupOptions options = {});
  ~ThreadWorld();
  // Each rank index may be taken once; the Group must only be used from one thread at a time.
  std::unique_ptr<Group> group(int rank);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ubep
