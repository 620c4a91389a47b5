// Liveness of other hosts without their help (issue 32; docs/ELASTIC.md, "A lost host"): a host
// whose processes are all gone, or whose cable is cut, has nobody left to forward its deaths
// (DeathNotices), so every other host must notice the silence by itself.
//
// Mechanism: one UDP socket and one thread per HostHeartbeat. Every `period` the thread sends a
// 16-byte datagram {magic, host, seq} to every peer host, and it drains whatever datagrams have
// arrived before it judges anyone: a host is lost once no datagram from it has arrived for
// `threshold` (before its first datagram: for `startup_grace`). Because the socket is drained
// first, a late wake-up of *this* thread (a loaded machine) cannot make a live host look silent:
// the datagrams sent meanwhile wait in the socket buffer. Only a sender that was silent longer
// than the threshold counts. Nor can a stall of this host's own (a VM descheduled with all its
// virtual hosts, a stopped process): time this thread did not run is not counted as anyone's
// silence (run()). Detection time is threshold + at most one period + scheduling (+ any own stall).
// A heartbeat runs per rank, and a rank is judged as part of its machine (start()'s group_of): it
// is lost once it *and every rank of its machine* have been silent past the threshold. A rank
// whose machine-mates still beat is not a lost host (its own death is the mates' to tell:
// DeathNotices); and a sender that did not run for a while (its vCPU stolen by the hypervisor, a
// page fault behind I/O) no longer names its whole machine lost while a mate of it beats.
//
// Side channel, not the data transport: UDP over the hosts' own network, so it works whatever
// carries the data (MPI, UCX) and however that transport reacts to the loss.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ubep::bootstrap {

class HostHeartbeat {
 public:
  struct Options {
    std::chrono::milliseconds period{10};
    std::chrono::milliseconds threshold{60};
    std::chrono::milliseconds startup_grace{3000};
    // This rank's, in every beat (a replacement's is its predecessor's + 1).
    uint32_t incarnation = 0;
  };
  struct Peer {
    int host = -1;   // 0..hosts-1, not this host
    std::string ip;  // IPv4, dotted
    uint16_t port = 0;
  };
  // on_lost(host, silent_for) runs on the heartbeat thread, once per lost host.
  using LostFn = std::function<void(int host, std::chrono::nanoseconds silent_for)>;

  // Binds a UDP socket to bind_ip:port (port 0: the kernel picks; see port()). hosts >= 2.
  HostHeartbeat(int self_host, int hosts, const std::string& bind_ip, uint16_t port, Options opt);
  // Stops the thread (within one period), says goodbye to the peers (a clean end is not a lost
  // host), closes the socket.
  ~HostHeartbeat();
  HostHeartbeat(const HostHeartbeat&) = delete;
  HostHeartbeat& operator=(const HostHeartbeat&) = delete;

  uint16_t port() const { return port_; }
  // Stops beating without a goodbye, as a crash would (tests; the owner's thread only).
  void go_silent();
  // Starts the thread. Once only; peers: every other host once. group_of (by host, values in
  // [0, hosts), or empty: every host its own group): the machine each host runs on; a host is
  // judged lost only once no heard, live host of its group has beaten within the threshold.
  void start(const std::vector<Peer>& peers, LostFn on_lost, std::vector<int> group_of = {});
  // Acquire load, any thread: true once `host` was judged lost (before on_lost runs).
  bool lost(int host) const;
  // `host` is no longer judged (issue 32: a replacement took its place, and a late verdict on
  // the old one would name the new one lost). Any thread. Returns once a verdict under way (its
  // on_lost included) has completed; none comes after: the thread claims a verdict and runs
  // on_lost under the same mutex, and skips a host forgotten meanwhile.
  void forget(int host);
  // `host` is judged again, now at ip:port with `incarnation` (issue 32: a replacement host was
  // taken; its loss, a cut cable included, is then named as fast as the first one). Any thread.
  // forget()s the predecessor at once; the heartbeat thread applies the rest at its next turn
  // (under verdict_mu_): it beats to the new address, and it judges the host afresh, with the
  // start-up grace until a beat of that incarnation (or a later one) arrives. Beats of older
  // incarnations (a late goodbye of the predecessor) are ignored from then on.
  void rearm(int host, const std::string& ip, uint16_t port, uint32_t incarnation);
  // Acquire load, any thread: true once a datagram from `host` has arrived (ever).
  bool heard(int host) const;
  // Relaxed, any thread: how many times this thread found itself stalled (not run for more than
  // two periods) and discounted that time from the peers' silence (see run()).
  uint64_t own_stalls() const { return stalls_.load(std::memory_order_relaxed); }

 private:
  struct Rearm {
    int host;
    sockaddr_in to;
    uint32_t incarnation;
  };
  void run();
  void apply_rearms(std::chrono::steady_clock::time_point now);
  void send_beats(uint32_t seq);
  void drain(std::chrono::steady_clock::time_point now);
  void find_vouched(std::chrono::steady_clock::time_point now);
  void discount_own_stall(std::chrono::steady_clock::duration since_last_turn,
                          std::chrono::steady_clock::time_point now);

  int self_;
  int hosts_;
  Options opt_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::vector<sockaddr_in> to_;  // by peer index
  std::vector<int> peer_host_;   // by peer index
  std::vector<int> index_of_;    // by host: peer index or -1
  // Written and read by the heartbeat thread only (after start(), which runs before it exists).
  std::vector<std::chrono::steady_clock::time_point> last_seen_;
  std::vector<bool> departed_;             // said goodbye (a clean end): never judged lost
  std::vector<uint32_t> min_incarnation_;  // by peer index: older beats are a predecessor's
  std::vector<int> group_of_;              // by host (set in start())
  std::vector<char> vouched_;              // by group: a host of it beat within the threshold
  // Written by the heartbeat thread (release), read by any thread (acquire); by host.
  std::unique_ptr<std::atomic<bool>[]> lost_;
  std::unique_ptr<std::atomic<bool>[]> heard_;
  std::atomic<bool> stop_{false};
  bool silent_ = false;              // go_silent() ran: no goodbye (owner's thread only)
  std::atomic<bool> rt_{false};      // the thread runs SCHED_FIFO (written once by it)
  std::atomic<uint64_t> stalls_{0};  // written by the heartbeat thread only
  LostFn on_lost_;
  std::mutex verdict_mu_;      // a verdict (lost_ set + on_lost) vs forget() and rearm()
  std::vector<Rearm> rearms_;  // under verdict_mu_: rearm() adds, the heartbeat thread applies
  std::thread thread_;
};

}  // namespace ubep::bootstrap
