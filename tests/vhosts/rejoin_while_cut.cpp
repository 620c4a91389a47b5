// A replacement host joins while another host is cut off (issue 32; rejoin_while_cut.sh drives
// it). HOSTS >= 3 virtual hosts of RANKS ranks, one TCP group with mask_dead_ranks. With K the
// last host and C the one before it, the driver:
//   1. SIGKILLs every process of K: the others mask K           (masked set {K})
//   2. cuts C's cable and keeps it down: C is one host of the H-1 live at the last agreement, so
//      it is the minority (3 hosts: a tie without host 0) and its ranks stop with the partition
//      error; the others mask C too                            ({K, C})
//   3. starts K's replacement while C is still cut off: it asks host 0's door for the group, its
//      connects to C's ranks end at their bound, so C is lost to it from the start; it joins the
//      live ranks, and its first call already runs with C masked ({C})
//   4. once the live ranks made 50 calls with it (C still cut), brings C's cable back; C's old
//      ranks are gone by then; starts C's replacement; everyone serves in full ({})
// So the rule (docs/ELASTIC.md, partitions): only the side with a majority of the hosts live at
// the last agreement (at a tie, the side with the lowest of them) goes on; a replacement joins
// that side whatever the state of the cut host, never the cut-off one, and no call mixes views.
//
// Every rank walks the masked sets above in order (stage 0..4; a replacement starts at its own
// stage) and fails the run on any other; every call is checked bit for bit against the reference
// of the ranks it ran with (masked hosts' experts give zeros). The inputs of a call must be the
// same on every rank that makes it: stages 0-3 use one problem each (a call that moves to the
// next stage, agreed, uses the stage's before it, and a replacement's first call is that call),
// stage 4 rotates 3 problems counted from the call that entered it. Calls may fail (named) only
// before stage 4: around the two faults, and where a rank leaves a call to agree on taking a
// replacement ("left call N to agree on a change of the group"), 10 at most. In stage 4, after
// kFull calls, every rank checks the group's barrier and allgathers (over the mesh, with both
// replacements), then a new Buffer made by every rank (issue 32: its windows and config agreed over
// the mesh) and kNewCalls calls of it.
//
// Files in $UBEP_WORK: ready (after 20 calls of stage 0), stage.N (the marker rank, host 0's
// first, at its first call of stage N), stage3.calls (after 50 calls of stage 3); kill, cut,
// launch.K, launch.C (the driver's CLOCK_REALTIME ns). Each rank prints:
//   RESULT rank R host H ok|wrong|minority: <what>           then   EXIT rank R clean
//   TIMES rank R stage S ms M     (entering stage S: M ms after the fault or launch behind it)
#include <gtest/gtest.h>

#include <cstring>
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

constexpr int kFull = 60;      // full calls of stage 4 before the group checks
constexpr int kNewCalls = 30;  // calls of the Buffer made after both replacements

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string work_file(const std::string& name) {
  const char* d = std::getenv("UBEP_WORK");
  return std::string(d ? d : "/tmp") + "/" + name;
}

double ms_after(const std::string& name, int64_t at) {
  std::ifstream f(work_file(name));
  int64_t t0 = 0;
  return f >> t0 && t0 > 0 ? static_cast<double>(at - t0) / 1e6 : -1;
}

std::vector<int> ranks_of(const TcpLaunch& l, std::initializer_list<int> hosts) {
  std::vector<int> out;
  for (int h : hosts)
    for (int i = 0; i < l.ranks_per_host; ++i) out.push_back(h * l.ranks_per_host + i);
  std::sort(out.begin(), out.end());
  return out;
}

std::string text(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {  // appended piecewise: GCC 12 -Wrestrict false positive (bug 105329)
    if (!s.empty()) s += ' ';
    s += std::to_string(r);
  }
  return "[" + s + "]";
}

struct Run {
  Group& g;
  const TcpLaunch& launch;
  const Case& c;
  const std::vector<Problem>& problems;
  int killed, cut;  // hosts K and C

  // The masked ranks of each stage, and what each stage's entry is timed from.
  std::vector<int> masked_in(int stage) const {
    switch (stage) {
      case 1:
        return ranks_of(launch, {killed});
      case 2:
        return ranks_of(launch, {killed, cut});
      case 3:
        return ranks_of(launch, {cut});
      default:
        return {};
    }
  }
  static const char* timed_from(int stage) {
    static const char* from[] = {"", "kill", "cut", "launch.K", "launch.C"};
    return from[stage];
  }
  const Problem& problem(int stage, int k) const {
    return stage == 0 ? problems[0] : stage < 4 ? problems[1] : problems[1 + k % 3];
  }
  bool marker() const { return launch.host == 0 && launch.local_rank == 0; }

  // Runs from `stage` to the end of stage 4; "" when every call was right, else "wrong: ..." or
  // "minority: ..." (the cut-off host's ranks).
  std::string loop(Buffer& b, int stage) {
    int k = 0, failed = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(40);
    while (std::chrono::steady_clock::now() < until) {
      const Problem& p = problem(stage, k);
      try {
        run_and_check(g, c, p, &b, nullptr, false,
                      [&] { return masked_problem(p, b.masked_ranks()); });
      } catch (const PeerFailedError& e) {
        if (std::strstr(e.what(), "partitioned"))
          return detail::concat(launch.host == cut ? "minority: " : "wrong: ", e.what());
        // A rank of host K sees its host-mates die first (the SIGKILLs land one after another)
        // and rightly fails: it is being killed, so it waits for its SIGKILL, not reporting.
        if (stage == 0 && launch.host == killed && !launch.rejoin &&
            std::strstr(e.what(), "not a host-mate")) {
          std::this_thread::sleep_for(std::chrono::seconds(10));
          return detail::concat("wrong: rank ", g.rank(), " of host ", killed,
                                " was not killed within 10 s of: ", e.what());
        }
        if (stage == 4 || ++failed > 10)
          return detail::concat("wrong: stage ", stage, ": ", e.what());
        continue;
      }
      if (::testing::Test::HasFailure())
        return detail::concat("wrong: stage ", stage, ": a call returned a wrong value");
      const std::vector<int> m = b.masked_ranks();
      if (m != masked_in(stage)) {
        if (stage == 4 || m != masked_in(stage + 1))
          return detail::concat("wrong: stage ", stage, ": masked ", text(m));
        ++stage;
        k = 0;
        std::printf("TIMES rank %d stage %d ms %.1f\n", g.rank(), stage,
                    ms_after(timed_from(stage), now_ns()));
        if (marker()) std::ofstream(work_file(detail::concat("stage.", stage))) << "in\n";
      }
      ++k;
      if (marker() && stage == 0 && k == 20) std::ofstream(work_file("ready")) << "ready\n";
      if (marker() && stage == 3 && k == 50) std::ofstream(work_file("stage3.calls")) << "50\n";
      if (stage == 4 && k == kFull) return "";
      std::this_thread::sleep_for(std::chrono::microseconds(500));  // "compute"
    }
    return detail::concat("wrong: stage ", stage, " not done within 40 s");
  }

  // After both replacements: the group's collectives, then a new Buffer of every rank.
  std::string after(const BufferConfig& cfg) {
    std::string wrong = allgathers_right(g, {8, 1000, 40000}, 7);
    if (!wrong.empty()) return "wrong: group collectives: " + wrong;
    try {
      Buffer fresh(g, cfg);
      for (int j = 0; j < kNewCalls; ++j) {
        run_and_check(g, c, problems[static_cast<size_t>(j) % problems.size()], &fresh, nullptr);
        if (::testing::Test::HasFailure())
          return detail::concat("wrong: the new Buffer's call ", j, " returned a wrong value");
      }
    } catch (const std::exception& e) {
      return std::string("wrong: the new Buffer: ") + e.what();
    }
    return "";
  }
};

int rank_main(int local_rank) {
  TcpLaunch launch = TcpLaunch::from_env(local_rank);
  launch.elastic = true;
  GroupOptions opts;
  opts.timeout = std::chrono::seconds(5);
  std::string verdict;
  {
    std::unique_ptr<Group> g = make_tcp_group(launch, opts);
    const auto [c, problems] = masked_host_problems(*g, launch.ranks_per_host, 700);
    BufferConfig cfg = config_for(c, Algorithm::kUbep);
    cfg.mask_dead_ranks = true;
    Run run{*g, launch, c, problems, launch.hosts - 1, launch.hosts - 2};
    // Originals start at stage 0; K's replacement joins in stage 3, C's in stage 4.
    const int first = !launch.rejoin ? 0 : launch.host == run.killed ? 3 : 4;
    try {
      Buffer b(*g, cfg);
      verdict = run.loop(b, first);
      if (verdict.empty()) verdict = run.after(cfg);
      if (verdict.empty())
        verdict = detail::concat("ok: stages ", first, "..4 right, then group collectives and ",
                                 kNewCalls, " calls of a new Buffer right");
    } catch (const std::exception& e) {
      verdict = std::string("wrong: ") + e.what();
    }
    std::printf("RESULT rank %d host %d %s\n", launch.rank(), launch.host, verdict.c_str());
    std::fflush(stdout);
    // A host-mate leaving at once would look like a death to one still between calls.
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
