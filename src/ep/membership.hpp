// Elastic EP (docs/ELASTIC.md): which ranks of a Buffer take part in its calls, and how the
// live ranks agree on a change -- a rank masked (it died, or mask() was called) or a rank back
// (rejoin) -- through their windows, without the masked rank and without a collective.
//
// A view holds, per rank, incarnation << 1 | masked. Views merge rank by rank: the higher
// incarnation wins, and at the same incarnation masked wins; so merging only ever moves up
// (a rank is masked, or comes back as a new incarnation) and every live rank ends with the same
// view. Every rank publishes (round, view, the calls it started, its last dispatch sequence
// number) as its membership record in every peer's window (protocol.hpp MemberRecord, a
// seqlock; the rank is its slot's only writer). A change bumps the round; adopting a peer's
// higher round joins its agreement. The agreement ends when every rank that is live in this
// rank's view has published the same round and view: from then on no record changes until the
// next change, so every live rank sees the same records, ends the same agreement and resumes at
// the same call: one past the highest call and dispatch sequence any of them used, so no
// message tag of an earlier call (stale data in the windows) can be taken for a new one.
//
// Agreements run only at the start of a dispatch (every rank is between calls then: its part of
// every earlier call is done or abandoned). A rank that abandons a call because of a change
// publishes a new round at once, with kAbandoned, so peers waiting in that call for its part
// stop (FailureWatch) instead of waiting for the timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/wait.hpp"
#include "ep/member_link.hpp"
#include "ep/remote_failures.hpp"
#include "ep/window.hpp"
#include "ubep/group.hpp"

namespace ubep::ep {

class Membership {
 public:
  // config: config_digest of the buffer's config, published in every record.
  Membership(Group& group, const Window& win, uint32_t config);

  // --- the view agreed at the last dispatch (read by the calls' threads; changed only
  // between calls, by the caller's thread) ---
  bool masked(int r) const { return masked_[static_cast<size_t>(r)] != 0; }
  const std::vector<uint8_t>& masked_vector() const { return masked_; }
  std::vector<int> masked_ranks() const;

  // --- liveness (any thread) ---
  bool dead(int r) const;
  std::string death_note(int r) const;  // "died (signal 9)"

  // --- local changes, agreed at the next dispatch ---
  void mask(int r);
  void rejoin();  // this rank comes back as a new incarnation, unmasked

  // Takes the records of ranks on other hosts that arrived (caller's thread, between calls).
  void pump() { link_.pump(); }
  // This Buffer's number on the group (the same on every rank).
  int buffer_number() const { return link_.buffer_number(); }
  // The failure word of rank r of another host, as its last notice said (remote_failures.hpp);
  // tell_failure: this rank's new word to the ranks of the other hosts (caller's thread).
  uint32_t remote_failure(int r) const { return failures_.word(r); }
  void tell_failure(uint32_t word) { failures_.tell(word); }
  // Whether lost hosts can be masked: one host, or the records cross hosts (a TCP group).
  bool can_mask_hosts() const { return group_.single_host() || link_.active(); }

  // A rank that is live in the agreed view but dead (-1: none).
  int dead_unmasked() const;
  // A peer that began an agreement this rank has not joined (-1: none); with `call` > 0, only
  // one whose part of call `call` is missing (it abandoned it or an earlier one).
  int peer_ahead(uint64_t call = 0) const;
  // Whether this rank's next dispatch must agree first.
  bool change_pending() const;

  // A call failed because of a change: publish a new round now, marked abandoned, so peers
  // waiting in that call for this rank's part stop at once. auto_mask: dead ranks are masked.
  void abandon(uint64_t calls, uint64_t seq, bool auto_mask);

  struct Resume {
    uint64_t calls = 0, seq = 0;  // the last call / dispatch sequence number anyone used
  };
  // At the start of a dispatch: agree with every live peer on the view; bounded by the policy's
  // timeout. auto_mask: dead ranks are masked; otherwise an unmasked dead rank is a
  // PeerFailedError naming it.
  Resume agree(uint64_t calls, uint64_t seq, bool auto_mask, const WaitPolicy& policy,
               const char* what);
  // The same in three steps, for an agreement shared by the Buffers of a group
  // (group_agreement.hpp): begin (this rank's new round out), poll until true, end (the view
  // agreed; where to resume).
  void begin_agreement(uint64_t calls, uint64_t seq, bool auto_mask, const char* what);
  // One poll of the peers' records: false while the round moves, true once every live rank
  // agrees on this round and view (where to resume is kept for end_agreement).
  bool poll(bool auto_mask, const char* what);
  Resume end_agreement();
  // What each rank last said, for a stuck agreement's timeout message.
  std::string agreement_state(const char* what) const;

  // A replacement of rank r of another host is taken only where `joint(r)` is true too: the
  // Buffers of a shared agreement take it only once its records of each of them have arrived.
  void set_joint_replaced(std::function<bool(int)> joint) { joint_replaced_ = std::move(joint); }
  // Rank r's replacement has published this Buffer's first record, with this config (below).
  bool replaced_here(int r) const;
  // Its record arrived (replaced_here) or this Buffer has taken it already: what the joint check
  // of another Buffer asks.
  bool knows_replacement(int r) const;

 private:
  struct Record {
    uint32_t round = 0, flags = 0, config = 0;
    uint64_t calls = 0, seq = 0;
    std::vector<uint32_t> view;
  };
  bool read(int r, Record* out) const;
  void publish(uint32_t flags);
  void bump() { round_ = max_round_seen() + 1; }
  uint32_t max_round_seen() const;
  // Dead ranks live in view_: masked (auto_mask) or a PeerFailedError.
  void absorb_deaths(bool auto_mask, const char* what);
  // Merges a peer's view into view_; true if view_ changed.
  bool merge(const std::vector<uint32_t>& other);
  bool live_in_view(int r) const { return (view_[static_cast<size_t>(r)] & 1u) == 0; }
  // Whether r's records reach this rank: a host-mate's window, or the transport (MemberLink).
  bool linked(int r) const { return win_.peer(r) != nullptr || link_.remote(r); }
  // Across hosts (issue 32): a dead rank is masked only with its whole host, and only on the
  // side of a partition that may go on (majority of hosts; a tie: the lowest host).
  bool host_dead(int h) const;
  void check_partition(const char* what) const;
  // Rank r of another host is dead while a host-mate of it lives: a whole lost host looks so for
  // a few ms (its ranks' connections close, or their heartbeats stop, one after another), so
  // this waits kPartlyLostGrace from the first sight, then names it (PeerFailedError) instead
  // of leaving the agreement to the Buffer's timeout.
  void check_partly_lost(int r, const char* what);
  // A replacement of rank r published its part of this buffer's window (rendezvous stamp newer
  // than the incarnation in view_); for a rank of another host (issue 32): its new connection
  // is taken and its first record of this buffer, with this config digest, has arrived.
  bool replaced(int r) const;
  bool remote_replaced(int r) const;
  // A replacement (this process joined live ranks) refuses a config digest that differs from a
  // live peer's, naming it; the live ranks never take such a replacement (remote_replaced).
  void check_config(int r, const Record& rec, const char* what) const;
  // Maps a replacement's window and watches its process; its records are then read like any.
  void take_replacements();

  Group& group_;
  const Window& win_;
  int me_, ranks_;
  uint32_t config_;                       // config_digest of this buffer
  std::vector<uint32_t> view_;            // proposed: agreed_ plus local changes and merges
  std::vector<uint32_t> agreed_;          // at the last agreement
  std::vector<uint32_t> published_view_;  // in this rank's last record
  std::vector<uint8_t> masked_;           // agreed_, as flags
  // Concurrency: this object is written only by the caller's thread between calls (agree runs
  // before a call's roles start, abandon after they ended); role threads read masked_, round_
  // and the records (peer_ahead, from FailureWatch) during a call. run_roles' start and join
  // order the two, so no lock is needed; peers' records are read through the seqlock.
  uint32_t round_ = 0;            // round of the last published record
  bool must_agree_ = false;       // abandoned a call: the next dispatch agrees, whatever else
  bool abandoned_ = false;        // the last call started was abandoned (until an agreement)
  uint32_t version_ = 0;          // seqlock versions of this rank's records
  uint64_t calls_ = 0, seq_ = 0;  // of the last published record
  std::vector<uint32_t> fields_;  // staging for publish/read
  MemberLink link_;               // records to and from ranks of other hosts
  RemoteFailures failures_;       // failure words of ranks of other hosts (numbered as link_)
  // [rank] the incarnation refused for its config (warned once); caller's thread only.
  mutable std::vector<uint32_t> refused_;
  // [rank] when this rank first saw r dead with a host-mate of r alive (check_partly_lost); the
  // epoch (zero) while not so. Caller's thread only.
  std::vector<std::chrono::steady_clock::time_point> partly_since_;
  Resume resume_;                            // of the agreement under way (begin .. end)
  std::function<bool(int)> joint_replaced_;  // set_joint_replaced; empty: this Buffer alone
};

}  // namespace ubep::ep
