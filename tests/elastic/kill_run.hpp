// SIGKILL in a decode loop on forked process ranks (docs/ELASTIC.md): the machinery behind
// test_elastic_kill and tools/elastic (ubep-elastic). The parent forks the ranks (no launcher, so
// a killed rank does not end the job); every rank runs dispatch + combine calls on one Buffer
// with mask_dead_ranks; the victims kill themselves at a chosen call and phase. Every completed
// call is checked on its rank against a reference each rank computes on its own: every rank's
// routing and rows derive from (rank, call), so a survivor knows what each live source sent, and
// the values are small integers times powers of two, so combine's sums are exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ubep::elastic {

enum class KillPhase {
  kBefore,   // at the start of the call, before dispatch
  kDuring,   // from a thread of the victim a few microseconds into dispatch (send or receive)
  kReceive,  // after dispatch_send, before dispatch_recv (its rows are out, it never receives)
  kBetween,  // after dispatch returned, before combine
  kStop,     // SIGSTOP, not SIGKILL: slow, not dead (the parent resumes it with SIGCONT)
};
const char* phase_name(KillPhase p);
KillPhase parse_phase(const std::string& s);

struct Victim {
  int rank = 1;
  int at_call = 5;  // iteration index
  KillPhase phase = KillPhase::kBefore;
  // Once it is dead, start a replacement process for its rank (make_rejoin_group); with
  // kill_replacement_at >= 0 the replacement is killed too, at that call of its own loop.
  bool replace = false;
  int kill_replacement_at = -1;
};

struct RunOptions {
  int ranks = 4;
  int calls = 20;   // dispatch + combine iterations per rank
  int tokens = 16;  // per rank
  int hidden = 256;
  int experts_per_rank = 2;
  int topk = 3;
  int timeout_ms = 5000;  // the group's timeout
  int stop_ms = 0;        // kStop: how long the victim stays stopped
  int pace_us = 0;        // "compute" between iterations (a decode step's expert work)
  std::vector<Victim> victims;
  std::string elastic_name;  // set by run_kill_loop when a victim is replaced
};

struct RankReport {
  int completed = 0;     // calls (dispatch + combine) that returned
  int failed = 0;        // calls that threw PeerFailedError
  int wrong = 0;         // values that differ from the reference (must be 0)
  int other_errors = 0;  // anything else thrown (TimeoutError, ...)
  int masked_calls = 0;  // completed dispatches with a masked rank
  int tail_failed = 0;   // errors once peers finish and leave (survivors: the last 3 iterations)
  int full_calls_after_kill = 0;  // completed dispatches after the kill with no rank masked
  double first_error_us = -1;     // from the first kill to this rank's first error
  double first_masked_us = -1;    // from the first kill to its first completed masked dispatch
  double first_after_us = -1;     // from the first kill to its first dispatch completed after it
  double watch_cpu_us = -1;       // CPU time of the death watch's thread over the rank's life
  double run_us = 0;              // the rank's life, from set-up to the end of its loop
  double first_call_us = -1;      // replacement: from its start to its first completed dispatch
  int final_masked = -1;          // masked ranks at the last completed dispatch before the tail
  bool died = false;              // a victim (killed as planned)
  int exit_signal = 0;
  char first_error[200] = {};
  char last_error[200] = {};
};

struct RunResult {
  std::vector<RankReport> ranks;
  std::vector<RankReport> replacements;  // one per replaced victim, in victims' order
  std::string error;                     // set-up failures
  // What this run left in /dev/shm after its processes ended: ubep-<pid>-* of its pids, and its
  // rendezvous (ubep-rdv-<elastic name>); names there before the run are not counted.
  std::vector<std::string> leftover_names;
  std::vector<int> pids;  // ranks, then replacements: whose names leftover_names are
  int leftover_segments() const { return static_cast<int>(leftover_names.size()); }
};

// Forks opt.ranks processes and runs the loop; returns when all have ended.
RunResult run_kill_loop(const RunOptions& opt);

// Names /dev/shm/ubep-* right now: with `pids`, only ubep-<pid>-* of those pids that no live
// process holds now. The pids are of ended (reaped) processes, and with pid_max 32768 a
// concurrent test's process (ctest -j) can be given one of them and make its own segments
// under it (ubep-elastic beside the MPI tests).
std::vector<std::string> shm_segments(const std::vector<int>& pids = {});

}  // namespace ubep::elastic
