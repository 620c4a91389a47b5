// Elastic process groups (docs/ELASTIC.md): the rendezvous a replacement process uses to join a
// live group on its host. One named POSIX shared-memory segment per group ("/ubep-rdv-<name>",
// GroupOptions::elastic_name), mapped by every rank for the group's life, holding per rank its
// process id and incarnation and, per window (in allocation order), the name of the segment that
// holds that rank's part of it and the incarnation that wrote it.
//
// Writers: each rank writes only its own entries (a replacement takes over the dead rank's),
// the name first and the incarnation last with a release store; readers load the incarnation
// with acquire, so a name is complete once its incarnation is seen.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ubep::bootstrap {

class Rendezvous {
 public:
  static constexpr int kMaxWindows = 64;
  static constexpr size_t kNameLen = 64;

  // Rank 0 of a new group creates (or re-initialises a stale) segment; the others open it after
  // a barrier; a replacement opens it. Throws SystemError naming the segment.
  static std::unique_ptr<Rendezvous> create(const std::string& name, int ranks);
  static std::unique_ptr<Rendezvous> open(const std::string& name);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int ranks() const;
  const std::string& name() const { return name_; }
  void unlink() const;  // the rendezvous name (the mapping stays)

  pid_t pid(int rank) const;
  uint32_t incarnation(int rank) const;
  // This process becomes rank `rank`: its pid, and the next incarnation (returned).
  uint32_t claim(int rank, bool replacement);

  // Window `index` of `rank`: its segment name and the incarnation that published it (0: none).
  void publish_window(int index, int rank, const char* segment, uint32_t incarnation);
  uint32_t window_incarnation(int index, int rank) const;
  std::string window_name(int index, int rank) const;

 private:
  struct Header;
  struct RankEntry;
  struct WindowEntry;
  Rendezvous(std::string name, void* base, size_t bytes);
  RankEntry& rank_entry(int r) const;
  WindowEntry& window_entry(int index, int r) const;

  std::string name_;
  void* base_;
  size_t bytes_;
};

}  // namespace ubep::bootstrap
