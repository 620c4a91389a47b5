// Failure semantics on thread ranks (docs/RELIABILITY.md): one rank skips, rejects or throws;
// its peers stop with an error naming it and the call; the Buffer is broken for everyone (error,
// never data); a fresh Buffer works. Also: mismatched calls, null pointers, config rejected on
// one rank, a survivor's CPU while it waits, and a stress test of the failure words.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <barrier>
#include <random>
#include <thread>

#include "expect_invalid.hpp"
#include "fault_scenario.hpp"
#include "harness.hpp"
#include "ubep/baseline.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"
#ifdef UBEP_TEST_HAVE_MOE
#include "ubep/moe.hpp"
#endif

namespace ubep::test {
namespace {

// Outside-the-library collectives for the scenario: a std::barrier and an "or" over ranks.
struct ThreadSync {
  explicit ThreadSync(int ranks) : barrier(ranks) {}
  std::barrier<> barrier;
  std::atomic<bool> any{false};
  std::function<void()> sync() {
    return [this] { barrier.arrive_and_wait(); };
  }
  std::function<bool(bool)> any_rank() {
    return [this](bool v) {
      if (v) any = true;
      barrier.arrive_and_wait();
      const bool out = any.load();
      barrier.arrive_and_wait();
      return out;
    };
  }
};

struct FaultParam {
  Algorithm algo;
  Fault fault;
  int ranks;
};

class OneRankFails : public ::testing::TestWithParam<FaultParam> {};

TEST_P(OneRankFails, PeersNameItLaterCallsAreBrokenFreshBufferWorks) {
  const FaultParam fp = GetParam();
  GroupOptions opts;
  // A skipped call is only seen by the timeout; published failures must beat a long one.
  opts.timeout = timed(fp.fault) ? std::chrono::milliseconds(400 * test_time_scale())
                                 : std::chrono::milliseconds(20000);
  ThreadSync ts(fp.ranks);
  const int victim = fp.ranks - 2;  // 0 with 2 ranks, a middle rank with 3
  const Layout layout = fp.ranks == 3 ? Layout::kLatency : Layout::kThroughput;
  run_on_threads(
      fp.ranks,
      [&](Group& g) {
        run_fault_scenario(g, fp.algo, fp.fault, victim, layout, ts.sync(), ts.any_rank());
      },
      opts);
}

std::vector<FaultParam> fault_params() {
  std::vector<FaultParam> ps;
  for (Algorithm a : {Algorithm::kBsp, Algorithm::kUbep})
    for (Fault f : {Fault::kSkip, Fault::kRejectDispatch, Fault::kRejectCombine, Fault::kThrow})
      for (int r : {2, 3}) ps.push_back({a, f, r});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(All, OneRankFails, ::testing::ValuesIn(fault_params()), [](const auto& i) {
  return std::string(algorithm_name(i.param.algo)) + "_" + fault_name(i.param.fault) + "_" +
         std::to_string(i.param.ranks);
});

// Ranks that pass different layouts to the same call: every rank gets an error naming the rank
// that differs (not wrong rows), and the buffer stays usable (the call completed everywhere).
TEST(MismatchedCall, LayoutDifferenceIsNamedOnEveryRank) {
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
    Case c = fault_case(3, Layout::kThroughput);
    const Problem p = all_ranks_problem(c, 3, 5);
    run_on_threads(3, [&](Group& g) {
      Buffer b(g, config_for(c, algo));
      const Layout mine = g.rank() == 2 ? Layout::kLatency : Layout::kThroughput;
      try {
        b.dispatch(p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, mine));
        ADD_FAILURE() << "mismatched layouts accepted";
      } catch (const InvalidArgument& e) {
        // Rank 2 differs from both others (either may be named); ranks 0 and 1 name rank 2.
        const std::string msg = e.what();
        const bool named = g.rank() == 2 ? contains(msg, "dispatch: rank 0 made") ||
                                               contains(msg, "dispatch: rank 1 made")
                                         : contains(msg, "dispatch: rank 2 made");
        EXPECT_TRUE(named) << msg;
        EXPECT_TRUE(contains(msg, "a different call (layout or placement)")) << msg;
      }
      run_and_check(g, c, p, &b, nullptr);  // still usable, right data
    });
  }
}

// The case the test above missed (issue 22): two ranks, one throughput and one latency, with the
// default placement (so compact against per-source too), plain and split-phase, both ways round,
// after good calls. Every rank names the other long before the timeout; the Buffer stays usable.
TEST(MismatchedCall, ThroughputAgainstLatencyNamedPromptlyBufferUsable) {
  GroupOptions opts;
  opts.timeout = std::chrono::milliseconds(4000 * test_time_scale());
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep})
    for (bool split : {false, true}) {
      if (split && algo != Algorithm::kUbep) continue;
      for (int ranks : {2, 3})
        for (int latency_rank = 0; latency_rank < ranks; ++latency_rank)
          run_on_threads(
              ranks,
              [&](Group& g) {
                run_mismatch_scenario(g, algo, latency_rank, split,
                                      std::chrono::milliseconds(1000 * test_time_scale()));
              },
              opts);
    }
}

// A peer that breaks in the next call (here: its combine, call 2, times out while this rank is
// still in call 1) had already sent its part of this one: this rank's dispatch (call 1) still
// completes with the right rows, and its next call fails at once naming the peer and the call it
// broke in (the failure word carries it). Whether a wait that was still spinning when the word
// appeared would stop is the rule FailureWords (test_failure_words.cpp) checks; the fuzzer hit
// that race before the word carried the call.
TEST(PeerBrokeInTheNextCall, ThisCallStillCompletes) {
  for (Layout layout : {Layout::kLatency, Layout::kThroughput}) {
    const Case c = fault_case(2, layout);
    const Problem p = all_ranks_problem(c, 2, 9);
    std::barrier<> sync(2);
    GroupOptions opts;
    opts.timeout = std::chrono::milliseconds(300 * test_time_scale());
    run_on_threads(
        2,
        [&](Group& g) {
          Buffer b(g, config_for(c, Algorithm::kUbep));
          const DispatchArgs args =
              p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout);
          if (g.rank() == 0) {
            const DispatchResult r = b.dispatch(args);  // call 1: rank 1's rows were sent
            // call 2: rank 1 is not there yet, so this times out and breaks the buffer
            EXPECT_THROW(b.combine({r.recv_x, r.handle}), TimeoutError);
            sync.arrive_and_wait();
            return;
          }
          b.dispatch_send(args);
          sync.arrive_and_wait();  // rank 0's buffer is broken (in call 2) by now
          const DispatchResult r = b.dispatch_recv();
          const ExpectedDispatch exp = expected_dispatch(p, 1);
          const auto* counts = r.recv_count.as<const int64_t>();
          for (size_t e = 0; e < exp.expert_rows.size(); ++e)
            EXPECT_EQ(counts[e], static_cast<int64_t>(exp.expert_rows[e].size())) << e;
          try {
            b.combine({r.recv_x, r.handle});  // call 2, the call rank 0 broke in
            ADD_FAILURE() << "combine on a buffer whose peer broke returned";
          } catch (const PeerFailedError& e) {
            EXPECT_TRUE(contains(e.what(), "rank 0 failed call 2")) << e.what();
          }
          try {
            b.combine({r.recv_x, r.handle});
            ADD_FAILURE() << "combine on a broken buffer returned";
          } catch (const BrokenBufferError& e) {
            EXPECT_TRUE(contains(e.what(), "rank 0's buffer broke (it failed call 2)")) << e.what();
          }
        },
        opts);
  }
}

// Null pointers in every public entry: InvalidArgument naming the argument (every rank passes
// the same bad call, so the buffer stays usable).
TEST(NullPointers, EveryEntryNamesTheArgument) {
  Case c = fault_case(2, Layout::kLatency);
  const Problem p = all_ranks_problem(c, 2, 6);
  run_on_threads(2, [&](Group& g) {
    Buffer b(g, config_for(c, Algorithm::kUbep));
    AlltoallBaseline base(g, config_for(c, Algorithm::kBsp));
    const DispatchArgs good =
        p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout);
    for (const char* name : {"x", "topk_idx", "topk_weights"}) {
      DispatchArgs a = good;
      TensorView& v = std::string(name) == "x"          ? a.x
                      : std::string(name) == "topk_idx" ? a.topk_idx
                                                        : a.topk_weights;
      v.data = nullptr;
      expect_invalid([&] { b.dispatch(a); }, std::string(name) + " has no data");
      expect_invalid([&] { base.dispatch(a); }, std::string(name) + " has no data");
    }
    DispatchResult r = b.dispatch(good);
    CombineArgs ca{r.recv_x, r.handle};
    ca.x.data = nullptr;
    expect_invalid([&] { b.combine(ca); }, "combine: x has no data");
    ca = {r.recv_x, r.handle};
    ca.topk_weights = good.topk_weights;
    ca.topk_weights.data = nullptr;
    expect_invalid([&] { b.combine(ca); }, "combine: topk_weights");
    DispatchResult rb = base.dispatch(good);
    CombineArgs cb{rb.recv_x, rb.handle};
    cb.x.data = nullptr;
    expect_invalid([&] { base.combine(cb); }, "combine: x has no data");
    run_and_check(g, c, p, &b, nullptr);  // still usable
    EXPECT_NE(b.compact().data, nullptr);
  });
}

#ifdef UBEP_TEST_HAVE_MOE
// The moe executor: every pointer it reads is checked before any is read.
TEST(ExpertLayerNull, EveryPointerIsNamed) {
  Case c = fault_case(2, Layout::kThroughput);
  const Problem p = all_ranks_problem(c, 2, 9);
  run_on_threads(2, [&](Group& g) {
    Buffer b(g, config_for(c, Algorithm::kUbep));
    moe::ExpertLayerConfig lc;
    lc.max_tokens_per_rank = c.capacity;
    lc.hidden = c.hidden;
    lc.dtype = c.dtype;
    lc.num_experts = c.experts;
    lc.max_topk = c.topk;
    lc.tile_rows = 2;
    moe::ExpertLayer layer(g, lc);
    const DispatchArgs a =
        p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout);
    const DispatchResult d = b.dispatch(a);
    const moe::TileFn fn = [](const moe::TileTask&) {};
    for (const char* name : {"recv_x", "recv_src", "recv_topk_idx"}) {
      DispatchResult bad = d;
      TensorView& v = std::string(name) == "recv_x"     ? bad.recv_x
                      : std::string(name) == "recv_src" ? bad.recv_src
                                                        : bad.recv_topk_idx;
      v.data = nullptr;
      expect_invalid(
          [&] { layer.run(bad, a.topk_idx, a.topk_weights, fn, moe::Schedule::kSerial); },
          std::string(name) + " has no data");
    }
    TensorView idx = a.topk_idx, w = a.topk_weights;
    idx.data = nullptr;
    expect_invalid([&] { layer.run(d, idx, a.topk_weights, fn, moe::Schedule::kSerial); },
                   "topk_idx has no data");
    w.data = nullptr;
    expect_invalid([&] { layer.run(d, a.topk_idx, w, fn, moe::Schedule::kSerial); },
                   "topk_weights has no data");
  });
}
#endif

// A config rejected on one rank only: that rank names the value, its peers name the rank, and
// nobody is left waiting in the set-up; then a good Buffer works.
TEST(ConfigRejectedOnOneRank, EveryRankGetsAClearError) {
  GroupOptions opts;
  opts.timeout = std::chrono::milliseconds(5000);
  Case c = fault_case(3, Layout::kThroughput);
  const Problem p = all_ranks_problem(c, 3, 7);
  run_on_threads(
      3,
      [&](Group& g) {
        BufferConfig cfg = config_for(c, Algorithm::kUbep);
        if (g.rank() == 1) cfg.hidden = 0;
        const auto t0 = std::chrono::steady_clock::now();
        if (g.rank() == 1)
          expect_invalid([&] { Buffer b(g, cfg); }, "hidden must be >= 1, got 0");
        else
          expect_invalid([&] { Buffer b(g, cfg); },
                         {"rank 1 rejected its config", "hidden must be >= 1, got 0"});
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2000));
        Buffer b(g, config_for(c, Algorithm::kUbep));
        run_and_check(g, c, p, &b, nullptr);
      },
      opts);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// A survivor waiting on a stalled peer sleeps with back-off instead of burning a core: the
// whole process (the waiter, its workers, the stalled rank asleep) uses a fraction of one core.
TEST(Waiting, SurvivorDoesNotBurnACore) {
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
    Case c = fault_case(2, Layout::kThroughput);
    const Problem p = all_ranks_problem(c, 2, 8);
    std::atomic<double> cpu_during_wait{0}, wall{0};
    std::barrier<> ready(2);
    run_on_threads(2, [&](Group& g) {
      Buffer b(g, config_for(c, algo));
      run_and_check(g, c, p, &b, nullptr);
      ready.arrive_and_wait();
      if (g.rank() == 1) {
        const double c0 = cpu_seconds();
        const auto t0 = std::chrono::steady_clock::now();
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // stalled
        cpu_during_wait = cpu_seconds() - c0;
        wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      run_and_check(g, c, p, &b, nullptr);
    });
    const double share = cpu_during_wait.load() / wall.load();
    RecordProperty(std::string("cpu_share_") + algorithm_name(algo), std::to_string(share));
    std::printf(
        "%s: survivor process CPU while its peer stalls: %.3f s in %.3f s (%.1f%% of a core)\n",
        algorithm_name(algo), cpu_during_wait.load(), wall.load(), 100 * share);
    // A spinning waiter shows as ~100% (or, on a loaded machine where yield hands the core
    // away, 22-36% measured); sleeping with back-off measured 2-3%, and about 10% under the
    // sanitizers (each wake-up costs more there), so the bound is looser in those builds.
    EXPECT_LT(share, kSanitized ? 0.20 : 0.10) << algorithm_name(algo);
  }
}

}  // namespace
}  // namespace ubep::test
