// Free ports on 127.0.0.1 (and the reaping of their rank processes) for tests that launch a TCP
// group's hosts as local processes (issue 32: test_tcp_doors, test_tcp_two_buffers): the rendezvous
// and every host's door, probed so that no door meets another socket's port.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ubep/tcp_group.hpp"

namespace ubep::test {

// "Hosts" here are processes of one machine, over loopback: their heartbeats share one kernel's
// network stack, where datagrams were measured held up to 99 ms under the test suite's load
// (docs/ELASTIC.md, "A lost host"), past the default 60 ms threshold (an ASan CI run of 58de464:
// TcpTwoBuffers' host 0 judged both others lost). These tests check behaviour, not detection
// time: 250 ms, set before any rank forks (an explicit setting in the environment wins). Under
// ctest it is set already (cmake/test_environment.cmake); this covers the binaries run by hand.
inline const int kSharedKernelHeartbeat = setenv("UBEP_HOST_HEARTBEAT", "10,250", 0);

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

// One byte from the ranks' ready pipe, bounded. The parent holds the pipe's write end itself
// (later ranks inherit it), so a rank that dies before writing never gives EOF: without the
// bound, a failed rank hung the test (CI, stop 45). Empty once read; else why not: a rank that
// ended (not one of `may_end`, the ranks the test killed), named with its status, or the cap.
inline std::string await_ready(int fd, const std::vector<pid_t>& ranks,
                               const std::vector<size_t>& may_end, const std::string& what) {
  const auto cap = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < cap) {
    pollfd p{fd, POLLIN, 0};
    char c;
    if (poll(&p, 1, 100) == 1 && read(fd, &c, 1) == 1) return "";
    for (size_t r = 0; r < ranks.size(); ++r) {
      bool killed = false;
      for (size_t k : may_end) killed |= k == r;
      siginfo_t info{};  // WNOWAIT: left for the reaping below
      if (!killed &&
          waitid(P_PID, static_cast<id_t>(ranks[r]), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == ranks[r])
        return what + ": process " + std::to_string(r) + " ended (" +
               (info.si_code == CLD_EXITED ? "exit " : "signal ") + std::to_string(info.si_status) +
               ") before it was ready";
    }
  }
  return what + ": nothing after 120 s";
}

// Waits for `pid` up to `cap`, then SIGKILLs it (a hung rank must not hang the test, nor outlive
// it); its status, and whether it had to be killed.
inline int reap_within(pid_t pid, std::chrono::steady_clock::time_point cap, bool& hung) {
  int status = 0;
  hung = false;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= cap) {
      hung = true;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

// Ends every rank of a test that failed early (SIGKILL, reaped): none outlives the test.
inline void end_ranks(const std::vector<pid_t>& ranks) {
  for (pid_t pid : ranks) kill(pid, SIGKILL);
  for (pid_t pid : ranks) waitpid(pid, nullptr, 0);
}

// Reaps the rank processes of a 3 x 2 test whose host 2 (ranks 4 and 5) the test SIGKILLed:
// those two must have died by a signal, every other rank and each replacement (listed after the
// first 6) must have exited 0, all within 120 s (the ranks' own calls are capped far below).
inline void expect_host2_killed_others_passed(const std::vector<pid_t>& ranks) {
  const auto cap = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (size_t i = 0; i < ranks.size(); ++i) {
    bool hung = false;
    const int status = reap_within(ranks[i], cap, hung);
    EXPECT_FALSE(hung) << "process " << i << " still ran after 120 s: killed";
    if (i == 4 || i == 5) {
      EXPECT_TRUE(WIFSIGNALED(status)) << "host 2's rank " << i << " was not killed";
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << (i < 6 ? "rank " : "replacement rank ") << (i < 6 ? i : i - 2) << ": status " << status;
  }
}

}  // namespace ubep::test
