// The group barrier and allgather of a TCP group (one launcher per host, issue 32) over the
// transport between hosts alone, so they keep working after a replacement host joined: the
// set-up's star through rank 0 does not reach a replacement (nor outlive host 0), the mesh does.
//
// Algorithm (two rounds, every message on the connections TcpRemote already holds; a message is
// cut into chunks of at most kChunk bytes, so one receive size fits every message of these tags,
// a stale one of another call's size included):
//  1. every rank sends its contribution to every rank of the other hosts;
//  2. every rank x has a forwarder: the rank of the next host (cyclic) with x's local index
//     (modulo that host's size). Once it holds the round-1 messages of every other host's ranks,
//     the forwarder sends x the contributions of x's own host (host-mates share no connection).
// A rank leaves once it holds every rank's contribution: each other host's rank's came in round 1
// (so it had entered), its host-mates' came through the forwarder, which sends them only once
// they all reached it (so they had entered): a barrier is an allgather of nothing.
//
// One agreed membership view per call: the view is every rank's incarnation (TcpGroup: the
// door's mesh; a replacement's ranks come back at a higher one). Every message carries its
// sender's view (the sum of the incarnations, which only grows, and a digest of them) and the
// call's index in that view (seq: calls begun in the view, failed ones counted, so it is the same
// on every rank that makes the same calls). A message is taken only by the call of the same view
// and seq; one of an older view or seq (of a call that failed before it was read) is dropped; one
// of a newer (its sender took a replacement this rank has not, or began the next call) is kept
// until this rank gets there. A call fixes its view at its start, after taking the replacements
// waiting at the door; if a replacement is taken while it waits (the door is pumped in its
// waits, so a joining replacement is answered), the call starts again from round 1 in the new
// view: no call returns contributions of two views. A view starts at seq 0 on every rank: a live
// rank takes a replacement between calls or inside one (which then restarts), and the
// replacement's first call is the first of its view, so ranks making the same calls agree.
// Not covered (documented): a rank that dies inside a call after its message reached some ranks
// but not others lets the first complete and the others fail (as in MPI); if its replacement is
// then taken inside the call by those others, their restarted call is the new view's first.
//
// Bounded: a lost rank fails the call at once with the transport's PeerFailedError naming it and
// its host; a dead one the death watch names (a host-mate; a host the heartbeat judged lost), of
// the ranks the call still needs (a host-mate that exited cleanly after the call is not one);
// anything else is a TimeoutError at the group's timeout naming the ranks not heard from.
//
// Threads: none of its own. Used on the caller's thread only, between calls (Group::barrier and
// allgather are set-up calls), which is the only thread that touches the transport and the door
// then; the death watch is read through DeathCheck (acquire loads of flags its thread sets).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "bootstrap/death_check.hpp"
#include "transport/remote.hpp"

namespace ubep::bootstrap {

// What the collective asks of its group.
struct MeshHooks {
  std::function<uint32_t(int)> incarnation;  // the view: every rank's incarnation now
  std::function<void()> pump;                // takes replacements waiting at the door
  const DeathCheck* deaths = nullptr;        // names a dead rank while waiting (nullptr: none)
};

class MeshCollective {
 public:
  static constexpr int kTagGather = 7105;   // round 1 (beside DeathNotices' 7103)
  static constexpr int kTagForward = 7106;  // round 2
  MeshCollective(int rank, std::vector<int> host_of, transport::Remote& remote, MeshHooks hooks,
                 std::chrono::milliseconds timeout);
  MeshCollective(const MeshCollective&) = delete;
  MeshCollective& operator=(const MeshCollective&) = delete;

  // out[size * bytes]; every rank passes the same bytes (a rank that does not is named).
  void allgather(const void* in, void* out, size_t bytes);
  void barrier() { run("group barrier", nullptr, nullptr, 0); }
  // Calls begun so far (for names and tests).
  uint64_t calls() const { return calls_; }

  struct View {
    uint64_t sum = 0, digest = 0;
    bool operator==(const View& o) const { return sum == o.sum && digest == o.digest; }
  };
  struct Header {  // of every chunk
    uint32_t magic;
    int32_t from;
    uint64_t view_sum, view_digest;
    uint64_t seq;
    uint64_t total;   // the message's bytes (round 1: one rank's contribution; 2: its host's)
    uint64_t offset;  // of this chunk's bytes in the message
  };
  static constexpr size_t kChunk = 16384;  // header included

 private:
  class Call;
  friend class Call;
  void run(const char* what, const void* in, void* out, size_t bytes);
  bool wait(Call& call, std::chrono::steady_clock::time_point deadline);
  View view() const;
  int forwarder(int x) const;

  int rank_;
  std::vector<int> host_of_;
  std::vector<std::vector<int>> hosts_;  // ranks of every host, ascending
  transport::Remote& remote_;
  MeshHooks hooks_;
  std::chrono::milliseconds timeout_;
  View last_view_;
  uint64_t seq_ = 0;    // calls begun in last_view_
  uint64_t calls_ = 0;  // calls begun in all
  // Messages of a newer view or seq than the call that read them, by (peer, tag): kept for the
  // call they belong to (at most one per (peer, tag): no receive is posted behind one).
  std::map<std::pair<int, int>, std::vector<char>> ahead_;
};

}  // namespace ubep::bootstrap
