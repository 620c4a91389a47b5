// The Remote transport over plain TCP sockets, one connection per pair of ranks on different
// hosts (issue 32; docs/ELASTIC.md, "Transport for a lost host"). Unlike an MPI job it outlives a
// host: a peer whose connection breaks (its process killed: the kernel closes the socket; a cut
// cable named by the heartbeat: fail_peer) fails only the requests to and from that peer, with a
// PeerFailedError naming it; the other peers' requests go on, and nothing aborts the process.
//
// Why own sockets and not UCX: the transport needs only tagged, per-pair ordered, non-blocking
// point-to-point between a few hosts, and full control of what a broken peer does (UCX's
// endpoint error handling reports through a callback from its own progress, and its TCP
// transport keeps retrying a cut link for its own timeout). Sockets need no dependency and
// their failure modes are the kernel's, which the tests can provoke (kill, link down).
//
// Wire: every message is a 16-byte header {kind, tag, bytes} then its bytes. kind kBye is the
// last frame of a peer that ends cleanly (its group destroyed): after it, EOF is a departure,
// not a loss.
//
// Progress and threads: there is no progress thread. Every call (isend, irecv, cancel, and test
// of a request not yet complete) first moves whatever the sockets accept or hold, without
// blocking (non-blocking sockets, MSG_NOSIGNAL; one poll finds the connections to read). The object
// is used by one thread at a time (the Remote contract: the caller's thread of the group), so no
// state is shared between threads and nothing needs a lock.
//
// Matching (MPI's non-overtaking rule): messages from one peer arrive in the order it sent them.
// A message of (peer, tag) goes to the oldest receive posted for (peer, tag); with none posted
// it is kept whole as unexpected, and a later receive for (peer, tag) takes the oldest one.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <string>
#include <vector>

#include "transport/remote.hpp"

namespace ubep::transport {

class TcpRemote : public Remote {
 public:
  // fds[p]: a connected stream socket to rank p (-1: none, e.g. a host-mate or this rank). Takes
  // ownership: they are made non-blocking here and closed by the destructor.
  TcpRemote(int rank, std::vector<int> fds);
  // Sends what is queued (bounded by linger), then a goodbye to every live peer, then closes.
  ~TcpRemote() override;
  TcpRemote(const TcpRemote&) = delete;
  TcpRemote& operator=(const TcpRemote&) = delete;

  int isend(int peer, int tag, const void* data, size_t bytes) override;
  int irecv(int peer, int tag, void* data, size_t capacity) override;
  // Throws PeerFailedError when the request's peer was lost or left before it completed.
  bool test(int request, size_t* bytes) override;
  void cancel(int request) override;
  // A send not yet begun is dropped; one half on the wire has the rest of its bytes copied.
  void abandon(int request) override { cancel(request); }
  void drop_unexpected(const std::function<bool(int, int)>& stale) override;
  bool withdraws() const override { return true; }
  // ppoll on every live connection (readable; writable where sends are queued).
  void wait_for_progress(std::chrono::microseconds max) override;

  // The peer is no longer reachable (another judge said so: the host heartbeat): its
  // connection is closed and its requests fail with `why`.
  void fail_peer(int peer, const std::string& why);
  // A replacement process of a lost (or departed) peer connected on `fd` (issue 32, rejoin):
  // the peer's state starts afresh on the new connection (nothing queued, nothing kept), its
  // epoch moves on, and every request of the old connection still held fails at its test with
  // the old connection's failure (none of them may take a message of the new one).
  void replace_peer(int peer, int fd);
  uint32_t epoch(int peer) const override { return peers_[index(peer)].epoch; }
  // How errors name the peer after "rank P", e.g. " with host 1 (ranks 2, 3)" (default: "").
  void set_peer_label(int peer, std::string label) { peers_[index(peer)].label = std::move(label); }
  // Empty while the peer is reachable; else why not ("lost: its connection closed ...").
  const std::string& peer_failure(int peer) const { return peers_[index(peer)].failure; }
  // fn(peer, why) runs on the calling thread, inside a call of this object, once per peer whose
  // connection broke without a goodbye (not for fail_peer, nor for a clean departure).
  void on_peer_lost(std::function<void(int, const std::string&)> fn) { on_lost_ = std::move(fn); }
  // Moves data on every socket without blocking (every call does this first, but test_moved).
  void progress() override;
  bool test_moved(int request, size_t* bytes) override;
  // How long the destructor tries to deliver queued sends.
  std::chrono::milliseconds linger{1000};

 private:
  enum Kind : uint32_t { kData = 0x55424550u, kBye = 0x55425945u };
  struct Header {
    uint32_t kind;
    int32_t tag;
    uint64_t bytes;
  };
  struct Request {
    bool live = false, recv = false, done = false;
    bool owned = false;  // a send's copy of its bytes (cancelled half-way): freed once written
    int peer = -1, tag = 0;
    uint32_t epoch = 0;         // the peer's connection it belongs to
    const char* out = nullptr;  // send
    char* in = nullptr;         // receive
    size_t capacity = 0, bytes = 0;
  };
  struct Inbound {  // the message being read from a peer
    Header header{};
    size_t header_got = 0, body_got = 0;
    int request = -1;        // the receive it lands in, or -1: into `unexpected`
    std::vector<char> kept;  // an unexpected message's bytes
  };
  struct Peer {
    int fd = -1;
    bool said_bye = false;
    std::string failure;      // non-empty: lost or left
    std::string old_failure;  // why the previous connection ended (replace_peer)
    uint32_t epoch = 0;       // connections so far, minus one
    std::string label;        // see set_peer_label
    std::deque<int> sends;    // queued send requests, oldest first; the first may be partly sent
    size_t sent = 0;          // bytes of the first send's frame (header + body) already written
    Header bye_header{kBye, 0, 0};
    bool bye_queued = false;
    size_t bye_sent = 0;
    Inbound inbound;
    std::list<int> posted;                                    // receives waiting, oldest first
    std::list<std::pair<int, std::vector<char>>> unexpected;  // (tag, message), oldest first
  };

  size_t index(int peer) const;
  int slot();
  void release(int request);
  bool write_some(int p);
  bool read_some(int p);
  void deliver(int p);
  void lose(int p, const std::string& why, bool tell);
  [[noreturn]] void throw_failed(const Request& r, const std::string& failure) const;
  static void set_non_blocking(int fd, int peer);

  int rank_;
  std::vector<Peer> peers_;
  std::vector<Request> requests_;
  std::vector<int> free_;
  std::function<void(int, const std::string&)> on_lost_;
  std::vector<pollfd> poll_fds_;  // progress()'s and wait_for_progress()'s: no allocation a call
  std::vector<int> poll_peers_;   // the peer of each poll_fds_ entry
};

}  // namespace ubep::transport
