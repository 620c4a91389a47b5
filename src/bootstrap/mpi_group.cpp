// Ranks as processes started by mpirun: an MPI bootstrap (set-up), the shared-memory group of
// the CPU backend on each host, its communicator for the baseline's MPI_Alltoallv, and MPI
// point-to-point between hosts.
#include "ubep/mpi_group.hpp"
#include <cstring>

#include "bootstrap/mpi_comm.hpp"
#include "bootstrap/shm_group.hpp"
#include "core/wait.hpp"
#include "transport/mpi/mpi_remote.hpp"
#include "ubep/error.hpp"

namespace ubep {

namespace {

// Waits for a non-blocking collective, bounded by the group's timeout (sleeping with back-off,
// like every wait of the library), so a rank that never arrives gives a TimeoutError instead of
// a hang; and, once the group watches deaths, a dead rank a PeerFailedError naming it at once.
void wait_request(MPI_Request& req, std::chrono::milliseconds timeout, const char* what, int ranks,
                  const bootstrap::DeathCheck* deaths) {
  WaitPolicy policy;
  policy.timeout = timeout;
  auto named = [&] {
    return detail::concat(what, " of the set-up (every one of the ", ranks, " ranks)");
  };
  bootstrap::DeathAbort abort(deaths, -1, named);
  wait_until(
      [&] {
        int done = 0;
        detail::mpi_check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
        return done != 0;
      },
      abort.applied_to(policy), named);
}

class MpiBootstrap : public Bootstrap, public bootstrap::DeathAwareBootstrap {
 public:
  MpiBootstrap(MPI_Comm comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  // A group held by Python may outlive mpi4py's MPI_Finalize (run at interpreter exit): freeing
  // the communicator then would be an MPI error, and finalize has released it anyway.
  ~MpiBootstrap() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Bounded: MPI_Iallgather into staging the bootstrap owns. If a rank never arrives the wait
  // times out and the staging is deliberately leaked, so a late arrival writes into live memory;
  // the group is unusable after that anyway (a set-up collective failed).
  void allgather(const void* in, void* out, size_t bytes) override {
    const size_t n = static_cast<size_t>(size_);
    auto* staging = new char[bytes * (n + 1)];
    std::memcpy(staging, in, bytes);
    MPI_Request req;
    detail::mpi_check(MPI_Iallgather(staging, static_cast<int>(bytes), MPI_BYTE, staging + bytes,
                                     static_cast<int>(bytes), MPI_BYTE, comm_, &req),
                      "MPI_Iallgather");
    wait_request(req, timeout_, "MPI_Iallgather", size_, deaths_);
    std::memcpy(out, staging + bytes, bytes * n);
    delete[] staging;
  }
  void barrier() override {
    MPI_Request req;
    detail::mpi_check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
    wait_request(req, timeout_, "MPI_Ibarrier", size_, deaths_);
  }
  // The ranks MPI says share memory (MPI_COMM_TYPE_SHARED), named by their lowest rank.
  std::vector<int> host_map() override {
    MPI_Comm local;
    detail::mpi_check(
        MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
    int leader = rank_;  // lowest world rank on my host: broadcast from local rank 0
    detail::mpi_check(MPI_Bcast(&leader, 1, MPI_INT, 0, local), "MPI_Bcast(host leader)");
    MPI_Comm_free(&local);
    std::vector<int> leaders(static_cast<size_t>(size_));
    allgather(&leader, leaders.data(), sizeof leader);
    std::vector<int> dense(static_cast<size_t>(size_), -1), hosts(static_cast<size_t>(size_));
    int next = 0;
    for (int r = 0; r < size_; ++r) {
      int& id = dense[static_cast<size_t>(leaders[static_cast<size_t>(r)])];
      if (id < 0) id = next++;
      hosts[static_cast<size_t>(r)] = id;
    }
    return hosts;
  }
  MPI_Comm comm() const { return comm_; }
  void watch_deaths(const bootstrap::DeathCheck* deaths) override { deaths_ = deaths; }

 private:
  MPI_Comm comm_;
  std::chrono::milliseconds timeout_;
  const bootstrap::DeathCheck* deaths_ = nullptr;
  int rank_ = 0, size_ = 0;
};

class MpiGroup : public bootstrap::ShmGroup {
 public:
  MpiGroup(std::shared_ptr<MpiBootstrap> boot, GroupOptions options, std::vector<int> hosts,
           std::unique_ptr<transport::Remote> remote)
      : ShmGroup(boot, options, std::move(hosts), std::move(remote)), comm_(boot->comm()) {}

  const char* kind() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

 private:
  MPI_Comm comm_;
};

}  // namespace

void detail::mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw SystemError(concat(what, " failed: ", std::string(msg, static_cast<size_t>(len))));
  }
}

MPI_Comm detail::mpi_comm_of(Group& group) {
  auto* mpi = dynamic_cast<MpiGroup*>(&group);
  return mpi ? mpi->comm() : MPI_COMM_NULL;
}

std::unique_ptr<Group> make_mpi_group(MPI_Comm comm, MpiGroupOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  UBEP_CHECK_ARG(initialized, "make_mpi_group: MPI is not initialised (call MPI_Init first)");
  UBEP_CHECK_ARG(options.timeout.count() > 0, "make_mpi_group: timeout must be positive, got ",
                 options.timeout.count(), " ms");
  MPI_Comm dup;
  detail::mpi_check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
  auto boot = std::make_shared<MpiBootstrap>(dup, options.timeout);
  std::vector<int> hosts = bootstrap::resolve_hosts(*boot, options);
  bool multi = false;
  for (int h : hosts) multi = multi || h != 0;
  std::unique_ptr<transport::Remote> remote;
  if (multi) remote = std::make_unique<transport::MpiRemote>(boot->comm());
  return std::make_unique<MpiGroup>(std::move(boot), options, std::move(hosts), std::move(remote));
}

}  // namespace ubep
