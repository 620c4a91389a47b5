// Properties specific to the ubep algorithm: epochs across the 32-bit wrap-around, split-phase
// calls with work in between, sync modes, worker teams, and a randomized stress test.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <thread>

#include "harness.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

TEST(Ubep, EpochWrapAround) {
  Case c;
  c.experts = 12;
  c.capacity = 6;
  c.topk = 2;
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    c.layout = l;
    run_on_threads(3, [&](Group& g) {
      BufferConfig cfg = config_for(c, Algorithm::kUbep);
      cfg.initial_epoch = 0xFFFFFFFFull - 5;  // tags run ..., 0xFFFFFFFF, 1, 2, ...
      Buffer b(g, cfg);
      for (int i = 0; i < 12; ++i) {
        std::vector<int64_t> tokens = {static_cast<int64_t>(i % 7), 6,
                                       static_cast<int64_t>((i * 5) % 7)};
        const Problem p = make_problem(3, c.experts, c.hidden, c.dtype, tokens, c.topk,
                                       Routing::kWithDrops, 100 + i);
        run_and_check(g, c, p, &b, nullptr);
      }
    });
  }
}

// The 64-bit call counter's own wrap (an initial epoch near 2^64, as the fuzzer chose): before
// first_seq_of, tag_of(2^64-1) and tag_of(0) were both 1, so the call after the wrap read the
// previous call's records as current and bsp's barrier timed out (finding F7).
TEST(Ubep, EpochNearTheCounterWrap) {
  Case c;
  c.experts = 8;
  c.capacity = 6;
  c.topk = 2;
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
    GroupOptions opts;
    opts.timeout = std::chrono::milliseconds(5000);
    run_on_threads(
        2,
        [&](Group& g) {
          BufferConfig cfg = config_for(c, algo);
          cfg.initial_epoch = ~uint64_t{0} - 3;
          Buffer b(g, cfg);
          for (int i = 0; i < 8; ++i) {
            const Problem p = make_problem(2, c.experts, c.hidden, c.dtype, {6, 4}, c.topk,
                                           Routing::kWithDrops, 300 + i);
            run_and_check(g, c, p, &b, nullptr);
          }
        },
        opts);
  }
}

TEST(Ubep, SplitPhaseWithWorkInBetween) {
  Case c;
  c.experts = 8;
  c.capacity = 16;
  c.topk = 2;
  c.tokens = {16, 9};
  const Problem p =
      make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, Routing::kHot, 77);
  run_on_threads(2, [&](Group& g) {
    Buffer blocking(g, config_for(c, Algorithm::kUbep));
    Buffer split(g, config_for(c, Algorithm::kUbep));
    const DispatchArgs a =
        p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout);
    DispatchResult r1 = blocking.dispatch(a);
    std::vector<char> x1(static_cast<const char*>(r1.recv_x.data),
                         static_cast<const char*>(r1.recv_x.data) + r1.recv_x.bytes());
    TensorView y1 = blocking.combine({r1.recv_x, r1.handle});
    std::vector<char> out1(static_cast<const char*>(y1.data),
                           static_cast<const char*>(y1.data) + y1.bytes());

    split.dispatch_send(a);
    // Work between the phases (and a delay so the peer's messages arrive first or last).
    volatile double sink = 0;
    for (int i = 0; i < 200000 * (g.rank() + 1); ++i) sink = sink + i * 0.5;
    EXPECT_THROW(split.dispatch_send(a), InvalidArgument);  // one outstanding call
    DispatchResult r2 = split.dispatch_recv();
    std::vector<char> x2(static_cast<const char*>(r2.recv_x.data),
                         static_cast<const char*>(r2.recv_x.data) + r2.recv_x.bytes());
    EXPECT_EQ(x1, x2);
    split.combine_send({r2.recv_x, r2.handle});
    std::this_thread::sleep_for(std::chrono::milliseconds(g.rank() * 5));
    TensorView y2 = split.combine_recv();
    std::vector<char> out2(static_cast<const char*>(y2.data),
                           static_cast<const char*>(y2.data) + y2.bytes());
    EXPECT_EQ(out1, out2);
  });
}

// Runs one problem on thread ranks once per configuration variant of the ubep algorithm: every
// run must match the reference (run_and_check) and the first run, bit for bit.
using Variant = std::pair<std::string, std::function<void(BufferConfig&)>>;
void expect_variants_agree(Case c, const std::vector<int64_t>& tokens, uint64_t seed,
                           const std::vector<Variant>& variants,
                           Algorithm algo = Algorithm::kUbep) {
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    c.layout = l;
    const int ranks = static_cast<int>(tokens.size());
    const Problem p =
        make_problem(ranks, c.experts, c.hidden, c.dtype, tokens, c.topk, Routing::kHot, seed);
    run_on_threads(ranks, [&](Group& g) {
      std::vector<char> first;
      for (const auto& [name, apply] : variants) {
        BufferConfig cfg = config_for(c, algo);
        apply(cfg);
        Buffer b(g, cfg);
        auto y = run_and_check(g, c, p, &b, nullptr);
        if (first.empty()) first = y;
        EXPECT_EQ(y, first) << name << ", " << layout_name(l);
      }
    });
  }
}

Case small_case() {
  Case c;
  c.experts = 16;
  c.capacity = 12;
  c.topk = 4;
  return c;
}

// The scheduler's plans (any policy, with a topology) move exactly the same rows.
TEST(Ubep, SchedulePoliciesAgree) {
  std::vector<Variant> variants;
  for (SendSchedule s : {SendSchedule::kEqualSlices, SendSchedule::kNaive,
                         SendSchedule::kColumnMajor, SendSchedule::kBalanced})
    for (const char* topo : {"", "2x2", "cm384"})
      variants.push_back(
          {std::string(send_schedule_name(s)) + " on '" + topo + "'", [=](BufferConfig& cfg) {
             cfg.num_workers = 2;
             cfg.research.schedule = s;
             cfg.research.topology = topo;
           }});
  expect_variants_agree(small_case(), {12, 7, 0, 11}, 9, variants);
}

TEST(Ubep, SyncModesAndWorkerCountsAgree) {
  std::vector<Variant> variants;
  for (int workers : {0, 1, 3})
    for (SyncMode m : {SyncMode::kFused, SyncMode::kStopAndWait})
      variants.push_back(
          {std::to_string(workers) + " workers, " + sync_mode_name(m), [=](BufferConfig& cfg) {
             cfg.num_workers = workers;
             cfg.research.sync = m;
           }});
  expect_variants_agree(small_case(), {12, 3, 0, 11}, 5, variants);
}

// Latency calls of over 4 MiB (1040 rows of 4 KiB): large enough for streamed rows, whose fences
// the CPU data path batches, and bf16, so combine runs the vectorised reduction; both
// algorithms (bsp splits its loops over the workers too) with 0, 1 and 2 workers.
TEST(Ubep, StreamedRowsAndWorkerCountsAgreeForBothAlgorithms) {
  Case c;
  c.experts = 16;
  c.hidden = 2048;
  c.dtype = DType::kBF16;
  c.capacity = 130;
  c.topk = 8;
  std::vector<Variant> variants;
  for (int workers : {0, 1, 2})
    variants.push_back({std::to_string(workers) + " workers",
                        [=](BufferConfig& cfg) { cfg.num_workers = workers; }});
  for (Algorithm algo : {Algorithm::kUbep, Algorithm::kBsp})
    expect_variants_agree(c, {130, 130}, 21, variants, algo);
}

// Thousands of back-to-back calls with changing routing and token counts, random delays on
// some ranks, several worker counts; each result checked against the reference. Run it under
// ThreadSanitizer (UBEP_SANITIZE=thread) to check the memory-ordering arguments.
TEST(UbepStress, BackToBackCallsWithRandomDelays) {
  const int ranks = 3;
  const int calls =
      std::getenv("UBEP_STRESS_CALLS") ? std::atoi(std::getenv("UBEP_STRESS_CALLS")) : 1500;
  Case c;
  c.experts = 9;
  c.hidden = 8;
  c.capacity = 7;
  c.topk = 3;
  std::vector<Problem> problems;
  std::mt19937_64 rng(2024);
  for (int i = 0; i < 16; ++i) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < ranks; ++r) tokens.push_back(static_cast<int64_t>(rng() % 8));
    problems.push_back(make_problem(ranks, c.experts, c.hidden, c.dtype, tokens, c.topk,
                                    i % 2 ? Routing::kHot : Routing::kWithDrops,
                                    1000 + static_cast<uint64_t>(i)));
  }
  run_on_threads(ranks, [&](Group& g) {
    BufferConfig cfg = config_for(c, Algorithm::kUbep);
    cfg.num_workers = g.rank();  // 0, 1 and 2 workers
    cfg.initial_epoch = 0xFFFFFFFFull - 100;
    Buffer b(g, cfg);
    std::mt19937 delay(static_cast<unsigned>(g.rank()) * 7 + 1);
    for (int i = 0; i < calls; ++i) {
      Case ci = c;
      ci.layout = (i / 3) % 2 ? Layout::kLatency : Layout::kThroughput;
      if (g.rank() != 1 && delay() % 8 == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(delay() % 200));
      if (delay() % 5 == 0) std::this_thread::yield();
      run_and_check(g, ci, problems[static_cast<size_t>(i) % problems.size()], &b, nullptr);
      if (::testing::Test::HasFailure()) break;
    }
  });
}

}  // namespace
}  // namespace ubep::test
