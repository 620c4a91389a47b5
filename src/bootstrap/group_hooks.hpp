// What the library's internals reach through a Group beyond its public interface: the transport
// between hosts, the death watch, and elastic membership. Group implementations (thread_group,
// shm_group, mpi_group) implement the hooks they have and register them (Group::set_hooks);
// the EP layer asks for them with hooks_of(group), which answers a group without any with the
// defaults below (one host, nothing watched, never rejoining).
#pragma once

#include <cstdint>
#include <functional>

#include "ubep/group.hpp"

namespace ubep::bootstrap {

class DeathWatch;

class GroupHooks {
 public:
  virtual ~GroupHooks() = default;
  // Point-to-point transport to ranks on other hosts; nullptr on a single host. Used by the
  // cross-host relay of the EP algorithms, from one thread at a time.
  virtual transport::Remote* remote() { return nullptr; }
  // Process groups watch the processes of this host's other ranks (docs/ELASTIC.md); nullptr
  // where nothing is watched.
  virtual DeathWatch* death_watch() { return nullptr; }
  // Elastic groups: the incarnation of `rank` (0 for the group's first processes, +1 per
  // replacement), whether this process is a replacement that joined a live group (its Buffers
  // make no collective set-up calls), and what to do once a replacement of `rank` is seen.
  virtual uint32_t incarnation_of(int /*rank*/) const { return 0; }
  virtual bool rejoining() const { return false; }
  virtual void peer_replaced(int /*rank*/) {}
  // Groups that span hosts: forward this host's deaths to the other hosts and take theirs
  // (docs/ELASTIC.md). Called by the caller's thread inside its waits.
  virtual void pump_deaths() {}
  // Groups of one launcher per host (make_tcp_group): takes the connections of a replacement
  // host's ranks (issue 32). Caller's thread, between calls only (it changes the transport's
  // peers and revives their deaths).
  virtual void pump_rejoins() {}
  // The same, then waits (bounded) until the notices sent are delivered: before a caller's wait
  // leaves with a death, as this rank may be the one that forwards it and may not call the
  // transport again.
  virtual void forward_deaths_now() {}
  // Whether a new Buffer on this rank mirrors one the live ranks made before this process
  // joined (a replacement: no collective set-up, agreed with them at its first dispatch) rather
  // than being made collectively by every rank. A TCP group's replacement host mirrors until its
  // first group barrier or allgather, then makes new Buffers with the others (issue 32).
  virtual bool mirrors_buffers() const { return rejoining(); }
  // The number of the next Buffer this process makes on the group: 0, 1, 2, ... in the order it
  // makes them. Every rank makes the same Buffers in the same order (a replacement makes its
  // predecessor's), so a number names the same Buffer on every rank, and a Buffer's messages
  // between hosts that stay posted across calls (MemberLink's records) carry it in their tag:
  // two Buffers of one group never take each other's. 0 in groups that never need it.
  virtual int next_buffer_number() { return 0; }
  // Groups that span hosts (issue 32): a Buffer's failure word (protocol.hpp) reaches its
  // host-mates through their windows; these carry it to the ranks of the other hosts
  // (DeathNotices), so that one waiting in the relay for a rank that rejected or failed the call
  // stops at once instead of at the timeout. tell: this rank's word of Buffer number `buffer`
  // (caller's thread; it also flushes, bounded). watch: `on(rank, word)` for each word of that
  // Buffer from another host, called by whichever thread pumps the notices; returns an id for
  // unwatch (-1: nothing to watch, one host). unwatch returns once no call of `on` is running.
  virtual void tell_call_failure(int /*buffer*/, uint32_t /*word*/) {}
  virtual int watch_call_failures(int /*buffer*/, std::function<void(int, uint32_t)> /*on*/) {
    return -1;
  }
  virtual void unwatch_call_failures(int /*id*/) {}
};

}  // namespace ubep::bootstrap
