// The set-up of a replacement host in a TCP group (issue 32; src/bootstrap/tcp_rejoin.*): it asks
// the other hosts' doors for the group, and every connect of the set-up is bounded, so a door or
// rank that never answers costs the bound, not the kernel's SYN retries.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <thread>

#include <chrono>
#include <string>
#include <vector>

#include "bootstrap/tcp_bootstrap.hpp"
#include "group_checks.hpp"
#include "loopback_ports.hpp"
#include "ubep/error.hpp"
#include "ubep/tcp_group.hpp"

namespace ubep {
namespace {

// A base port P below the kernel's ephemeral range (32768-60999 by default) with P, P+1, P+2,
// P+100 and P+200 free on 127.0.0.1: the kernel never hands these to another test's socket, so a
// door asked here is nobody's. Fixed ports at 39411+ were inside that range, and an ASan CI run
// (d6213a6) met a concurrent test's socket on one of them: the replacement's ask reached it and
// timed out instead of finding no door.
int free_door_base() {
  for (int base = 28411; base < 32000; base += 300) {
    bool all_free = true;
    std::vector<int> held;
    for (int port : {base, base + 1, base + 2, base + 100, base + 200}) {
      sockaddr_in at{};
      at.sin_family = AF_INET;
      at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      at.sin_port = htons(static_cast<uint16_t>(port));
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      held.push_back(fd);
      all_free &= fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0;
    }
    for (int fd : held)
      if (fd >= 0) close(fd);
    if (all_free) return base;
  }
  return 0;
}

std::string at(int port) { return "127.0.0.1:" + std::to_string(port); }

// Host 0 of 2 is refused (nobody is left once it is lost), a malformed host list is named, and
// with no door answering the error names every door it asked, well within the timeout.
TEST(TcpGroupSetUp, AReplacementNamesTheDoorsItAsked) {
  const int p = free_door_base();
  ASSERT_NE(p, 0) << "no free base port below the ephemeral range on 127.0.0.1";
  TcpLaunch l;
  l.rendezvous = at(p);
  l.hosts = 2;
  l.host = 0;
  l.rejoin = true;
  GroupOptions opts;
  opts.timeout = std::chrono::seconds(5);
  try {
    make_tcp_group(l, opts);
    ADD_FAILURE() << "host 0 of 2 replaced";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("host 0 of 2 cannot be replaced"), std::string::npos)
        << e.what();
  }
  l.hosts = 3;
  l.host_ips = {"127.0.0.1", "no-ip", "127.0.0.1"};
  try {
    make_tcp_group(l, opts);
    ADD_FAILURE() << "a malformed host list accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("host 1's 'no-ip'"), std::string::npos) << e.what();
  }
  l.host_ips.clear();  // on loopback every host's door is known: ports p + 1, p + 2
  const auto t0 = std::chrono::steady_clock::now();
  try {
    make_tcp_group(l, opts);
    ADD_FAILURE() << "joined without a live host";
  } catch (const PeerFailedError& e) {
    EXPECT_NE(std::string(e.what()).find("asked " + at(p + 1) + ", " + at(p + 2)),
              std::string::npos)
        << e.what();
  }
  // Named within the doors' retry window (2 s, tcp_rejoin.cpp kDoorWindow) and one pass of
  // connect bounds, well before the group's 5 s timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  // Door ports passed in the launch (not the rendezvous' port + host): asked there; a list of
  // the wrong length, or a host 0 entry that is not the rendezvous', is named.
  l.door_ports = {0, p + 100, p + 200};
  try {
    make_tcp_group(l, opts);
    ADD_FAILURE() << "joined without a live host";
  } catch (const PeerFailedError& e) {
    EXPECT_NE(std::string(e.what()).find("asked " + at(p + 100) + ", " + at(p + 200)),
              std::string::npos)
        << e.what();
  }
  l.door_ports = {p, p + 100};
  EXPECT_THROW(make_tcp_group(l, opts), InvalidArgument);
  l.door_ports = {1234, p + 100, p + 200};
  try {
    make_tcp_group(l, opts);
    ADD_FAILURE() << "host 0's door port other than the rendezvous' accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("host 0's door port 1234"), std::string::npos) << e.what();
  }
}

// A peer that never answers a connect: a listener whose accept queue is full drops new SYNs
// (as a cut cable does), so a blocking connect would wait for the kernel's retries (1 s, 3 s, ...
// minutes). connect_to must give up at its bound with a TimeoutError naming the peer.
TEST(TcpGroupSetUp, AConnectToASilentPeerEndsAtItsBound) {
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
  ASSERT_EQ(listen(listener, 0), 0);
  socklen_t len = sizeof at;
  getsockname(listener, reinterpret_cast<sockaddr*>(&at), &len);
  // Fill the accept queue (never accepted): the first connects complete, later SYNs are dropped.
  std::vector<int> fill;
  for (int i = 0; i < 4; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof at);
    fill.push_back(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const int fd = bootstrap::connect_to(at, t0 + std::chrono::milliseconds(300), 7, "a test");
    close(fd);
    ADD_FAILURE() << "connected to a full backlog";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("connecting to rank 7"), std::string::npos) << e.what();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(290));
  EXPECT_LT(took, std::chrono::milliseconds(900));  // the kernel's first SYN retry is at 1 s
  for (int fd : fill) close(fd);
  close(listener);
}

// A replacement connects to every rank of the other hosts (issue 32): all at once, so silent
// peers (a cut host's ranks) cost one connect bound together, not one each. Here 2 silent peers
// (full backlogs), 1 refusing (a port bound but not listening) and 1 live listener: the live one
// is connected (blocking, a byte goes through), the others are -1, and the whole call ends at
// its one bound, well before the 3 bounds the connects one after another took.
TEST(TcpGroupSetUp, ConnectAllCostsOneBoundForEverySilentPeer) {
  const auto bound_listener = [](int backlog, bool listening) {
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
    if (listening) {
      EXPECT_EQ(listen(fd, backlog), 0);
    }
    socklen_t len = sizeof at;
    getsockname(fd, reinterpret_cast<sockaddr*>(&at), &len);
    return std::make_pair(fd, at);
  };
  std::vector<int> fill, own;
  std::vector<sockaddr_in> addrs;
  for (int s = 0; s < 2; ++s) {  // silent: the accept queue filled, later SYNs dropped
    auto [fd, at] = bound_listener(0, true);
    own.push_back(fd);
    addrs.push_back(at);
    for (int i = 0; i < 4; ++i) {
      const int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      connect(c, reinterpret_cast<sockaddr*>(&at), sizeof at);
      fill.push_back(c);
    }
  }
  auto [refuser, refused_at] = bound_listener(0, false);
  auto [live, live_at] = bound_listener(8, true);
  own.push_back(refuser);
  own.push_back(live);
  addrs.push_back(refused_at);
  addrs.push_back(live_at);
  const auto bound = std::chrono::milliseconds(300);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> fds = bootstrap::connect_all(addrs, t0 + bound);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(fds.size(), 4u);
  EXPECT_EQ(fds[0], -1);
  EXPECT_EQ(fds[1], -1);
  EXPECT_EQ(fds[2], -1);
  ASSERT_GE(fds[3], 0);
  EXPECT_EQ(fcntl(fds[3], F_GETFL) & O_NONBLOCK, 0);
  const int peer = accept(live, nullptr, nullptr);
  ASSERT_GE(peer, 0);
  char b = 42, got = 0;
  EXPECT_EQ(send(fds[3], &b, 1, 0), 1);
  EXPECT_EQ(recv(peer, &got, 1, 0), 1);
  EXPECT_EQ(got, 42);
  EXPECT_GE(took, bound - std::chrono::milliseconds(10));
  EXPECT_LT(took, 3 * bound - std::chrono::milliseconds(50));  // one after another: >= 3 bounds
  close(peer);
  close(fds[3]);
  for (int fd : fill) close(fd);
  for (int fd : own) close(fd);
}

// ---- a host replaced on loopback, then the group's barrier and allgather (issue 32) -------------

// One rank's process (3 hosts x 2 on 127.0.0.1): its exit status, 0 when every check held.
// Host 2's ranks wait to be killed; the survivors then call barrier() until it passes (each
// failure must name host 2's ranks), the replacement host joins, and all 6 check collectives.
int rank_process(const std::vector<int>& ports, int host, int local, bool rejoin, int ready,
                 int go) {
  const int me = host * 2 + local;
  try {
    const TcpLaunch l = test::loopback_launch(ports, 3, host, 2, local, rejoin);
    GroupOptions opts;
    opts.timeout = std::chrono::seconds(5);
    std::unique_ptr<Group> g = make_tcp_group(l, opts);
    std::string wrong = rejoin ? "" : test::allgathers_right(*g, {8, 40000}, 0);
    if (!rejoin) {
      char c = 'r';
      if (!wrong.empty() || write(ready, &c, 1) != 1)
        return std::fprintf(stderr, "rank %d: %s\n", me, wrong.c_str()), 3;
      if (host == 2) pause();  // SIGKILLed here
      if (read(go, &c, 1) != 1) return 4;
      std::string first;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      for (bool done = false; !done;) {
        try {
          g->barrier();
          done = true;
        } catch (const PeerFailedError& e) {
          if (first.empty()) first = e.what();
          if (std::chrono::steady_clock::now() > until) return 5;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      }
      if (first.find("rank 4") == std::string::npos && first.find("rank 5") == std::string::npos)
        return std::fprintf(stderr, "rank %d: the first failure names no rank of host 2: %s\n", me,
                            first.c_str()),
               6;
    } else {
      g->barrier();  // the survivors' barrier that passes
    }
    wrong = test::allgathers_right(*g, {8, 40000}, 1);  // 40,000: 3 chunks
    if (!wrong.empty()) return std::fprintf(stderr, "rank %d: %s\n", me, wrong.c_str()), 7;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", me, e.what());
    return 2;
  }
}

pid_t fork_rank(const std::vector<int>& ports, int host, int local, bool rejoin, int ready,
                int go) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int rc = rank_process(ports, host, local, rejoin, ready, go);
    std::fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

// The loopback twin of vhosts_tcp_host_rejoin's collectives (no namespaces needed): 3 launchers'
// worth of ranks on 127.0.0.1, host 2 SIGKILLed, the survivors' barriers fail named until a
// replacement host 2 joins, then barrier and allgather of all 6 ranks are right.
TEST(TcpGroupRejoin, GroupCollectivesAfterAHostIsReplaced) {
  const std::vector<int> ports = test::free_ports(3);  // the rendezvous, then hosts 1 and 2's doors
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> ranks;
  for (int r = 0; r < 6; ++r)
    ranks.push_back(fork_rank(ports, r / 2, r % 2, false, ready[1], go[0]));
  std::string wrong;
  for (int r = 0; r < 6 && wrong.empty(); ++r)
    wrong = test::await_ready(ready[0], ranks, {}, "the first collectives");
  if (!wrong.empty()) {
    test::end_ranks(ranks);
    for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);
    FAIL() << wrong;
  }
  for (int r = 4; r < 6; ++r) kill(ranks[static_cast<size_t>(r)], SIGKILL);
  for (int r = 0; r < 4; ++r) ASSERT_EQ(write(go[1], "g", 1), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // their barriers fail meanwhile
  for (int r = 4; r < 6; ++r) ranks.push_back(fork_rank(ports, 2, r % 2, true, ready[1], go[0]));
  test::expect_host2_killed_others_passed(ranks);
  for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);
}

}  // namespace
}  // namespace ubep
