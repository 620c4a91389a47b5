// The set-up of a group whose hosts each run their own launcher (ubep/tcp_group.hpp): a Bootstrap
// over a TCP star through rank 0 (the rendezvous), and the mesh of sockets between ranks of
// different hosts that TcpRemote then carries the tokens on.
//
// Every wait is bounded by the group's timeout and, once the group watches deaths, asks the death
// check in slices of at most 10 ms, so a rank that never arrives is a TimeoutError naming it and a
// dead one a PeerFailedError. Used on the caller's thread only.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/death_check.hpp"
#include "ubep/bootstrap.hpp"
#include "ubep/tcp_group.hpp"

namespace ubep::bootstrap {

class TcpBootstrap final : public Bootstrap, public DeathAwareBootstrap {
 public:
  // Rank 0 listens on launch.rendezvous and accepts every other rank; the others connect to it
  // (retrying until it listens, within the timeout). keep_listener: rank 0 keeps the listening
  // socket for take_listener (a host's door for replacement hosts, issue 32); else it is closed.
  TcpBootstrap(const TcpLaunch& launch, std::chrono::milliseconds timeout,
               bool keep_listener = false);
  ~TcpBootstrap() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allgather(const void* in, void* out, size_t bytes) override;
  void barrier() override;
  // The launch's hosts: every launcher's ranks are one host, whatever their hostnames say.
  std::vector<int> host_map() override;
  void watch_deaths(const DeathCheck* deaths) override { deaths_ = deaths; }
  const TcpLaunch& launch() const { return launch_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const DeathCheck* deaths() const { return deaths_; }
  // Rank 0 with keep_listener: the rendezvous' listening socket, kept open for replacement
  // hosts (issue 32); the caller owns it from here (-1: none).
  int take_listener() { return std::exchange(listener_, -1); }

 private:
  TcpLaunch launch_;
  std::chrono::milliseconds timeout_;
  int rank_, size_;
  std::vector<int> fds_;  // rank 0: a socket per rank; others: fds_[0], the one to rank 0
  const DeathCheck* deaths_ = nullptr;
  int listener_ = -1;
};

// Connected stream sockets to every rank of the other hosts (-1 for host-mates and this rank):
// each rank listens on its host's address, the addresses go round in one allgather, the lower
// rank of each pair connects. Collective. The listener stays open (the caller owns it): a
// replacement host's ranks connect to it later (RejoinDoor, issue 32).
struct Mesh {
  std::vector<int> fds;
  std::vector<sockaddr_in> addrs;  // every rank's listening address
  int listener = -1;
};
Mesh connect_mesh(TcpBootstrap& boot, const std::vector<int>& host_of);

// Socket helpers of the set-up, shared with the rejoin of a replacement host (tcp_rejoin.cpp).
sockaddr_in parse_endpoint(const std::string& text, const char* what);
int listen_on(sockaddr_in addr);
int accept_one(int listener, std::chrono::steady_clock::time_point until, const char* what);
int connect_to(sockaddr_in addr, std::chrono::steady_clock::time_point until, int peer,
               const char* what);
in_addr own_ip(const sockaddr_in& rendezvous);
// Connects to every address at once (non-blocking connects polled together), each tried again
// every 10 ms while refused, all within `until`: a silent peer (a cut cable drops the SYNs)
// costs the bound once for all of them, not once each. fds[i]: the connected, blocking socket
// (TCP_NODELAY), or -1 when addrs[i] did not connect in time. Never throws for a peer.
// on_connect(i, fd), if given, runs as soon as addrs[i] connects (what the peer waits for, e.g. a
// hello, goes out then, not after the slowest connect); false: fd is closed and fds[i] is -1.
std::vector<int> connect_all(const std::vector<sockaddr_in>& addrs,
                             std::chrono::steady_clock::time_point until,
                             const std::function<bool(size_t, int)>& on_connect = {});

// Bounded, death-aware socket I/O for the set-up (blocking sockets, poll in slices).
void send_all(int fd, const void* data, size_t bytes, std::chrono::steady_clock::time_point until,
              const DeathCheck* deaths, int peer, const char* what);
void recv_all(int fd, void* data, size_t bytes, std::chrono::steady_clock::time_point until,
              const DeathCheck* deaths, int peer, const char* what);

}  // namespace ubep::bootstrap
