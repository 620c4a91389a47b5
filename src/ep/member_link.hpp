// Membership records between hosts (issue 32, docs/ELASTIC.md "Masking a lost host"). On one
// host a rank's record reaches its peers through their windows; ranks of other hosts have no
// window in common, so the record also goes to each of them as a message over the group's
// Remote, and each arriving record is stored into the receiver's own window, in the slot of its
// sender (Window::store_member). From then on Membership reads a remote rank's record exactly
// as a host-mate's: the latest one that rank published, as far as it has arrived.
//
// Why that is enough for the agreement: a transport delivers one peer's messages in the order
// it sent them, so the slot only moves forward through records the peer really published, as
// a shared-memory slot does; arriving later is the same as being read a little later.
//
// Tags: one per Buffer (kTagBase + its number), so two Buffers of one group keep apart.
//
// Threads: only the caller's thread of the buffer calls publish() and pump() (between calls:
// Membership::agree, HostEngine::settle_membership), as it is the only one that touches the
// Remote; role threads read the stored slots through the window's seqlock (FailureWatch).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "ep/window.hpp"
#include "transport/remote.hpp"
#include "ubep/group.hpp"

namespace ubep::ep {

class MemberLink {
 public:
  // Each Buffer's records have their own tag, kTagBase + the Buffer's number on the group
  // (GroupHooks::next_buffer_number, the same on every rank) modulo kTags: the receives stay
  // posted between calls, and a shared tag let one Buffer's receive take another Buffer's
  // record (two Buffers on one group: records given to the wrong agreement). Above the relay's
  // tags (8192 up to 24575) and the group's own (7103 to 7106), below MPI's least tag bound.
  static constexpr int kTagBase = 24576;
  static constexpr int kTags = 8192;
  static_assert(kTagBase + kTags - 1 <= 32767, "record tags within MPI's least tag bound");
  // words: a record's words after its stamp. Posts one receive per rank of another host.
  MemberLink(Group& group, const Window& win, int words);
  ~MemberLink();
  MemberLink(const MemberLink&) = delete;
  MemberLink& operator=(const MemberLink&) = delete;

  bool active() const { return remote_ != nullptr; }
  // This Buffer's number on the group (GroupHooks::next_buffer_number), taken once here.
  int buffer_number() const { return number_; }
  bool remote(int r) const { return active() && !group_.same_host(r, me_); }
  // Sends this rank's record to every rank of another host that `to` selects (not the dead).
  template <typename To>
  void publish(uint32_t version, const std::vector<uint32_t>& fields, To&& to) {
    last_.assign(1, version);
    last_.insert(last_.end(), fields.begin(), fields.end());
    for (int r = 0; r < group_.size(); ++r)
      if (remote(r) && to(r)) send(r);
  }
  // Stores the records that arrived; drops the sends that completed (or whose peer is gone).
  void pump();

 private:
  void send(int r);  // last_
  void post(int r);

  Group& group_;
  const Window& win_;
  transport::Remote* remote_;
  int me_, words_;
  int number_;                                // this Buffer's on the group
  int tag_;                                   // this Buffer's (kTagBase + its number)
  std::vector<std::vector<uint32_t>> inbox_;  // [rank] version, then the record's words
  std::vector<int> recv_;                     // [rank] posted receive, -1: none (gone)
  std::vector<uint32_t> epoch_;               // [rank] the connection it was posted on
  struct Out {
    int request;
    std::vector<uint32_t> msg;  // must live until the send completes
  };
  std::deque<Out> out_;
  std::vector<uint32_t> last_;  // this rank's last record: version, then its words
};

}  // namespace ubep::ep
