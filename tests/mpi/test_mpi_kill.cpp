// kill -9 of a rank in the middle of a call (run by test_mpi_kill.sh under mpirun with recovery
// enabled, so the job outlives the rank). Usage: test_mpi_kill <dir> <bsp|ubep> <timeout_ms>
//
// Every rank writes its pid to <dir>/pid.<rank> (the driver checks /dev/shm for its segments),
// then runs checked dispatch+combine calls. The last rank starts a thread that SIGKILLs the
// process after a few milliseconds of calls, so the kill lands inside a call. Each survivor
// writes <dir>/result.<rank>: the error its failing call raised, how long that call took, and
// how long the next call on the broken buffer took. The driver asserts on those; a survivor
// that hangs writes nothing and the driver's own timeout reports it.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "host_kill.hpp"
#include "reference.hpp"
#include "ubep/error.hpp"
#include "ubep/mpi_group.hpp"

namespace {

using namespace ubep;
using Clock = std::chrono::steady_clock;

// The victim's kill time (<dir>/kill_at, written just before its kill), waited for up to 1 s;
// the epoch if it never came (then the call's start counts).
Clock::time_point kill_time(const std::string& dir) {
  for (int i = 0; i < 100; ++i) {
    std::ifstream in(dir + "/kill_at");
    long long ns = 0;
    if (in >> ns && ns > 0) return Clock::time_point(std::chrono::nanoseconds(ns));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Clock::time_point();
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

const char* error_kind(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const PeerFailedError*>(&e)) return "PeerFailedError";
  if (dynamic_cast<const BrokenBufferError*>(&e)) return "BrokenBufferError";
  if (dynamic_cast<const InvalidArgument*>(&e)) return "InvalidArgument";
  return "other";
}

// One dispatch + identity-like expert + combine; the combine output checked against the
// reference (so the calls before the kill are real, correct calls).
bool call_and_check(Buffer& b, const test::Problem& p, int me, Layout layout) {
  const test::RankInput& in = p.inputs[static_cast<size_t>(me)];
  const DispatchResult r = b.dispatch(in.args(p.dtype, p.hidden, layout));
  std::vector<float> out(static_cast<size_t>(r.recv_x.numel()));
  const int El = b.num_local_experts();
  const int64_t rows_per_expert = layout == Layout::kLatency ? r.recv_x.dim(1) : r.recv_x.dim(0);
  for (int64_t i = 0; i < r.recv_x.numel(); ++i) {
    const int64_t which =
        layout == Layout::kLatency ? me * El + i / (rows_per_expert * p.hidden) : me;
    out[static_cast<size_t>(i)] = test::expert_fn(r.recv_x.as<const float>()[i], which);
  }
  CombineArgs ca;
  ca.handle = r.handle;
  ca.x = r.recv_x;
  ca.x.data = out.data();
  const TensorView y = b.combine(ca);
  const std::vector<float> want = test::expected_combine(p, me, layout);
  return std::memcmp(y.data, want.data(), want.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s <dir> <bsp|ubep> <timeout_ms> [ranks_per_host]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const Algorithm algo = parse_algorithm(argv[2]);
  const int timeout_ms = std::stoi(argv[3]);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int me = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::ofstream(dir + "/pid." + std::to_string(me)) << getpid() << "\n";

  GroupOptions opts;
  opts.timeout = std::chrono::milliseconds(timeout_ms);
  if (argc == 5) opts.ranks_per_host = std::stoi(argv[4]);  // forced hosts: TCP between them
  auto group = make_mpi_group(MPI_COMM_WORLD, opts);
  BufferConfig cfg;
  cfg.max_tokens_per_rank = 8;
  cfg.hidden = 16;
  cfg.dtype = DType::kFP32;
  cfg.num_experts = 2 * ranks;
  cfg.max_topk = 2;
  cfg.algorithm = algo;
  cfg.num_workers = 0;
  Buffer buffer(*group, cfg);
  const std::vector<int64_t> tokens(static_cast<size_t>(ranks), 8);
  const test::Problem p = test::make_problem(ranks, cfg.num_experts, cfg.hidden, cfg.dtype, tokens,
                                             2, test::Routing::kUniform, 42);
  // Agree that set-up is done, so the kill lands in a call, not in set-up.
  MPI_Barrier(MPI_COMM_WORLD);

  const bool victim = me == ranks - 1;
  if (victim) {
    // UBEP_KILL_WHOLE_HOST=1 (issue 32): every rank of the victim's host is killed with it (pids
    // from <dir>/pid.*, all written before the barrier above): nobody is left to forward.
    std::vector<pid_t> mates;
    for (int r = 0; std::getenv("UBEP_KILL_WHOLE_HOST") && r < ranks - 1; ++r)
      if (group->host_of(r) == group->host_of(me)) {
        std::ifstream in(dir + "/pid." + std::to_string(r));
        pid_t pid = 0;
        if (in >> pid) mates.push_back(pid);
      }
    std::thread([mates, dir] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      // When the kill came (steady_clock: CLOCK_MONOTONIC, one clock for every process of the
      // machine and its namespaces), for the survivors' time to their error.
      std::ofstream(dir + "/kill_at")
          << std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
                 .count()
          << "\n";
      ubep_test::kill_host(mates);
    }).detach();
  }
  std::string result = "none";
  for (long i = 0; i < 10000000; ++i) {
    const Layout layout = i % 2 ? Layout::kLatency : Layout::kThroughput;
    const auto t0 = Clock::now();
    try {
      if (!call_and_check(buffer, p, me, layout)) {
        result = "wrong-result " + std::to_string(i);
        break;
      }
    } catch (const std::exception& e) {
      // From the kill, or from the call's start if it began after the kill: a call that began
      // before it may have waited long for a starved victim (8 busy loops on the 2 cores made
      // such calls last 1-2.6 s), which is no part of the time to name the death.
      const double failing_ms = ms_since(std::max(t0, kill_time(dir)));
      // The buffer is broken now: the next call must fail at once, without waiting.
      const auto t1 = Clock::now();
      std::string next = "none";
      try {
        call_and_check(buffer, p, me, layout);
      } catch (const std::exception& e2) {
        next = error_kind(e2);
      }
      char line[768];
      std::string what = e.what();
      for (char& c : what)
        if (c == '\n') c = ' ';
      std::snprintf(line, sizeof line, "%s %.1f %s %.1f calls=%ld %.500s", error_kind(e),
                    failing_ms, next.c_str(), ms_since(t1), i, what.c_str());
      result = line;
      std::fprintf(stderr, "rank %d: call %ld failed after %.1f ms: %s\n", me, i, failing_ms,
                   e.what());
      break;
    }
  }
  ubep_test::hold_if_host_kill_started();  // the victim's own result: never written
  std::ofstream(dir + "/result." + std::to_string(me)) << result << "\n";
  // No MPI_Finalize: it would wait for the dead rank. The driver judges the result files.
  std::fflush(nullptr);
  _exit(0);
}
