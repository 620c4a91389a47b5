#include "transport/tcp/tcp_remote.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ubep/error.hpp"

namespace ubep::transport {

namespace {
constexpr size_t kHeaderBytes = 16;
static_assert(sizeof(uint32_t) + sizeof(int32_t) + sizeof(uint64_t) == kHeaderBytes);
}  // namespace

TcpRemote::TcpRemote(int rank, std::vector<int> fds) : rank_(rank), peers_(fds.size()) {
  for (size_t p = 0; p < fds.size(); ++p) {
    peers_[p].fd = fds[p];
    if (fds[p] >= 0) set_non_blocking(fds[p], static_cast<int>(p));
  }
}

void TcpRemote::set_non_blocking(int fd, int peer) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw SystemError(detail::concat("TcpRemote: cannot make the socket to rank ", peer,
                                     " non-blocking: ", std::strerror(errno)));
}

void TcpRemote::replace_peer(int peer, int fd) {
  Peer& p = peers_[index(peer)];
  UBEP_CHECK_ARG(!p.failure.empty(), "TcpRemote: rank ", peer,
                 " is still connected; only a lost or departed rank can be replaced");
  set_non_blocking(fd, peer);
  // Receives still posted for the old connection stay the caller's (they fail at test, below);
  // they must not match the new connection's messages.
  Peer fresh;
  fresh.fd = fd;
  fresh.label = std::move(p.label);
  fresh.old_failure = std::move(p.failure);
  fresh.epoch = p.epoch + 1;
  p = std::move(fresh);
}

TcpRemote::~TcpRemote() {
  on_lost_ = nullptr;  // the owner's watch may be gone by now
  for (Peer& peer : peers_)
    if (peer.fd >= 0) peer.bye_queued = true;
  const auto until = std::chrono::steady_clock::now() + linger;
  for (;;) {
    bool pending = false;
    std::vector<pollfd> fds;
    for (size_t p = 0; p < peers_.size(); ++p) {
      Peer& peer = peers_[p];
      if (peer.fd < 0) continue;
      write_some(static_cast<int>(p));
      if (peer.fd >= 0 && (!peer.sends.empty() || peer.bye_queued)) {
        pending = true;
        fds.push_back({peer.fd, POLLOUT, 0});
      }
    }
    if (!pending || std::chrono::steady_clock::now() >= until) break;
    poll(fds.data(), fds.size(), 1);
  }
  for (Peer& peer : peers_) {
    if (peer.fd < 0) continue;
    // Unread bytes at close() make the kernel send a reset instead of an orderly end, which may
    // discard our goodbye at the peer: read what is there first.
    char sink[4096];
    while (recv(peer.fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    shutdown(peer.fd, SHUT_WR);
    close(peer.fd);
  }
  for (Request& r : requests_)
    if (r.live && r.owned) delete[] r.in;
}

size_t TcpRemote::index(int peer) const {
  UBEP_CHECK_ARG(peer >= 0 && static_cast<size_t>(peer) < peers_.size() && peer != rank_,
                 "TcpRemote: peer ", peer, " out of range [0, ", peers_.size(), ") or this rank");
  return static_cast<size_t>(peer);
}

int TcpRemote::slot() {
  int s;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    requests_.emplace_back();
    s = static_cast<int>(requests_.size()) - 1;
  }
  requests_[static_cast<size_t>(s)] = Request{};
  requests_[static_cast<size_t>(s)].live = true;
  return s;
}

void TcpRemote::release(int request) {
  requests_[static_cast<size_t>(request)].live = false;
  free_.push_back(request);
}

int TcpRemote::isend(int peer, int tag, const void* data, size_t bytes) {
  Peer& p = peers_[index(peer)];
  UBEP_CHECK_ARG(p.fd >= 0 || !p.failure.empty(), "TcpRemote: no connection to rank ", peer,
                 " (a host-mate?)");
  const int s = slot();
  Request& r = requests_[static_cast<size_t>(s)];
  r.peer = peer;
  r.tag = tag;
  r.epoch = p.epoch;
  r.out = static_cast<const char*>(data);
  r.bytes = bytes;
  if (p.failure.empty()) p.sends.push_back(s);
  progress();
  return s;
}

int TcpRemote::irecv(int peer, int tag, void* data, size_t capacity) {
  Peer& p = peers_[index(peer)];
  UBEP_CHECK_ARG(p.fd >= 0 || !p.failure.empty(), "TcpRemote: no connection to rank ", peer,
                 " (a host-mate?)");
  progress();
  // A message that arrived before its receive (the oldest of the tag) is taken at once; with
  // none kept, no older message of the tag can still be on its way ahead of a later one.
  auto kept = std::find_if(p.unexpected.begin(), p.unexpected.end(),
                           [tag](const auto& m) { return m.first == tag; });
  UBEP_CHECK_ARG(kept == p.unexpected.end() || kept->second.size() <= capacity,
                 "TcpRemote: a message of ", kept->second.size(), " bytes from rank ", peer,
                 " (tag ", tag, ") for a receive of ", capacity);
  const int s = slot();
  Request& r = requests_[static_cast<size_t>(s)];
  r.recv = true;
  r.peer = peer;
  r.tag = tag;
  r.epoch = p.epoch;
  r.in = static_cast<char*>(data);
  r.capacity = capacity;
  if (kept != p.unexpected.end()) {
    if (!kept->second.empty()) std::memcpy(r.in, kept->second.data(), kept->second.size());
    r.bytes = kept->second.size();
    r.done = true;
    p.unexpected.erase(kept);
    return s;
  }
  p.posted.push_back(s);
  return s;
}

bool TcpRemote::test(int request, size_t* bytes) {
  // A request already complete needs no progress: a caller testing several requests in turn
  // moves the sockets once per pending one, not once per request. (A bad id: test_moved names.)
  const auto at = static_cast<size_t>(request);
  if (request >= 0 && at < requests_.size() && requests_[at].live && !requests_[at].done)
    progress();
  return test_moved(request, bytes);
}

bool TcpRemote::test_moved(int request, size_t* bytes) {
  UBEP_CHECK_ARG(request >= 0 && static_cast<size_t>(request) < requests_.size() &&
                     requests_[static_cast<size_t>(request)].live,
                 "TcpRemote: no request ", request);
  const Request& r = requests_[static_cast<size_t>(request)];
  if (r.done) {
    if (bytes) *bytes = r.bytes;
    release(request);
    return true;
  }
  const Peer& p = peers_[static_cast<size_t>(r.peer)];
  if (r.epoch != p.epoch) throw_failed(r, p.old_failure);  // of a connection since replaced
  if (!p.failure.empty()) throw_failed(r, p.failure);
  return false;
}

void TcpRemote::throw_failed(const Request& r, const std::string& failure) const {
  // failure is "lost: why" or "left ...": "rank 2 lost with host 1 (ranks 2, 3): why".
  const Peer& p = peers_[static_cast<size_t>(r.peer)];
  const bool lost = failure.rfind("lost: ", 0) == 0;
  throw PeerFailedError(detail::concat("rank ", r.peer, lost ? " lost" : "", p.label,
                                       lost ? ": " : " ", lost ? failure.substr(6) : failure,
                                       " (rank ", rank_, "'s ", r.recv ? "receive" : "send",
                                       ", tag ", r.tag, ")"));
}

void TcpRemote::drop_unexpected(const std::function<bool(int, int)>& stale) {
  progress();
  for (size_t p = 0; p < peers_.size(); ++p)
    peers_[p].unexpected.remove_if(
        [&](const auto& m) { return stale(static_cast<int>(p), m.first); });
}

void TcpRemote::cancel(int request) {
  if (request < 0 || static_cast<size_t>(request) >= requests_.size()) return;
  Request& r = requests_[static_cast<size_t>(request)];
  if (!r.live) return;
  Peer& p = peers_[static_cast<size_t>(r.peer)];
  if (r.epoch != p.epoch) {  // of a connection since replaced: nothing of it is left to undo
  } else if (r.recv) {
    p.posted.remove(request);
    if (p.inbound.request == request) {
      // Part of its message is in the caller's memory already: keep the message whole for a
      // later receive instead (the stream cannot skip it).
      Inbound& in = p.inbound;
      in.kept.assign(r.in, r.in + in.body_got);
      in.kept.resize(in.header.bytes);
      in.request = -1;
    }
  } else if (!r.done) {
    auto it = std::find(p.sends.begin(), p.sends.end(), request);
    if (it != p.sends.end()) {
      if (it == p.sends.begin() && p.sent > 0) {
        // Half on the wire: the rest must still go, but the caller's buffer is theirs again.
        // Replace the request with an anonymous copy that releases itself when written.
        const Request orig = r;  // slot() may move the requests
        const int copy = slot();
        Request& c = requests_[static_cast<size_t>(copy)];
        c = orig;
        c.owned = true;
        c.in = new char[orig.bytes];
        if (orig.bytes > 0) std::memcpy(c.in, orig.out, orig.bytes);
        c.out = c.in;
        *it = copy;
      } else {
        p.sends.erase(it);
      }
    }
  }
  requests_[static_cast<size_t>(request)].live = false;
  free_.push_back(request);
}

void TcpRemote::fail_peer(int peer, const std::string& why) {
  lose(static_cast<int>(index(peer)), why, false);
}

void TcpRemote::lose(int p, const std::string& why, bool tell) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  if (!peer.failure.empty()) return;
  peer.failure = why;
  if (peer.fd >= 0) close(peer.fd);
  peer.fd = -1;
  for (int s : peer.sends) {
    Request& r = requests_[static_cast<size_t>(s)];
    if (r.owned) {  // an anonymous copy (cancel): nobody will test it
      delete[] r.in;
      release(s);
    }
  }
  peer.sends.clear();
  peer.bye_queued = false;
  if (tell && on_lost_) on_lost_(p, why);
}

void TcpRemote::wait_for_progress(std::chrono::microseconds max) {
  std::vector<pollfd>& fds = poll_fds_;  // progress()'s buffer: neither runs inside the other
  fds.clear();
  for (const Peer& peer : peers_)
    if (peer.fd >= 0) {
      const bool queued = !peer.sends.empty() || peer.bye_queued;
      fds.push_back({peer.fd, static_cast<short>(POLLIN | (queued ? POLLOUT : 0)), 0});
    }
  const long long us = std::max<long long>(0, max.count());
  const timespec limit{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  // An error (EINTR) or a timeout is a spurious return: the caller tests its requests again.
  ppoll(fds.data(), fds.size(), &limit, nullptr);
}

// Writes where sends are queued (no system call otherwise), then one poll finds the connections
// with bytes (or an end) waiting, and only those are read. Reading every connection instead
// cost one recv per peer per call, nearly all EAGAIN: a mesh barrier of 3x2 made about 345 recv
// calls per rank, most of its time (docs/ELASTIC.md, "Latency: the mesh against the star").
void TcpRemote::progress() {
  poll_fds_.clear();
  poll_peers_.clear();
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (peers_[p].fd < 0 || !write_some(static_cast<int>(p))) continue;
    poll_fds_.push_back({peers_[p].fd, POLLIN, 0});
    poll_peers_.push_back(static_cast<int>(p));
  }
  if (poll_fds_.empty() || poll(poll_fds_.data(), poll_fds_.size(), 0) <= 0) return;
  for (size_t i = 0; i < poll_fds_.size(); ++i) {
    const int p = poll_peers_[i];
    // A read above may have lost a peer (its fd closed, perhaps reused): only the polled one.
    if (poll_fds_[i].revents != 0 && peers_[static_cast<size_t>(p)].fd == poll_fds_[i].fd)
      read_some(p);
  }
}

// Writes queued frames until the socket would block. False once the peer is lost.
bool TcpRemote::write_some(int p) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  while (peer.fd >= 0 && (!peer.sends.empty() || peer.bye_queued)) {
    iovec iov[2];
    int n_iov = 0;
    size_t total;
    Header h{};
    const bool bye = peer.sends.empty();
    Request* r = bye ? nullptr : &requests_[static_cast<size_t>(peer.sends.front())];
    size_t& sent = bye ? peer.bye_sent : peer.sent;
    if (bye) {
      h = peer.bye_header;
      total = kHeaderBytes;
    } else {
      h = Header{kData, r->tag, r->bytes};
      total = kHeaderBytes + r->bytes;
    }
    if (sent < kHeaderBytes)
      iov[n_iov++] = {reinterpret_cast<char*>(&h) + sent, kHeaderBytes - sent};
    if (!bye && r->bytes > 0) {
      const size_t body_sent = sent > kHeaderBytes ? sent - kHeaderBytes : 0;
      iov[n_iov++] = {const_cast<char*>(r->out) + body_sent, r->bytes - body_sent};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    const ssize_t n = sendmsg(peer.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      lose(p, detail::concat("lost: its connection failed on send (", std::strerror(errno), ")"),
           true);
      return false;
    }
    sent += static_cast<size_t>(n);
    if (sent < total) return true;
    sent = 0;
    if (bye) {
      peer.bye_queued = false;
      break;
    }
    const int s = peer.sends.front();
    peer.sends.pop_front();
    Request& done = requests_[static_cast<size_t>(s)];
    if (done.owned) {  // an anonymous copy (cancel)
      delete[] done.in;
      release(s);
    } else {
      done.done = true;
    }
  }
  return peer.fd >= 0;
}

// Reads frames until the socket would block, handing each whole message to its receive.
bool TcpRemote::read_some(int p) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  Inbound& in = peer.inbound;
  for (;;) {
    char* dst;
    size_t want;
    if (in.header_got < kHeaderBytes) {
      dst = reinterpret_cast<char*>(&in.header) + in.header_got;
      want = kHeaderBytes - in.header_got;
    } else {
      dst = (in.request >= 0 ? requests_[static_cast<size_t>(in.request)].in : in.kept.data()) +
            in.body_got;
      want = in.header.bytes - in.body_got;
    }
    ssize_t n = want == 0 ? 0 : recv(peer.fd, dst, want, MSG_DONTWAIT);
    if (want > 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n <= 0) {
        if (peer.said_bye && in.header_got == 0)
          lose(p, "left the group (closed its connection after a goodbye)", false);
        else
          lose(p,
               n == 0 ? std::string("lost: its connection closed without a goodbye (process "
                                    "ended or host lost)")
                      : detail::concat("lost: its connection failed (", std::strerror(errno), ")"),
               true);
        return false;
      }
    }
    if (in.header_got < kHeaderBytes) {
      in.header_got += static_cast<size_t>(n);
      if (in.header_got < kHeaderBytes) continue;
      if (in.header.kind == kBye) {
        peer.said_bye = true;
        in = Inbound{};
        continue;
      }
      if (in.header.kind != kData) {
        lose(p, detail::concat("lost: a frame that is not ubep's (kind ", in.header.kind, ")"),
             true);
        return false;
      }
      // The oldest receive posted for the tag takes it, if it is big enough; else keep it.
      in.request = -1;
      for (auto it = peer.posted.begin(); it != peer.posted.end(); ++it) {
        const Request& r = requests_[static_cast<size_t>(*it)];
        if (r.tag != in.header.tag) continue;
        if (r.capacity >= in.header.bytes) {
          in.request = *it;
          peer.posted.erase(it);
        }
        break;
      }
      if (in.request < 0) in.kept.resize(in.header.bytes);
      continue;
    }
    in.body_got += static_cast<size_t>(n);
    if (in.body_got == in.header.bytes) deliver(p);
  }
}

void TcpRemote::deliver(int p) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  Inbound& in = peer.inbound;
  if (in.request >= 0) {
    Request& r = requests_[static_cast<size_t>(in.request)];
    r.done = true;
    r.bytes = in.header.bytes;
  } else {
    // Kept: a receive posted meanwhile for the tag (none can be older) may take it now.
    bool taken = false;
    for (auto it = peer.posted.begin(); it != peer.posted.end(); ++it) {
      Request& r = requests_[static_cast<size_t>(*it)];
      if (r.tag != in.header.tag || r.capacity < in.kept.size()) continue;
      if (!in.kept.empty()) std::memcpy(r.in, in.kept.data(), in.kept.size());
      r.bytes = in.kept.size();
      r.done = true;
      peer.posted.erase(it);
      taken = true;
      break;
    }
    if (!taken) peer.unexpected.emplace_back(in.header.tag, std::move(in.kept));
  }
  in = Inbound{};
}

}  // namespace ubep::transport
