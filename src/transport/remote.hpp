// Point-to-point transport between ranks on different hosts (no shared memory between them).
//
// Why tagged non-blocking point-to-point rather than MPI one-sided RMA: data-as-flag needs the
// flag to land after the data. MPI_Put gives no ordering between two puts without a flush (which
// is the fence-and-flag round ubep removes), and over OpenMPI's TCP transport passive-target RMA
// only progresses when the target calls into MPI anyway. A message carries its own completion:
// when the receive completes, the whole message is there, and MPI keeps messages between two
// ranks with the same tag in order. The relay rank then applies the shared-memory data-as-flag
// protocol inside its host.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>

namespace ubep::transport {

class Remote {
 public:
  virtual ~Remote() = default;
  // Start a send/receive; returns a request id. Buffers must stay valid until test() says done.
  virtual int isend(int peer, int tag, const void* data, size_t bytes) = 0;
  virtual int irecv(int peer, int tag, void* data, size_t capacity) = 0;
  // True once the request completed (the id is then released); *bytes receives the size.
  virtual bool test(int request, size_t* bytes) = 0;
  // Withdraws a receive that has not completed (the id is released).
  virtual void cancel(int request) = 0;
  // The caller is about to free the buffer of a request it will never test again (a failed
  // call's): a transport that can withdraw it safely does (TcpRemote: cancel). The default
  // leaves it be, as before (MpiRemote: MPI_Wait after an MPI_Cancel that cannot succeed, a
  // receive already matched to a dead peer's message, would block).
  virtual void abandon(int /*request*/) {}
  // Whether abandon() really withdraws a request, so that an object may keep receives posted
  // across calls and withdraw them when it goes (MemberLink; elastic EP across hosts needs it).
  virtual bool withdraws() const { return false; }
  // Drops the messages that arrived with no receive posted and that `stale(peer, tag)` names
  // (a call abandoned when the group changed: its messages must never meet a later call's
  // receive). The default keeps them (MPI has no way to discard an unmatched message).
  virtual void drop_unexpected(const std::function<bool(int, int)>& /*stale*/) {}
  // The connection generation of `peer`: it changes when a replacement of a lost peer connects
  // (TcpRemote::replace_peer), so an object whose receive from it failed knows when to post
  // again. Constant (0) where peers are never replaced.
  virtual uint32_t epoch(int /*peer*/) const { return 0; }
  // Moves whatever the transport holds or can take now, without blocking (TcpRemote: its
  // sockets). Then test_moved() tests requests without moving anything again: a caller that
  // tests many requests in one pass (MeshCollective) moves the transport once per pass, not once
  // per request. The default moves nothing and test_moved() is test().
  virtual void progress() {}
  virtual bool test_moved(int request, size_t* bytes) { return test(request, bytes); }
  // Blocks until a request may have moved on (bytes arrived from a peer, room for a queued
  // send, a peer's connection ended) or `max` passed; spurious returns are allowed. For a wait
  // that polls its requests (MeshCollective): woken by the data itself, so no nap's length is
  // added to each hop and no CPU is spun that the peers' processes need. The default, for a
  // transport with nothing to wait on, sleeps.
  virtual void wait_for_progress(std::chrono::microseconds max) {
    std::this_thread::sleep_for(max);
  }
};

}  // namespace ubep::transport
