// The set-up of a replacement host in a TCP group (issue 32; src/bootstrap/tcp_rejoin.*): it asks
// the other hosts' doors for the group, and every connect of the set-up is bounded, so a door or
// rank that never answers costs the bound, not the kernel's SYN retries.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "bootstrap/tcp_bootstrap.hpp"
#include "ubep/error.hpp"
#include "ubep/tcp_group.hpp"

namespace ubep {
namespace {

// Host 0 of 2 is refused (nobody is left once it is lost), a malformed host list is named, and
// with no door answering the error names every door it asked, well within the timeout.
TEST(TcpGroupSetUp, AReplacementNamesTheDoorsItAsked) {
  TcpLaunch l;
  l.rendezvous = "127.0.0.1:39411";
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
  l.host_ips.clear();  // on loopback every host's door is known: ports 39412, 39413
  const auto t0 = std::chrono::steady_clock::now();
  try {
    make_tcp_group(l, opts);
    ADD_FAILURE() << "joined without a live host";
  } catch (const PeerFailedError& e) {
    EXPECT_NE(std::string(e.what()).find("asked 127.0.0.1:39412, 127.0.0.1:39413"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
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

}  // namespace
}  // namespace ubep
