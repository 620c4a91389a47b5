// Free ports on 127.0.0.1 for tests that launch a TCP group's hosts as local processes (issue 32:
// test_tcp_doors, test_tcp_two_buffers): the rendezvous and every host's door, probed so that
// no door meets another socket's port.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

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

}  // namespace ubep::test
