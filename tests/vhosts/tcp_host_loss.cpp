// A whole host lost under the TCP transport with one launcher per host (issue 32): every rank
// loops on ubep calls (each checked against the reference) until a call fails; tcp_host_loss.sh
// SIGKILLs every process of the last virtual host, or sets its cable down, in the middle. Each
// rank prints one line:
//   RESULT rank R host H calls N ms M ok|wrong|timeout: <error>
// with M the time from the fault (CLOCK_REALTIME nanoseconds in $UBEP_FAULT_FILE, written by the
// script just before the fault command) to the error. Then the survivor destroys its Buffer and
// group and exits 0: the process outlives the lost host (an MPI job over the hosts would not).
// "ok": a PeerFailedError naming the lost host; "echo": one naming a peer that failed the call
// first (it broke its buffer on naming the host); "wrong": any other error, or a wrong value.
// With UBEP_CALLS=N and no fault (netem_calls.sh): "clean" after N checked calls.
#include <gtest/gtest.h>

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

int64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

double ms_since_fault(int64_t at) {
  const char* path = std::getenv("UBEP_FAULT_FILE");
  for (int i = 0; path && i < 200; ++i) {
    std::ifstream f(path);
    int64_t t0 = 0;
    if (f >> t0 && t0 > 0) return static_cast<double>(at - t0) / 1e6;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// UBEP_MASK_HOST=1 (issue 32, item 2): the buffer masks dead ranks (BufferConfig::
// mask_dead_ranks), so the survivors go on without the lost host. Every call is checked bit for
// bit against the reference of the ranks it ran with (its experts' rows zero once masked): a call
// that mixed the lost host's data with a masked view fails the check. The survivor's line:
//   RESULT rank R host H calls N ms M ok: masked [ranks] after E failed calls, then C masked
//   calls right (first failure: <error>), fds A -> B
// ("wrong" too if the process holds more descriptors at the end (B) than before the fault (A)).
// with M the time from the fault to the end of its first masked call, after 600 masked calls
// ("wrong" if the masked ranks are not exactly the lost host's, or a value is wrong). A rank of
// the lost host itself (cut link) must stop with the partition error, never mask the others:
//   RESULT ... minority: <error>
// UBEP_KILL_ONE=1 (tcp_host_loss.sh kills only the last rank of the last host): nobody masks;
// every other rank stops with the named error of a partly lost host (its host-mate: "not a
// host-mate"), M the time from the kill to it:
//   RESULT ... partly: <error>
// The host the script makes fail: UBEP_VICTIM_HOST (0-based), else the last one. Host 0 too
// (issue 32: with 3 hosts or more the others go on without it, and a replacement rejoins).
int victim_host(const TcpLaunch& launch) {
  const char* v = std::getenv("UBEP_VICTIM_HOST");
  return v && *v ? std::atoi(v) : launch.hosts - 1;
}

std::vector<int> ranks_of_host(const TcpLaunch& launch, int host) {
  std::vector<int> out;
  for (int l = 0; l < launch.ranks_per_host; ++l) out.push_back(host * launch.ranks_per_host + l);
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {  // appended piecewise: GCC 12 -Wrestrict false positive (bug 105329)
    if (!s.empty()) s += ' ';
    s += std::to_string(r);
  }
  return "[" + s + "]";
}

// The survivor that writes the script's marker files: the first rank of the lowest other host.
bool marks(const TcpLaunch& launch) {
  return launch.local_rank == 0 && launch.host == (victim_host(launch) == 0 ? 1 : 0);
}

// The masking loops' cap: a correctness bound, not a timing target. Generous, so that a core
// starved by other work (the ranks pinned to one nice-19 core) slows the run but does not fail it.
constexpr auto kCap = std::chrono::seconds(60);

struct MaskRun {
  std::string verdict = "timeout", what = "no masked call within the cap (60 s)";
  int64_t done_at = 0;
};

int open_fds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += !e.is_directory();
  return n;
}

MaskRun mask_loop(Group& g, const TcpLaunch& launch, const Case& c,
                  const std::vector<Problem>& problems, Buffer& b, const char* ready, int& calls) {
  const std::vector<int> lost = ranks_of_host(launch, victim_host(launch));
  MaskRun run;
  std::string first;
  int failed = 0, masked_calls = 0, fds_before = -1;
  const auto until = std::chrono::steady_clock::now() + kCap;
  // 600 masked calls (about 2 s here): the script brings a cut link back after 1 s, and the
  // survivors must go on right (the cut-off side stays out: no split brain). A count, not a
  // time, so that every survivor makes its last call with the others.
  const auto enough = [&] { return masked_calls >= 600; };
  while (std::chrono::steady_clock::now() < until && !enough()) {
    // The inputs must be the same call on every rank, and the survivors' loops go out of step
    // at the fault (one may complete the call another fails): so one problem until the host is
    // masked (every rank's view is the same agreed one before each dispatch), then the others in
    // turn, counted in masked calls (no failure after the masking, so in step).
    const Problem& p = b.masked_ranks().empty()
                           ? problems[0]
                           : problems[1 + static_cast<size_t>(masked_calls) % 3];
    try {
      run_and_check(g, c, p, &b, nullptr, false,
                    [&] { return masked_problem(p, b.masked_ranks()); });
    } catch (const PeerFailedError& e) {
      const std::string what = e.what();
      if (what.find("partitioned") != std::string::npos) {
        run = {"minority", what, realtime_ns()};
        return run;
      }
      // One rank of the host killed alone (UBEP_KILL_ONE=1): its host-mates fail at once, the
      // other hosts once the grace for the rest of the host has passed; both named.
      if (what.find("is partly lost") != std::string::npos ||
          what.find("not a host-mate") != std::string::npos)
        return {"partly", what, realtime_ns()};
      if (first.empty()) first = what;
      if (++failed > 5) return {"wrong", "more than 5 failed calls: " + what, realtime_ns()};
      continue;
    } catch (const std::exception& e) {
      return {"wrong", e.what(), realtime_ns()};
    }
    if (::testing::Test::HasFailure()) return {"wrong", "a call returned a wrong value", 0};
    const std::vector<int> m = b.masked_ranks();
    if (!m.empty() && m != lost)
      return {"wrong", "masked ranks are not the lost host's: " + ranks_text(m), realtime_ns()};
    if (!m.empty() && masked_calls++ == 0) run.done_at = realtime_ns();
    if (++calls == 50) fds_before = open_fds();
    if (calls == 50 && marks(launch) && ready) std::ofstream(ready) << "ready\n";
    std::this_thread::sleep_for(std::chrono::microseconds(500));  // "compute"
  }
  if (!enough()) return run;
  const int fds_after = open_fds();
  std::string ranks;
  for (int r : lost) {
    if (!ranks.empty()) ranks += ' ';
    ranks += std::to_string(r);
  }
  run.verdict = fds_after <= fds_before ? "ok" : "wrong";
  run.what =
      detail::concat("masked [", ranks, "] after ", failed, " failed calls, then ", masked_calls,
                     " masked calls right (first failure: ", first.empty() ? "none" : first,
                     "), fds ", fds_before, " -> ", fds_after);
  return run;
}

// UBEP_REJOIN_HOST=1 (with UBEP_MASK_HOST=1, issue 32 item 2): after the survivors masked the
// lost host, tcp_host_loss.sh starts a replacement host (UBEP_REJOIN=1) in its namespace. The
// inputs must be the same call on every rank, and nobody knows at which call the replacement
// comes back: problem 0 until the host is masked, problem 1 while masked (so the call that takes
// the replacement in, chosen while masked, has problem 1 on every rank), then problems 1, 2, 3
// in turn counted from that call (the replacement counts from its first). Every call is checked
// against the reference of the ranks it ran with: masked, the lost host's experts give zeros;
// after the rejoin, the full result. A survivor's line:
//   RESULT ... ok: masked [ranks] after E failed calls, C masked calls right, back after
//   B ms (the replacement's launch -> end of its first full call), F full calls right, fds A -> B
// and a replacement's:
//   RESULT rank R host H calls N ms M ok: rejoined, F calls right, then group barriers and
//   allgathers right (every rank, after the rejoin: collectives_after_rejoin)
// with M the time from the replacement's launch ($UBEP_REJOIN_FILE) to the end of its first call.
constexpr int kFullCalls = 300;

double ms_since(const char* env, int64_t at) {
  const char* path = std::getenv(env);
  std::ifstream f(path ? path : "");
  int64_t t0 = 0;
  return f >> t0 && t0 > 0 ? static_cast<double>(at - t0) / 1e6 : -1;
}

// After a replacement host joined, the group's collectives go on over every rank (issue 32):
// a barrier, allgathers of 3 sizes (one past a 16 KiB chunk) checked byte for byte, a barrier.
std::string collectives_after_rejoin(Group& g) { return allgathers_right(g, {8, 1000, 40000}, 3); }

// Then a new Buffer made by every rank, the replacement's included (issue 32: its windows and
// config agreed over the mesh), and 20 calls of it checked against the reference. Empty when
// right, else what was wrong.
std::string new_buffer_right(Group& g, const Case& c, const std::vector<Problem>& problems) {
  try {
    Buffer fresh(g, config_for(c, Algorithm::kUbep));
    for (int j = 0; j < 20; ++j) {
      run_and_check(g, c, problems[static_cast<size_t>(j) % problems.size()], &fresh, nullptr);
      if (::testing::Test::HasFailure())
        return detail::concat("call ", j, " returned a wrong value");
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

MaskRun survive_and_rejoin(Group& g, const TcpLaunch& launch, const Case& c,
                           const std::vector<Problem>& problems, Buffer& b, const char* ready,
                           int& calls) {
  const std::vector<int> lost = ranks_of_host(launch, victim_host(launch));
  MaskRun run;
  std::string first;
  int phase = 0, failed = 0, masked_calls = 0, full = 0, fds_before = -1;
  int64_t back_at = 0;
  // A replacement with another config is refused: then 1,500 masked calls (a few seconds) end it.
  const char* other_env = std::getenv("UBEP_REJOIN_OTHER_CONFIG");
  const bool other = other_env && std::string(other_env) == "1";
  const auto done = [&] { return other ? masked_calls >= 1500 : full >= kFullCalls; };
  const auto until = std::chrono::steady_clock::now() + kCap;
  while (std::chrono::steady_clock::now() < until && !done()) {
    const Problem& p = phase == 0   ? problems[0]
                       : phase == 1 ? problems[1]
                                    : problems[1 + static_cast<size_t>(full) % 3];
    try {
      run_and_check(g, c, p, &b, nullptr, false,
                    [&] { return masked_problem(p, b.masked_ranks()); });
    } catch (const PeerFailedError& e) {
      // The cut-off host (link mode) stops as the minority of the partition; a replacement
      // host takes its place once the link is back.
      if (std::string(e.what()).find("partitioned") != std::string::npos)
        return {"minority", e.what(), realtime_ns()};
      if (phase == 2) return {"wrong", std::string("a call failed after the rejoin: ") + e.what()};
      if (first.empty()) first = e.what();
      if (++failed > 5) return {"wrong", "more than 5 failed calls: " + first, realtime_ns()};
      continue;
    } catch (const std::exception& e) {
      return {"wrong", e.what(), realtime_ns()};
    }
    if (::testing::Test::HasFailure()) return {"wrong", "a call returned a wrong value", 0};
    const std::vector<int> m = b.masked_ranks();
    if (!m.empty() && (m != lost || phase == 2))
      return {"wrong", "masked ranks are not the lost host's: " + ranks_text(m), realtime_ns()};
    if (!m.empty() && phase == 0) {
      phase = 1;
      run.done_at = realtime_ns();
      const char* masked = std::getenv("UBEP_MASKED_FILE");
      if (marks(launch) && masked) std::ofstream(masked) << "masked\n";
    }
    masked_calls += phase == 1 && !m.empty();
    if (m.empty() && phase == 1) {
      phase = 2;
      back_at = realtime_ns();
    }
    full += phase == 2;
    if (++calls == 50) fds_before = open_fds();
    if (calls == 50 && marks(launch) && ready) std::ofstream(ready) << "ready\n";
    std::this_thread::sleep_for(std::chrono::microseconds(500));  // "compute"
  }
  if (!done()) return {"timeout", detail::concat("phase ", phase, " after 60 s"), 0};
  // The group's barrier and allgather reach the replacement (over the mesh; docs/ELASTIC.md).
  if (!other) {
    const std::string wrong = collectives_after_rejoin(g);
    if (!wrong.empty())
      return {"wrong", "group collectives after the rejoin: " + wrong, realtime_ns()};
    // A new Buffer of every rank, the replacement's included (its windows over the mesh).
    const std::string fresh = new_buffer_right(g, c, problems);
    if (!fresh.empty()) return {"wrong", "a new Buffer after the rejoin: " + fresh, realtime_ns()};
  }
  const int fds_after = open_fds();
  std::string ranks;
  for (int r : lost) {
    if (!ranks.empty()) ranks += ' ';
    ranks += std::to_string(r);
  }
  run.verdict = fds_after <= fds_before ? "ok" : "wrong";
  run.what = detail::concat(
      "masked [", ranks, "] after ", failed, " failed calls, ", masked_calls,
      " masked calls right, ",
      other ? "the replacement refused (another config)"
            : detail::concat("back after ", ms_since("UBEP_REJOIN_FILE", back_at), " ms"),
      ", ", full, " full calls right (first failure: ", first.empty() ? "none" : first, "), fds ",
      fds_before, " -> ", fds_after);
  return run;
}

// The replacement host's rank: joins the live group, creates the same Buffer, serves.
MaskRun replacement(Group& g, const Case& c, const std::vector<Problem>& problems, Buffer& b) {
  MaskRun run;
  for (int j = 0; j < kFullCalls; ++j) {
    const Problem& p = problems[1 + static_cast<size_t>(j) % 3];
    try {
      run_and_check(g, c, p, &b, nullptr, false,
                    [&] { return masked_problem(p, b.masked_ranks()); });
    } catch (const std::exception& e) {
      return {"wrong", detail::concat("call ", j, ": ", e.what()), realtime_ns()};
    }
    if (::testing::Test::HasFailure()) return {"wrong", "a call returned a wrong value", 0};
    if (!b.masked_ranks().empty()) return {"wrong", "a replacement's call ran masked", 0};
    if (j == 0) run.done_at = realtime_ns();
    std::this_thread::sleep_for(std::chrono::microseconds(500));  // "compute"
  }
  const std::string wrong = collectives_after_rejoin(g);  // with the live ranks
  if (!wrong.empty())
    return {"wrong", "group collectives after the rejoin: " + wrong, realtime_ns()};
  const std::string fresh = new_buffer_right(g, c, problems);
  if (!fresh.empty()) return {"wrong", "a new Buffer after the rejoin: " + fresh, realtime_ns()};
  run.verdict = "ok";
  run.what = detail::concat("rejoined, ", kFullCalls,
                            " calls right, then group barriers and allgathers right, then a new "
                            "Buffer's calls right");
  return run;
}

int rank_main(int local_rank) {
  TcpLaunch launch = TcpLaunch::from_env(local_rank);
  launch.elastic = true;  // replacement hosts may come (every host keeps its door open)
  const int victim = victim_host(launch);
  GroupOptions opts;
  opts.timeout = std::chrono::seconds(5);
  std::unique_ptr<Group> g = make_tcp_group(launch, opts);
  // Each rank's pid, for a script that kills one rank alone (UBEP_KILL_ONE).
  if (const char* dir = std::getenv("UBEP_PID_DIR"))
    std::ofstream(detail::concat(dir, "/pid.", g->rank())) << getpid() << "\n";
  const auto [c, problems] = masked_host_problems(*g, launch.ranks_per_host, 900);
  const char* ready = std::getenv("UBEP_READY_FILE");
  std::string verdict = "timeout", what = "no error within 30 s";
  int64_t failed_at = 0;
  int calls = 0;
  const auto on = [](const char* v) {
    return std::getenv(v) && std::string(std::getenv(v)) == "1";
  };
  const bool mask = on("UBEP_MASK_HOST");
  double ms = -1;
  if (launch.rejoin || (mask && on("UBEP_REJOIN_HOST"))) {
    BufferConfig cfg = config_for(c, Algorithm::kUbep);
    cfg.mask_dead_ranks = true;
    // A replacement with another config (the refusal's test): a different capacity.
    if (launch.rejoin && on("UBEP_REJOIN_OTHER_CONFIG")) cfg.max_tokens_per_rank *= 2;
    MaskRun run;
    try {
      Buffer b(*g, cfg);
      run = launch.rejoin ? replacement(*g, c, problems, b)
                          : survive_and_rejoin(*g, launch, c, problems, b, ready, calls);
    } catch (const std::exception& e) {
      run = {"wrong", e.what(), realtime_ns()};
    }
    verdict = run.verdict;
    what = run.what;
    ms = run.done_at ? ms_since(launch.rejoin ? "UBEP_REJOIN_FILE" : "UBEP_FAULT_FILE", run.done_at)
                     : -1;
  } else if (mask) {
    BufferConfig cfg = config_for(c, Algorithm::kUbep);
    cfg.mask_dead_ranks = true;
    Buffer b(*g, cfg);
    const MaskRun run = mask_loop(*g, launch, c, problems, b, ready, calls);
    verdict = run.verdict;
    what = run.what;
    failed_at = run.done_at;
  } else {
    Buffer b(*g, config_for(c, Algorithm::kUbep));
    // UBEP_CALLS=N (netem_calls.sh: no fault, a slow and lossy link): N checked calls, then
    // "clean"; any error (a host declared dead included) ends the loop as below.
    const int max_calls = std::getenv("UBEP_CALLS") ? std::atoi(std::getenv("UBEP_CALLS")) : 0;
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + std::chrono::seconds(max_calls ? 600 : 30);
    while (std::chrono::steady_clock::now() < until) {
      if (max_calls && calls >= max_calls) {
        const std::chrono::duration<double, std::milli> took =
            std::chrono::steady_clock::now() - start;
        verdict = "clean";
        what = detail::concat(calls, " calls right, ", took.count() / calls, " ms per call");
        break;
      }
      try {
        run_and_check(*g, c, problems[static_cast<size_t>(calls) % problems.size()], &b, nullptr);
      } catch (const PeerFailedError& e) {
        failed_at = realtime_ns();
        what = e.what();
        const bool names_host =
            what.find("with host " + std::to_string(victim)) != std::string::npos ||
            (launch.host == victim && what.find("lost with host") != std::string::npos);
        // Or the echo of a survivor that named it first and broke its buffer (the script checks
        // that some survivor of the trial named the host).
        const bool echo = what.find("its buffer is broken") != std::string::npos;
        verdict = names_host ? "ok" : echo ? "echo" : "wrong";
        break;
      } catch (const std::exception& e) {
        failed_at = realtime_ns();
        what = e.what();
        verdict = "wrong";
        break;
      }
      if (::testing::Test::HasFailure()) {
        verdict = "wrong";
        what = "a completed call returned a wrong value";
        break;
      }
      if (++calls == 50 && marks(launch) && ready) std::ofstream(ready) << "ready\n";
      std::this_thread::sleep_for(std::chrono::microseconds(500));  // "compute"
    }
  }
  if (ms < 0 && failed_at) ms = ms_since_fault(failed_at);
  std::printf("RESULT rank %d host %d calls %d ms %.1f %s: %s\n", g->rank(), launch.host, calls, ms,
              verdict.c_str(), what.c_str());
  std::fflush(stdout);
  // A survivor that leaves at once is, to a host-mate still between calls, a rank that exited
  // ("rank 0 exited with status 0"), not the lost host: stay until every survivor has failed
  // its call (they all do within the bound), then go.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  g.reset();  // the group goes cleanly after the loss (bounded: the transport's linger)
  std::printf("EXIT rank %d clean\n", launch.rank());
  return 0;
}

}  // namespace
}  // namespace ubep::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return ubep::test::run_host_ranks(ubep::test::rank_main);
}
