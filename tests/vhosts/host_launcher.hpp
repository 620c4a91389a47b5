// The launcher of one host for groups with one launcher per host (ubep/tcp_group.hpp): forks
// UBEP_RANKS_PER_HOST ranks, each running fn(local_rank) and exiting with its result; returns the
// worst exit status (128 + signal for a killed rank). scripts/vhosts.sh launch runs one per host.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace ubep::test {

inline int run_host_ranks(const std::function<int(int local_rank)>& fn) {
  const char* env = std::getenv("UBEP_RANKS_PER_HOST");
  const int ranks = env ? std::atoi(env) : 0;
  if (ranks < 1) {
    std::fprintf(stderr, "UBEP_RANKS_PER_HOST is not set (run under scripts/vhosts.sh launch)\n");
    return 2;
  }
  std::fflush(nullptr);
  std::vector<pid_t> kids;
  for (int l = 0; l < ranks; ++l) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int rc = fn(l);
      std::fflush(nullptr);
      _exit(rc);
    }
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    kids.push_back(pid);
  }
  int worst = 0;
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc > worst) worst = rc;
  }
  return worst;
}

}  // namespace ubep::test
