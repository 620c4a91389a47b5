// Kill-host, cut-link and rejoin cycles in one live TCP group (issue 32, item 4; host_cycles.sh
// drives it, `ubep-elastic --hosts H --ranks-per-host R` runs that). The ranks of every host loop
// on checked ubep calls with mask_dead_ranks; per cycle the driver SIGKILLs every process of the
// cycle's victim host (victim.N: the last host by default, any host with --victim any, host 0
// included) or cuts its cable, the survivors mask it (a cut host's ranks stop as the minority of
// the partition and end; the cable comes back), the driver starts a replacement host there
// (UBEP_REJOIN=1), the survivors take it back. A host lost may be the replacement of an earlier
// cycle: a cut cable of it is named only by the heartbeat. Every process keeps one group and one
// Buffer through every cycle it lives, so descriptors and memory are measured across cycles, not
// per launch; a replacement is a survivor in the cycles after its own.
//
// The inputs must be the same call on every rank. Per cycle: phase B (full view, problem 0: the
// survivors' loops may go out of step at the fault, one completing a call another fails) until
// the host is masked; phase C (masked, problem 1: the call that takes the replacement in is
// chosen while masked) until it is back; phase A (full, problems 1, 2, 3 in turn, counted from
// that call; a replacement counts from its first) for kFull calls, then B again. Every call is
// checked bit for bit against the reference of the ranks it ran with.
//
// Files in $UBEP_CYCLE_DIR: victim.N (the driver's, for every cycle before the launch: the host
// lost in cycle N), ready.N (the marker rank in phase B of cycle N: the first rank of the lowest
// host that is not the victim), fault.N and launch.N (the driver's CLOCK_REALTIME ns), masked.N
// (the marker rank's first masked call of cycle N). Lines:
//   CYCLE n rank r masked_ms X back_ms Y fds F failed_ms Z pid P
//       (a survivor, at the end of cycle n's phase A; Z: fault -> its first failed call before
//       it ran masked, -1: none; a call failed later, while the replacement is taken in, is a
//       rejoin's, not the fault's detection)
//   PARTITIONED n rank r ms M       (a cut-off rank: fault -> its partition error; then it ends)
//   SERVED n rank r ms M                             (a replacement, its first call's end)
//   RESULT rank r ok|wrong: ...                      then EXIT rank r clean
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../elastic/elastic_case.hpp"
#include "group_checks.hpp"
#include "harness.hpp"
#include "host_launcher.hpp"
#include "ubep/error.hpp"
#include "ubep/tcp_group.hpp"

namespace ubep::test {
namespace {

constexpr int kFull = 100;  // full calls per cycle after the rejoin

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string dir_file(const std::string& name, int n) {
  const char* d = std::getenv("UBEP_CYCLE_DIR");
  return std::string(d ? d : "/tmp") + "/" + name + "." + std::to_string(n);
}

double ms_after(const std::string& file, int64_t at) {
  std::ifstream f(file);
  int64_t t0 = 0;
  return f >> t0 && t0 > 0 ? static_cast<double>(at - t0) / 1e6 : -1;
}

int open_fds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += !e.is_directory();
  return n;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The host lost in cycle n (victim.n, written by the driver before the launch; the last host
// when there is none).
int victim_of(int n, const TcpLaunch& launch) {
  std::ifstream f(dir_file("victim", n));
  int v = -1;
  return f >> v && v >= 0 && v < launch.hosts ? v : launch.hosts - 1;
}

struct Loop {
  Group& g;
  const TcpLaunch& launch;
  const Case& c;
  const std::vector<Problem>& problems;
  Buffer& b;
  std::vector<int> lost;  // the ranks of this cycle's victim host
  bool marker = false;    // this rank writes this cycle's ready / masked files

  void start_cycle(int n) {
    const int v = victim_of(n, launch);
    lost.clear();
    for (int l = 0; l < launch.ranks_per_host; ++l) lost.push_back(v * launch.ranks_per_host + l);
    marker = launch.local_rank == 0 && launch.host == (v == 0 ? 1 : 0);
  }

  bool is_lost(int rank) const { return std::find(lost.begin(), lost.end(), rank) != lost.end(); }

  // Runs until `cycles` cycles are done (a replacement: from cycle `first`, in phase A).
  std::string run(int first, int cycles) {
    char phase = launch.rejoin ? 'A' : 'B';
    int cycle = first, k = 0, in_b = 0, failed = 0;
    start_cycle(cycle);
    int64_t masked_at = 0, back_at = 0, failed_at = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15 * cycles + 30);
    while (std::chrono::steady_clock::now() < until) {
      const Problem& p = phase == 'B'   ? problems[0]
                         : phase == 'C' ? problems[1]
                                        : problems[1 + static_cast<size_t>(k) % 3];
      try {
        run_and_check(g, c, p, &b, nullptr, false,
                      [&] { return masked_problem(p, b.masked_ranks()); });
      } catch (const PeerFailedError& e) {
        // A cut-off host (link cycles) stops as the minority of the partition, and ends.
        if (std::strstr(e.what(), "partitioned")) {
          std::printf("PARTITIONED %d rank %d ms %.1f\n", cycle, g.rank(),
                      ms_after(dir_file("fault", cycle), now_ns()));
          return detail::concat("partitioned: cycle ", cycle, ": ", e.what());
        }
        // A rank of the victim host sees its host-mates die first (the driver's SIGKILLs land
        // one after another) and rightly fails: it is being killed, so it waits for its own
        // SIGKILL instead of reporting; one the driver never kills is named.
        if (phase == 'B' && is_lost(g.rank()) && std::strstr(e.what(), "not a host-mate")) {
          std::this_thread::sleep_for(std::chrono::seconds(10));
          return detail::concat("wrong: cycle ", cycle, ": rank ", g.rank(),
                                " of the victim host was not killed within 10 s of: ", e.what());
        }
        if (phase == 'A' || ++failed > 5 * cycles)
          return detail::concat("wrong: cycle ", cycle, " phase ", phase, ": ", e.what());
        if (!failed_at && phase == 'B') failed_at = now_ns();
        continue;
      }
      if (::testing::Test::HasFailure())
        return detail::concat("wrong: cycle ", cycle, ": a call returned a wrong value");
      const std::vector<int> m = b.masked_ranks();
      if (!m.empty() && m != lost)
        return detail::concat("wrong: cycle ", cycle, ": masked ranks are not the lost host's");
      if (phase == 'A' && !m.empty())
        return detail::concat("wrong: cycle ", cycle, ": masked again in phase A");
      if (phase == 'B' && !m.empty()) {
        phase = 'C';
        masked_at = now_ns();
        if (marker) std::ofstream(dir_file("masked", cycle)) << "masked\n";
      } else if (phase == 'C' && m.empty()) {
        phase = 'A';
        back_at = now_ns();
        k = 0;
      }
      if (phase == 'A') {
        if (launch.rejoin && k == 0 && cycle == first)
          std::printf("SERVED %d rank %d ms %.1f\n", cycle, g.rank(),
                      ms_after(dir_file("launch", cycle), now_ns()));
        if (++k == kFull) {
          if (!launch.rejoin || cycle != first)  // a survivor of this cycle
            std::printf(
                "CYCLE %d rank %d masked_ms %.1f back_ms %.1f fds %d failed_ms %.1f pid %d\n",
                cycle, g.rank(), ms_after(dir_file("fault", cycle), masked_at),
                ms_after(dir_file("launch", cycle), back_at), open_fds(),
                failed_at ? ms_after(dir_file("fault", cycle), failed_at) : -1.0,
                static_cast<int>(getpid()));
          std::fflush(stdout);
          if (cycle == cycles) return "ok";
          start_cycle(++cycle);
          phase = 'B';
          in_b = 0;
          failed_at = 0;
        }
      } else if (phase == 'B' && ++in_b == 20 && marker) {
        std::ofstream(dir_file("ready", cycle)) << "ready\n";
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));  // "compute"
    }
    return detail::concat("wrong: timed out in cycle ", cycle, " phase ", phase);
  }
};

int rank_main(int local_rank) {
  TcpLaunch launch = TcpLaunch::from_env(local_rank);
  launch.elastic = true;  // replacement hosts may come (every host keeps its door open)
  GroupOptions opts;
  opts.timeout = std::chrono::seconds(5);
  std::string verdict;
  {
    std::unique_ptr<Group> g = make_tcp_group(launch, opts);
    const auto [c, problems] = masked_host_problems(*g, launch.ranks_per_host, 900);
    BufferConfig cfg = config_for(c, Algorithm::kUbep);
    cfg.mask_dead_ranks = true;
    try {
      Buffer b(*g, cfg);
      Loop loop{*g, launch, c, problems, b, {}};
      verdict = loop.run(launch.rejoin ? env_int("UBEP_CYCLE", 1) : 1, env_int("UBEP_CYCLES", 1));
    } catch (const std::exception& e) {
      verdict = std::string("wrong: ") + e.what();
    }
    std::printf("RESULT rank %d %s\n", launch.rank(), verdict.c_str());
    std::fflush(stdout);
    // Every rank ends with the same call; a host-mate leaving at once would look like a death
    // to one still between calls: wait, then go.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  std::printf("EXIT rank %d clean\n", launch.rank());
  return 0;
}

}  // namespace
}  // namespace ubep::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return ubep::test::run_host_ranks(ubep::test::rank_main);
}
