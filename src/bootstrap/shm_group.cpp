// Ranks as processes on one host. The bootstrap is used at set-up only (to exchange segment
// names); ranks map each other's POSIX shared-memory segments and from then on write into them
// directly.
#include "bootstrap/shm_group.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>

#include "core/log.hpp"
#include "core/wait.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {

namespace {

constexpr size_t kNameLen = 64;

// Creates a new segment under a name nobody can predict or have left behind: pid, a sequence
// number and 64 random bits, retried on the (unlikely) "File exists".
int create_segment(char (&name)[kNameLen]) {
  static std::atomic<uint64_t> sequence{0};
  std::random_device rd;
  for (int attempt = 0;; ++attempt) {
    const uint64_t salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    std::snprintf(name, kNameLen, "/ubep-%d-%llu-%016llx", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(sequence++),
                  static_cast<unsigned long long>(salt));
    const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) return fd;
    if (errno != EEXIST || attempt >= 8)
      throw SystemError(detail::concat("shm_open(", name, "): ", std::strerror(errno)));
  }
}

class ShmWindow : public SharedWindow {
 public:
  ShmWindow(size_t bytes, int rank, int size, const std::vector<int>& host_of, Bootstrap& boot) {
    bytes_ = bytes;
    mapped_ = std::max<size_t>(bytes, 1);
    char name[kNameLen] = {};
    std::string error;
    int fd = -1;
    try {
      fd = create_segment(name);
    } catch (const Error& e) {  // reported to the peers below, so none is left waiting
      error = e.what();
    }
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(mapped_)) != 0)
      error = detail::concat("ftruncate(", name, ", ", mapped_, "): ", std::strerror(errno),
                             " (is /dev/shm large enough?)");
    if (fd >= 0 && error.empty()) {
      void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED)
        error = detail::concat("mmap(", name, "): ", std::strerror(errno));
      else
        local_ = p;
    }
    if (fd >= 0) close(fd);
    if (!error.empty() && name[0]) shm_unlink(name);
    if (!error.empty()) name[0] = '\0';  // peers skip us; the agreement below fails everywhere

    std::vector<char> names(static_cast<size_t>(size) * kNameLen);
    try {
      boot.allgather(name, names.data(), kNameLen);
    } catch (...) {
      shm_unlink(name);
      if (local_) munmap(local_, mapped_);
      throw;
    }
    bases_.assign(static_cast<size_t>(size), nullptr);
    // Map the peers on this host. A failure is reported to every rank (below) instead of thrown
    // here, so no rank is left waiting and no segment is left behind.
    for (int p = 0; p < size && error.empty(); ++p) {
      if (p == rank) {
        bases_[static_cast<size_t>(p)] = local_;
      } else if (host_of[static_cast<size_t>(p)] == host_of[static_cast<size_t>(rank)]) {
        const char* peer = &names[static_cast<size_t>(p) * kNameLen];
        if (!peer[0]) {
          error = detail::concat("rank ", p, " could not create its shared-memory window");
          continue;
        }
        const int pfd = shm_open(peer, O_RDWR, 0600);
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
    const int ok = error.empty() ? 1 : 0;
    std::vector<int> all_ok(static_cast<size_t>(size));
    std::exception_ptr agreement;
    try {
      boot.allgather(&ok, all_ok.data(), sizeof ok);
    } catch (...) {
      agreement = std::current_exception();
    }
    // Every peer has mapped our segment (or given up): unlink the name so nothing leaks.
    if (name[0]) shm_unlink(name);
    bool everyone = !agreement;
    for (int v : all_ok) everyone = everyone && v;
    if (!everyone) {
      for (void* b : bases_)
        if (b) munmap(b, mapped_);
      if (local_ && (bases_.empty() || bases_[static_cast<size_t>(rank)] != local_))
        munmap(local_, mapped_);
      bases_.clear();
      if (agreement) std::rethrow_exception(agreement);
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
  size_t mapped_ = 0;
};

}  // namespace

std::vector<int> resolve_hosts(Bootstrap& bootstrap, const GroupOptions& options) {
  UBEP_CHECK_ARG(options.ranks_per_host >= 0, "ranks_per_host must be >= 0, got ",
                 options.ranks_per_host);
  if (options.ranks_per_host == 0) return bootstrap.host_map();
  std::vector<int> hosts(static_cast<size_t>(bootstrap.size()));
  for (int r = 0; r < bootstrap.size(); ++r)
    hosts[static_cast<size_t>(r)] = r / options.ranks_per_host;
  return hosts;
}

ShmGroup::ShmGroup(std::shared_ptr<Bootstrap> bootstrap, GroupOptions options,
                   std::vector<int> host_of, std::unique_ptr<transport::Remote> remote)
    : Group(bootstrap->rank(), bootstrap->size(), options),
      bootstrap_(std::move(bootstrap)),
      host_vec_(host_of),
      remote_(std::move(remote)) {
  set_hosts(std::move(host_of));
  UBEP_CHECK_ARG(single_host() || remote_, "the group spans ", num_hosts(),
                 " hosts but has no transport between them (use make_mpi_group)");
  // Every rank's pid, so each process can watch its host-mates' (DeathWatch).
  const pid_t me = getpid();
  std::vector<pid_t> pids(static_cast<size_t>(size()));
  bootstrap_->allgather(&me, pids.data(), sizeof me);
  for (int r = 0; r < size(); ++r)
    if (r == rank() || !same_host(r, rank())) pids[static_cast<size_t>(r)] = 0;
  deaths_ = std::make_unique<DeathWatch>(pids);
  control_ = allocate_window(sizeof(ArrivalCounter));
  barrier_ = std::make_unique<FlagBarrier>(
      rank(), size(), [this](int p) { return static_cast<ArrivalCounter*>(control_->base(p)); });
  log::debug("rank ", rank(), "/", size(), " on host ", Group::host_of(rank()), " of ",
             num_hosts());
}

ShmGroup::~ShmGroup() = default;

std::unique_ptr<SharedWindow> ShmGroup::allocate_window(size_t bytes) {
  return std::make_unique<ShmWindow>(bytes, rank(), size(), host_vec_, *bootstrap_);
}

void ShmGroup::allgather(const void* in, void* out, size_t bytes) {
  bootstrap_->allgather(in, out, bytes);
}

void ShmGroup::barrier_impl() {
  if (single_host())
    barrier_->arrive_and_wait(WaitPolicy{options().timeout});
  else
    bootstrap_->barrier();
}

}  // namespace ubep::bootstrap

namespace ubep {

std::unique_ptr<Group> make_bootstrap_group(std::shared_ptr<Bootstrap> bootstrap,
                                            GroupOptions options) {
  UBEP_CHECK_ARG(bootstrap != nullptr, "make_bootstrap_group: bootstrap is null");
  UBEP_CHECK_ARG(options.timeout.count() > 0,
                 "make_bootstrap_group: timeout must be positive, got ", options.timeout.count(),
                 " ms");
  std::vector<int> hosts = bootstrap::resolve_hosts(*bootstrap, options);
  return std::make_unique<bootstrap::ShmGroup>(std::move(bootstrap), options, std::move(hosts),
                                               nullptr);
}

}  // namespace ubep
