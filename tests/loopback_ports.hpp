// Free ports on 127.0.0.1 (and the reaping of their rank processes) for tests that launch a TCP
// group's hosts as local processes (issue 32: test_tcp_doors, test_tcp_two_buffers): the rendezvous
// and every host's door, probed so that no door meets another socket's port.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "ubep/tcp_group.hpp"

namespace ubep::test {

// n distinct free ports on 127.0.0.1 (all held while probing, so none comes twice).
inline std::vector<int> free_ports(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fds.push_back(socket(AF_INET, SOCK_STREAM, 0));
    bind(fds.back(), reinterpret_cast<sockaddr*>(&at), sizeof at);
    socklen_t len = sizeof at;
    getsockname(fds.back(), reinterpret_cast<sockaddr*>(&at), &len);
    ports.push_back(ntohs(at.sin_port));
  }
  for (int fd : fds) close(fd);
  return ports;
}

// An elastic launch of host `host`'s rank `local` on 127.0.0.1: ports[0] the rendezvous, every
// host's door from `ports` (probed: no door meets another socket's port).
inline TcpLaunch loopback_launch(const std::vector<int>& ports, int hosts, int host,
                                 int ranks_per_host, int local, bool rejoin) {
  TcpLaunch l;
  l.rendezvous = "127.0.0.1:" + std::to_string(ports[0]);
  l.door_ports = ports;
  l.hosts = hosts;
  l.host = host;
  l.ranks_per_host = ranks_per_host;
  l.local_rank = local;
  l.elastic = true;
  l.rejoin = rejoin;
  return l;
}

// Reaps the rank processes of a 3 x 2 test whose host 2 (ranks 4 and 5) the test SIGKILLed:
// those two must have died by a signal, every other rank and each replacement (listed after the
// first 6) must have exited 0.
inline void expect_host2_killed_others_passed(const std::vector<pid_t>& ranks) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    int status = 0;
    waitpid(ranks[i], &status, 0);
    if (i == 4 || i == 5) {
      EXPECT_TRUE(WIFSIGNALED(status)) << "host 2's rank " << i << " was not killed";
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << (i < 6 ? "rank " : "replacement rank ") << (i < 6 ? i : i - 2) << ": status " << status;
  }
}

}  // namespace ubep::test
