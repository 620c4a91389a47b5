// A window of a process group on one host: this rank's POSIX shared-memory segment and its
// host-mates', mapped. Set up collectively over a Bootstrap (names allgathered, then unlinked
// once every rank mapped them), or -- in an elastic group (Rendezvous) -- with the names kept in
// the host's rendezvous so a replacement process can map the live ranks' segments and the live
// ranks can map the replacement's (docs/ELASTIC.md).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap/rendezvous.hpp"
#include "ubep/bootstrap.hpp"

namespace ubep::bootstrap {

class ShmWindow : public SharedWindow {
 public:
  // Collective over the bootstrap. rdv (may be null): also publish this rank's segment as
  // window `index`, and keep its name until this window goes.
  ShmWindow(size_t bytes, int rank, int size, const std::vector<int>& host_of, Bootstrap& boot,
            Rendezvous* rdv, int index, uint32_t incarnation);
  // A replacement's window `index`: not collective; maps the peers' segments the rendezvous
  // names (a dead peer's may be gone: base nullptr until it comes back) and publishes its own.
  ShmWindow(size_t bytes, int rank, int size, const std::vector<int>& host_of, Rendezvous& rdv,
            int index, uint32_t incarnation);
  ~ShmWindow() override;

  uint32_t peer_incarnation(int rank) const override;
  bool refresh_peer(int rank) override;

 private:
  void create_own(std::string* error);
  bool map_peer(int p, const std::string& name, std::string* error);

  size_t mapped_ = 0;
  int rank_ = 0;
  Rendezvous* rdv_ = nullptr;
  int index_ = -1;
  std::string own_name_;
  std::vector<uint32_t> mapped_inc_;  // per peer: the rendezvous incarnation mapped (0: none)
};

// Unlinks the segment names a dead process of this host left (/dev/shm/ubep-<pid>-*): one that
// dies inside a window's set-up never unlinks its own. Not for elastic groups, whose names a
// replacement reads (it unlinks its predecessor's itself). Returns how many were unlinked.
int unlink_segments_of(pid_t pid);

}  // namespace ubep::bootstrap
