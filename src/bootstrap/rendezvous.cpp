#include "bootstrap/rendezvous.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ubep/error.hpp"

namespace ubep::bootstrap {

struct Rendezvous::Header {
  std::atomic<uint32_t> magic;
  int32_t ranks;
};
struct Rendezvous::RankEntry {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> incarnation;
};
struct Rendezvous::WindowEntry {
  char name[kNameLen];
  std::atomic<uint32_t> incarnation;
};

namespace {
constexpr uint32_t kMagic = 0x75626570;  // "ubep"
std::string segment_of(const std::string& name) { return "/ubep-rdv-" + name; }
size_t bytes_for(int ranks) {
  return 64 + static_cast<size_t>(ranks) * 64 +
         static_cast<size_t>(ranks) * Rendezvous::kMaxWindows * 128;
}
}  // namespace

Rendezvous::Rendezvous(std::string name, void* base, size_t bytes)
    : name_(std::move(name)), base_(base), bytes_(bytes) {}

Rendezvous::~Rendezvous() { munmap(base_, bytes_); }

std::unique_ptr<Rendezvous> Rendezvous::create(const std::string& name, int ranks) {
  UBEP_CHECK_ARG(!name.empty() && name.size() < 40 && name.find('/') == std::string::npos,
                 "elastic_name must be 1..39 characters without '/', got '", name, "'");
  const std::string seg = segment_of(name);
  const int fd = shm_open(seg.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) throw SystemError(detail::concat("shm_open(", seg, "): ", std::strerror(errno)));
  const size_t bytes = bytes_for(ranks);
  // A stale segment of an earlier job with this name is reset, not trusted.
  if (ftruncate(fd, 0) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    throw SystemError(detail::concat("ftruncate(", seg, "): ", std::strerror(errno)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw SystemError(detail::concat("mmap(", seg, "): ", std::strerror(errno)));
  auto* h = static_cast<Header*>(p);
  h->ranks = ranks;
  h->magic.store(kMagic, std::memory_order_release);
  return std::unique_ptr<Rendezvous>(new Rendezvous(seg, p, bytes));
}

std::unique_ptr<Rendezvous> Rendezvous::open(const std::string& name) {
  const std::string seg = segment_of(name);
  const int fd = shm_open(seg.c_str(), O_RDWR, 0600);
  if (fd < 0)
    throw InvalidArgument(detail::concat("no elastic group named '", name, "' on this host (", seg,
                                         ": ", std::strerror(errno),
                                         "); GroupOptions::elastic_name names it"));
  Header h{};
  if (pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) || h.ranks < 1) {
    close(fd);
    throw SystemError(detail::concat(seg, ": not a ubep rendezvous"));
  }
  const size_t bytes = bytes_for(h.ranks);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw SystemError(detail::concat("mmap(", seg, "): ", std::strerror(errno)));
  if (static_cast<Header*>(p)->magic.load(std::memory_order_acquire) != kMagic) {
    munmap(p, bytes);
    throw SystemError(detail::concat(seg, ": not a ubep rendezvous"));
  }
  return std::unique_ptr<Rendezvous>(new Rendezvous(seg, p, bytes));
}

void Rendezvous::unlink() const { shm_unlink(name_.c_str()); }

int Rendezvous::ranks() const { return static_cast<Header*>(base_)->ranks; }

Rendezvous::RankEntry& Rendezvous::rank_entry(int r) const {
  return reinterpret_cast<RankEntry*>(static_cast<char*>(base_) + 64)[r];
}
Rendezvous::WindowEntry& Rendezvous::window_entry(int index, int r) const {
  auto* first = reinterpret_cast<WindowEntry*>(static_cast<char*>(base_) + 64 +
                                               static_cast<size_t>(ranks()) * 64);
  return first[static_cast<size_t>(index) * static_cast<size_t>(ranks()) + static_cast<size_t>(r)];
}

pid_t Rendezvous::pid(int r) const { return rank_entry(r).pid.load(std::memory_order_acquire); }
uint32_t Rendezvous::incarnation(int r) const {
  return rank_entry(r).incarnation.load(std::memory_order_acquire);
}

uint32_t Rendezvous::claim(int r, bool replacement) {
  RankEntry& e = rank_entry(r);
  const uint32_t inc = replacement ? e.incarnation.load(std::memory_order_acquire) + 1 : 0;
  e.pid.store(getpid(), std::memory_order_release);
  e.incarnation.store(inc, std::memory_order_release);
  return inc;
}

void Rendezvous::publish_window(int index, int r, const char* segment, uint32_t incarnation) {
  UBEP_CHECK_ARG(index < kMaxWindows, "elastic groups hold at most ", kMaxWindows,
                 " windows (Buffers) per rank");
  WindowEntry& e = window_entry(index, r);
  e.incarnation.store(0, std::memory_order_release);  // being rewritten
  std::snprintf(e.name, kNameLen, "%s", segment);
  e.incarnation.store(incarnation + 1, std::memory_order_release);  // +1: 0 means none
}

uint32_t Rendezvous::window_incarnation(int index, int r) const {
  if (index >= kMaxWindows) return 0;
  return window_entry(index, r).incarnation.load(std::memory_order_acquire);
}

std::string Rendezvous::window_name(int index, int r) const {
  WindowEntry& e = window_entry(index, r);
  return std::string(e.name, strnlen(e.name, kNameLen));
}

}  // namespace ubep::bootstrap
