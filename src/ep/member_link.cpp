#include "ep/member_link.hpp"

#include "bootstrap/group_hooks.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

MemberLink::MemberLink(Group& group, const Window& win, int words)
    : group_(group),
      win_(win),
      remote_(group.single_host() ? nullptr : bootstrap::hooks_of(group).remote()),
      me_(group.rank()),
      words_(words),
      number_(bootstrap::hooks_of(group).next_buffer_number()),
      tag_(kTagBase + number_ % kTags),
      inbox_(static_cast<size_t>(group.size())),
      recv_(static_cast<size_t>(group.size()), -1),
      epoch_(static_cast<size_t>(group.size()), 0) {
  // Receives stay posted between calls: only over a transport that can withdraw them when this
  // buffer goes (TcpRemote). Over MPI a receive left posted would take a later buffer's record
  // into freed memory, so there is no link: masking across hosts needs a TCP group.
  if (remote_ && !remote_->withdraws()) remote_ = nullptr;
  for (int r = 0; r < group.size(); ++r)
    if (remote(r)) {
      inbox_[static_cast<size_t>(r)].resize(static_cast<size_t>(1 + words_));
      post(r);
    }
}

MemberLink::~MemberLink() {
  if (!remote_) return;
  // The transport outlives this buffer: nothing of ours may stay posted or queued.
  for (int req : recv_)
    if (req >= 0) remote_->abandon(req);
  for (const Out& o : out_) remote_->abandon(o.request);
}

void MemberLink::post(int r) {
  auto& in = inbox_[static_cast<size_t>(r)];
  epoch_[static_cast<size_t>(r)] = remote_->epoch(r);
  try {
    recv_[static_cast<size_t>(r)] = remote_->irecv(r, tag_, in.data(), in.size() * 4);
  } catch (const PeerFailedError&) {
    recv_[static_cast<size_t>(r)] = -1;  // gone: its records stop where they are
  }
}

void MemberLink::send(int r) {
  Out o;
  o.msg = last_;
  try {
    o.request = remote_->isend(r, tag_, o.msg.data(), o.msg.size() * 4);
  } catch (const PeerFailedError&) {
    return;
  }
  out_.push_back(std::move(o));
}

void MemberLink::pump() {
  if (!remote_) return;
  for (int r = 0; r < group_.size(); ++r) {
    int& req = recv_[static_cast<size_t>(r)];
    // A lost rank's replacement connected (a new epoch, issue 32): its records come again, and
    // it gets this rank's latest at once (a live rank publishes only on a change, and the
    // replacement's first agreement needs every live rank's view and config digest).
    if (req < 0 && remote(r) && remote_->epoch(r) != epoch_[static_cast<size_t>(r)]) {
      post(r);
      if (!last_.empty()) send(r);
    }
    // Every record that arrived, oldest first (the latest one stays in the slot).
    while (req >= 0) {
      size_t bytes = 0;
      try {
        if (!remote_->test(req, &bytes)) break;
      } catch (const PeerFailedError&) {
        // The peer is lost or left (its death reaches Membership through the watch): a failed
        // request stays the caller's until withdrawn.
        remote_->abandon(req);
        req = -1;
        break;
      }
      const auto& in = inbox_[static_cast<size_t>(r)];
      if (bytes == in.size() * 4) win_.store_member(r, in[0], in.data() + 1, words_);
      post(r);
    }
  }
  while (!out_.empty()) {  // sends complete in order per peer; test the oldest first
    try {
      if (!remote_->test(out_.front().request, nullptr)) break;
    } catch (const PeerFailedError&) {
      remote_->abandon(out_.front().request);
    }
    out_.pop_front();
  }
}

}  // namespace ubep::ep
