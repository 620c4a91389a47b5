// Ranks as processes started by mpirun. MPI is used at set-up only (to exchange segment names)
// and between hosts; ranks on one host map each other's POSIX shared-memory segments and from
// then on write into them directly.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "core/log.hpp"
#include "core/wait.hpp"
#include "transport/flag_barrier.hpp"
#include "transport/mpi/mpi_remote.hpp"
#include "ubep/error.hpp"
#include "ubep/mpi_group.hpp"

namespace ubep {

namespace {

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw SystemError(
        detail::concat(what, " failed: ", std::string(msg, static_cast<size_t>(len))));
  }
}

constexpr size_t kNameLen = 64;

class ShmWindow : public SharedWindow {
 public:
  ShmWindow(size_t bytes, int rank, int size, const std::vector<int>& host_of, MPI_Comm comm) {
    bytes_ = bytes;
    mapped_ = std::max<size_t>(bytes, 1);
    static std::atomic<uint64_t> sequence{0};
    char name[kNameLen] = {};
    std::snprintf(name, sizeof name, "/ubep-%d-%llu", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(sequence++));
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw SystemError(detail::concat("shm_open(", name, "): ", std::strerror(errno)));
    if (ftruncate(fd, static_cast<off_t>(mapped_)) != 0) {
      const int err = errno;
      close(fd);
      shm_unlink(name);
      throw SystemError(detail::concat("ftruncate(", name, ", ", mapped_, "): ", std::strerror(err),
                                       " (is /dev/shm large enough?)"));
    }
    local_ = map(fd, name);
    close(fd);

    std::vector<char> names(static_cast<size_t>(size) * kNameLen);
    mpi_check(MPI_Allgather(name, kNameLen, MPI_CHAR, names.data(), kNameLen, MPI_CHAR, comm),
              "MPI_Allgather(segment names)");
    bases_.assign(static_cast<size_t>(size), nullptr);
    // Map the peers on this host. A failure is reported to every rank (below) instead of thrown
    // here, so no rank is left waiting in the barrier and no segment is left behind.
    std::string error;
    for (int p = 0; p < size && error.empty(); ++p) {
      if (p == rank) {
        bases_[static_cast<size_t>(p)] = local_;
      } else if (host_of[static_cast<size_t>(p)] == host_of[static_cast<size_t>(rank)]) {
        const char* peer = &names[static_cast<size_t>(p) * kNameLen];
        int pfd = shm_open(peer, O_RDWR, 0600);
        if (pfd < 0) {
          error = detail::concat("shm_open(", peer, "): ", std::strerror(errno));
          continue;
        }
        void* addr = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        close(pfd);
        if (addr == MAP_FAILED)
          error = detail::concat("mmap(", peer, "): ", std::strerror(errno));
        else
          bases_[static_cast<size_t>(p)] = addr;
      }
    }
    int ok = error.empty() ? 1 : 0, all_ok = 0;
    const int rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    // Every peer has mapped our segment (or given up): unlink the name so nothing leaks.
    shm_unlink(name);
    if (rc != MPI_SUCCESS || !all_ok) {
      for (void* b : bases_)
        if (b) munmap(b, mapped_);
      bases_.clear();
      throw SystemError(error.empty()
                            ? std::string("shared-memory window set-up failed on another rank")
                            : error);
    }
  }

  ~ShmWindow() override {
    for (void* b : bases_)
      if (b) munmap(b, mapped_);
  }

 private:
  void* map(int fd, const char* name) {
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      throw SystemError(detail::concat("mmap(", name, "): ", std::strerror(errno)));
    return p;
  }
  size_t mapped_ = 0;
};

class ProcessGroup : public Group {
 public:
  ProcessGroup(MPI_Comm comm, int rank, int size, const MpiGroupOptions& options)
      : Group(rank, size, options), comm_(comm) {
    std::vector<int> hosts(static_cast<size_t>(size));
    UBEP_CHECK_ARG(options.ranks_per_host >= 0, "ranks_per_host must be >= 0, got ",
                   options.ranks_per_host);
    if (options.ranks_per_host > 0) {
      for (int r = 0; r < size; ++r) hosts[static_cast<size_t>(r)] = r / options.ranks_per_host;
    } else {
      MPI_Comm local;
      mpi_check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local),
                "MPI_Comm_split_type");
      int leader = rank;  // lowest world rank on my host: broadcast from local rank 0
      mpi_check(MPI_Bcast(&leader, 1, MPI_INT, 0, local), "MPI_Bcast(host leader)");
      MPI_Comm_free(&local);
      std::vector<int> leaders(static_cast<size_t>(size));
      mpi_check(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm),
                "MPI_Allgather(host leaders)");
      std::vector<int> dense(static_cast<size_t>(size), -1);
      int next = 0;
      for (int r = 0; r < size; ++r) {
        int& id = dense[static_cast<size_t>(leaders[static_cast<size_t>(r)])];
        if (id < 0) id = next++;
        hosts[static_cast<size_t>(r)] = id;
      }
    }
    host_vec_ = hosts;
    set_hosts(std::move(hosts));
    control_ = std::make_unique<ShmWindow>(sizeof(transport::ArrivalCounter), rank, size, host_vec_,
                                           comm_);
    barrier_ = std::make_unique<transport::FlagBarrier>(rank, size, [this](int p) {
      return static_cast<transport::ArrivalCounter*>(control_->base(p));
    });
    if (num_hosts() > 1) remote_ = std::make_unique<transport::MpiRemote>(comm_);
    log::debug("rank ", rank, "/", size, " on host ", host_of(rank), " of ", num_hosts());
  }

  transport::Remote* remote() override { return remote_.get(); }

  ~ProcessGroup() override { MPI_Comm_free(&comm_); }

  std::unique_ptr<SharedWindow> allocate_window(size_t bytes) override {
    return std::make_unique<ShmWindow>(bytes, rank(), size(), host_vec_, comm_);
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    mpi_check(MPI_Allgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                            MPI_BYTE, comm_),
              "MPI_Allgather");
  }

  void alltoallv(const void* send, const int64_t* send_bytes, const int64_t* send_offsets,
                 void* recv, const int64_t* recv_bytes, const int64_t* recv_offsets) override {
    const size_t n = static_cast<size_t>(size());
    counts_.resize(4 * n);
    int* sc = counts_.data();
    int* sd = sc + n;
    int* rc = sd + n;
    int* rd = rc + n;
    for (size_t p = 0; p < n; ++p) {
      UBEP_CHECK_ARG(send_offsets[p] + send_bytes[p] < INT32_MAX &&
                         recv_offsets[p] + recv_bytes[p] < INT32_MAX,
                     "alltoallv: more than 2 GiB in one exchange");
      sc[p] = static_cast<int>(send_bytes[p]);
      sd[p] = static_cast<int>(send_offsets[p]);
      rc[p] = static_cast<int>(recv_bytes[p]);
      rd[p] = static_cast<int>(recv_offsets[p]);
    }
    mpi_check(MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, comm_),
              "MPI_Alltoallv");
  }

  const char* kind() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

 protected:
  void barrier_impl() override {
    if (single_host())
      barrier_->arrive_and_wait(WaitPolicy{options().timeout});
    else
      mpi_check(MPI_Barrier(comm_), "MPI_Barrier");
  }

 private:
  MPI_Comm comm_;
  std::vector<int> host_vec_;
  std::unique_ptr<ShmWindow> control_;
  std::unique_ptr<transport::FlagBarrier> barrier_;
  std::vector<int> counts_;
  std::unique_ptr<transport::MpiRemote> remote_;
};

}  // namespace

std::unique_ptr<Group> make_mpi_group(MPI_Comm comm, MpiGroupOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  UBEP_CHECK_ARG(initialized, "make_mpi_group: MPI is not initialised (call MPI_Init first)");
  MPI_Comm dup;
  mpi_check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
  int rank = 0, size = 0;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &size);
  return std::make_unique<ProcessGroup>(dup, rank, size, options);
}

}  // namespace ubep
