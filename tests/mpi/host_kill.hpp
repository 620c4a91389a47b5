// The victim's side of a whole-host kill (test_mpi_kill, test_mpi_kill_wait with
// UBEP_KILL[_WAIT]_WHOLE_HOST=1): a thread of the victim SIGKILLs its host-mates, then itself.
//
// Why the flag: between the mates' kill and its own, the victim's main thread can see a mate's
// death (its host's death watch) and, with the killing thread preempted on a busy machine, write
// a result of its own: a CI run of 76081e4 failed so ("rank 3 was to be killed but wrote a
// result"). The killing thread sets `started` before its first kill; the main thread checks it
// before writing anything. Ordering: the store is sequenced before the kill(2) calls, and the
// main thread can only fail because of a mate's death after the kernel ended that mate, i.e.
// after those calls returned; system calls order the store before them, so a main thread that
// failed from the kill reads `started` set and waits for its own SIGKILL instead of reporting.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace ubep_test {

inline std::atomic<bool>& host_kill_started() {
  static std::atomic<bool> started{false};
  return started;
}

// Kills `mates`, then the calling process; never returns. (Stopping the mates first, so that
// none could report another's death, made Open MPI 4.1's mpirun crash in its PMIx logging of
// the stopped process in a CI run of c5f0968; the drivers run one mate per host.)
[[noreturn]] inline void kill_host(const std::vector<pid_t>& mates) {
  host_kill_started().store(true, std::memory_order_seq_cst);
  for (pid_t p : mates) kill(p, SIGKILL);
  kill(getpid(), SIGKILL);
  for (;;) pause();
}

// Called by the main thread before it writes a result: if the victim's kill has begun, the
// result would be the victim's, so wait for the SIGKILL (bounded: 10 s, then end without one;
// the driver then reports that the victim wrote no result but was not killed in time either).
inline void hold_if_host_kill_started() {
  if (!host_kill_started().load(std::memory_order_seq_cst)) return;
  for (int i = 0; i < 1000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  _exit(3);
}

}  // namespace ubep_test
