// POSIX shared-memory windows of process groups (shm_window.hpp).
#include "bootstrap/shm_window.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

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

}  // namespace

void ShmWindow::create_own(std::string* error) {
  char name[kNameLen] = {};
  int fd = -1;
  try {
    fd = create_segment(name);
  } catch (const Error& e) {  // reported to the peers, so none is left waiting
    *error = e.what();
  }
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(mapped_)) != 0)
    *error = detail::concat("ftruncate(", name, ", ", mapped_, "): ", std::strerror(errno),
                            " (is /dev/shm large enough?)");
  if (fd >= 0 && error->empty()) {
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      *error = detail::concat("mmap(", name, "): ", std::strerror(errno));
    else
      local_ = p;
  }
  if (fd >= 0) close(fd);
  if (!error->empty() && name[0]) shm_unlink(name);
  if (error->empty()) own_name_ = name;
}

bool ShmWindow::map_peer(int p, const std::string& name, std::string* error) {
  const int pfd = shm_open(name.c_str(), O_RDWR, 0600);
  if (pfd < 0) {
    if (error) *error = detail::concat("shm_open(", name, "): ", std::strerror(errno));
    return false;
  }
  void* addr = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
  close(pfd);
  if (addr == MAP_FAILED) {
    if (error) *error = detail::concat("mmap(", name, "): ", std::strerror(errno));
    return false;
  }
  bases_[static_cast<size_t>(p)] = addr;
  return true;
}

ShmWindow::ShmWindow(size_t bytes, int rank, int size, const std::vector<int>& host_of,
                     Bootstrap& boot, Rendezvous* rdv, int index, uint32_t incarnation)
    : rank_(rank), rdv_(rdv), index_(index) {
  bytes_ = bytes;
  mapped_ = std::max<size_t>(bytes, 1);
  mapped_inc_.assign(static_cast<size_t>(size), 0);
  std::string error;
  create_own(&error);
  char name[kNameLen] = {};
  std::snprintf(name, kNameLen, "%s", own_name_.c_str());  // empty: peers skip us, all fail

  std::vector<char> names(static_cast<size_t>(size) * kNameLen);
  try {
    boot.allgather(name, names.data(), kNameLen);
  } catch (...) {
    if (name[0]) shm_unlink(name);
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
      map_peer(p, peer, &error);
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
  bool everyone = !agreement;
  for (int v : all_ok) everyone = everyone && v;
  // Every peer has mapped our segment (or given up): unlink the name so nothing leaks -- unless
  // the group is elastic and a replacement may need it (then ~ShmWindow unlinks it).
  if (name[0] && (!rdv_ || !everyone)) shm_unlink(name);
  if (!everyone) {
    for (void* b : bases_)
      if (b) munmap(b, mapped_);
    if (local_ && (bases_.empty() || bases_[static_cast<size_t>(rank)] != local_))
      munmap(local_, mapped_);
    bases_.clear();
    own_name_.clear();
    if (agreement) std::rethrow_exception(agreement);
    throw SystemError(
        error.empty() ? std::string("shared-memory window set-up failed on another rank") : error);
  }
  if (rdv_) {
    rdv_->publish_window(index_, rank, own_name_.c_str(), incarnation);
    for (int p = 0; p < size; ++p) mapped_inc_[static_cast<size_t>(p)] = 1;  // incarnation 0
  } else {
    own_name_.clear();
  }
}

ShmWindow::ShmWindow(size_t bytes, int rank, int size, const std::vector<int>& host_of,
                     Rendezvous& rdv, int index, uint32_t incarnation)
    : rank_(rank), rdv_(&rdv), index_(index) {
  bytes_ = bytes;
  mapped_ = std::max<size_t>(bytes, 1);
  mapped_inc_.assign(static_cast<size_t>(size), 0);
  std::string error;
  create_own(&error);
  if (!error.empty()) throw SystemError(error);
  bases_.assign(static_cast<size_t>(size), nullptr);
  bases_[static_cast<size_t>(rank)] = local_;
  for (int p = 0; p < size; ++p) {
    if (p == rank || host_of[static_cast<size_t>(p)] != host_of[static_cast<size_t>(rank)])
      continue;
    const uint32_t inc = rdv.window_incarnation(index, p);
    if (inc == 0) continue;  // never published: that peer has no such window
    if (map_peer(p, rdv.window_name(index, p), nullptr)) mapped_inc_[static_cast<size_t>(p)] = inc;
  }
  rdv.publish_window(index, rank, own_name_.c_str(), incarnation);
  mapped_inc_[static_cast<size_t>(rank)] = incarnation + 1;
}

ShmWindow::~ShmWindow() {
  for (void* b : bases_)
    if (b) munmap(b, mapped_);
  if (!own_name_.empty()) shm_unlink(own_name_.c_str());
}

uint32_t ShmWindow::peer_incarnation(int rank) const {
  return rdv_ ? rdv_->window_incarnation(index_, rank) : 0;
}

// A replacement published a newer segment for `rank`: map it in place of the old (dead) one.
// Called by the caller's thread between calls only (no role reads bases_ meanwhile).
bool ShmWindow::refresh_peer(int rank) {
  if (!rdv_ || rank == rank_) return false;
  const uint32_t inc = rdv_->window_incarnation(index_, rank);
  if (inc == 0 || inc == mapped_inc_[static_cast<size_t>(rank)]) return false;
  void* old = bases_[static_cast<size_t>(rank)];
  if (!map_peer(rank, rdv_->window_name(index_, rank), nullptr)) return false;
  if (old) munmap(old, mapped_);
  mapped_inc_[static_cast<size_t>(rank)] = inc;
  return true;
}

int unlink_segments_of(pid_t pid) {
  if (pid <= 0) return 0;
  const std::string prefix = detail::concat("ubep-", static_cast<int>(pid), "-");
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  int unlinked = 0;
  char name[NAME_MAX + 2];
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    std::snprintf(name, sizeof name, "/%s", e->d_name);
    if (shm_unlink(name) == 0) ++unlinked;
  }
  closedir(dir);
  return unlinked;
}

}  // namespace ubep::bootstrap
