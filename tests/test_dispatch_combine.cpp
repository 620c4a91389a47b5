// Dispatch + combine on thread ranks against the reference, for every implementation.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "harness.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

std::vector<int64_t> token_counts(const Case& c, int ranks, uint64_t seed) {
  if (!c.tokens.empty()) {
    std::vector<int64_t> t;
    for (int r = 0; r < ranks; ++r) t.push_back(c.tokens[static_cast<size_t>(r) % c.tokens.size()]);
    return t;
  }
  std::mt19937_64 rng(seed);
  std::vector<int64_t> t;
  for (int r = 0; r < ranks; ++r)
    t.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(c.capacity + 1)));
  return t;
}

// Runs the case with bsp, ubep (each with both placements) and the baseline; all must match the
// reference and each other.
void run_case(int ranks, Case c, int repeats = 2) {
  Case other = c;
  other.placement =
      placement_for(c.layout) == Placement::kCompact ? Placement::kPerSource : Placement::kCompact;
  const Problem p = make_problem(ranks, c.experts, c.hidden, c.dtype,
                                 token_counts(c, ranks, c.seed), c.topk, c.routing, c.seed);
  std::vector<std::vector<char>> y(static_cast<size_t>(ranks) * 3);
  run_on_threads(ranks, [&](Group& g) {
    Buffer bsp(g, config_for(c, Algorithm::kBsp));
    Buffer ubep(g, config_for(c, Algorithm::kUbep));
    Buffer bsp_other(g, config_for(other, Algorithm::kBsp));
    Buffer ubep_other(g, config_for(other, Algorithm::kUbep));
    AlltoallBaseline base(g, config_for(c, Algorithm::kBsp));
    for (int rep = 0; rep < repeats; ++rep) {
      auto a = run_and_check(g, c, p, &bsp, nullptr);
      auto b = run_and_check(g, c, p, &ubep, nullptr, /*zero_copy_combine=*/rep % 2 == 1);
      auto d = run_and_check(g, c, p, nullptr, &base);
      auto a2 = run_and_check(g, other, p, &bsp_other, nullptr);
      auto b2 = run_and_check(g, other, p, &ubep_other, nullptr, rep % 2 == 0);
      EXPECT_EQ(a, b) << "bsp and ubep differ on rank " << g.rank();
      EXPECT_EQ(a, d) << "bsp and the baseline differ on rank " << g.rank();
      EXPECT_EQ(a, a2) << "bsp's placements differ on rank " << g.rank();
      EXPECT_EQ(a, b2) << "ubep's placements differ on rank " << g.rank();
      if (rep == 0)
        y[static_cast<size_t>(g.rank())] = a;
      else
        EXPECT_EQ(a, y[static_cast<size_t>(g.rank())]) << "repeat " << rep << " differs";
    }
  });
}

struct Param {
  int ranks;
  int topk;
  DType dtype;
  Layout layout;
  Routing routing;
};

class DispatchCombine : public ::testing::TestWithParam<Param> {};

TEST_P(DispatchCombine, MatchesReference) {
  const Param pr = GetParam();
  Case c;
  c.experts = 8 * pr.ranks;
  c.hidden = 24;
  c.dtype = pr.dtype;
  c.capacity = 9;
  c.topk = pr.topk;
  c.layout = pr.layout;
  c.routing = pr.routing;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    c.seed = seed * 7919 + static_cast<uint64_t>(pr.ranks);
    run_case(pr.ranks, c);
  }
}

std::vector<Param> params() {
  std::vector<Param> ps;
  for (int ranks : {1, 2, 3, 4, 8})
    for (int topk : {1, 2, 8})
      for (DType dt : {DType::kBF16, DType::kFP32})
        for (Layout l : {Layout::kThroughput, Layout::kLatency})
          ps.push_back({ranks, topk, dt, l, topk == 2 ? Routing::kHot : Routing::kWithDrops});
  return ps;
}

std::string param_name(const ::testing::TestParamInfo<Param>& i) {
  std::string s = "r";  // appended piecewise: GCC 12 -Wrestrict false positive (bug 105329)
  s += std::to_string(i.param.ranks);
  s += "_top";
  s += std::to_string(i.param.topk);
  s += "_";
  s += dtype_name(i.param.dtype);
  s += "_";
  s += layout_name(i.param.layout);
  return s;
}

INSTANTIATE_TEST_SUITE_P(Sweep, DispatchCombine, ::testing::ValuesIn(params()), param_name);

TEST(DispatchCombineEdges, TokenCountsZeroOneOddAndCapacity) {
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    Case c;
    c.experts = 12;
    c.hidden = 7;  // odd row size
    c.capacity = 5;
    c.topk = 3;
    c.layout = l;
    c.tokens = {0, 1, 5};  // empty, one token, exactly the capacity (odd)
    run_case(3, c);
    c.tokens = {0, 0, 0};
    run_case(3, c);
    c.tokens = {5, 5, 5};
    c.routing = Routing::kHot;
    run_case(3, c);
  }
}

TEST(DispatchCombineEdges, AllTokensDropped) {
  Case c;
  c.experts = 4;
  c.capacity = 4;
  c.topk = 1;
  const Problem base = make_problem(2, 4, c.hidden, c.dtype, {4, 4}, 1, Routing::kUniform, 3);
  Problem p = base;
  for (auto& in : p.inputs) std::fill(in.topk_idx.begin(), in.topk_idx.end(), -1);
  run_on_threads(2, [&](Group& g) {
    Buffer b(g, config_for(c, Algorithm::kUbep));
    run_and_check(g, c, p, &b, nullptr);
  });
}

TEST(DispatchCombineEdges, BarriersPerCall) {
  Case c;
  c.tokens = {8, 8};
  const Problem p = make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, c.routing, 5);
  run_on_threads(2, [&](Group& g) {
    Buffer bsp(g, config_for(c, Algorithm::kBsp));
    Buffer ubep(g, config_for(c, Algorithm::kUbep));
    DispatchArgs a = p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout);
    for (int i = 0; i < 5; ++i) {
      auto r = bsp.dispatch(a);
      EXPECT_EQ(bsp.last_stats().barriers, 3u);
      EXPECT_GE(bsp.last_stats().stage_us.size(), 4u);
      auto r2 = ubep.dispatch(a);
      EXPECT_EQ(ubep.last_stats().barriers, 0u) << "ubep must make no group-wide barrier";
      std::vector<char> in(static_cast<size_t>(r2.num_recv_rows * c.hidden) * 4, 0);
      ubep.combine({TensorView(in.data(), c.dtype, {r2.num_recv_rows, c.hidden}), r2.handle});
      EXPECT_EQ(ubep.last_stats().barriers, 0u);
      (void)r;
    }
  });
}

// The stage table's peer wait (CallStats::stage_wait_us) shows a peer's delay where it lands: rank
// 1 starts each op 30 ms late, so rank 0 waits at least most of that inside the op, and a wait is
// never more than its stage (one member: no workers). Reference: the sleep itself.
TEST(DispatchCombineEdges, StageWaitsShowALatePeer) {
  Case c;
  c.tokens = {8, 8};
  const Problem p = make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, c.routing, 5);
  constexpr double kLateUs = 30000;
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
    run_on_threads(2, [&](Group& g) {
      BufferConfig cfg = config_for(c, algo);
      cfg.num_workers = 0;
      Buffer b(g, cfg);
      DispatchArgs a = p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout);
      auto check = [&](const char* op) {
        const CallStats& s = b.last_stats();
        ASSERT_EQ(s.stage_wait_us.size(), s.stage_us.size()) << op;
        double wait = 0;
        for (size_t i = 0; i < s.stage_us.size(); ++i) {
          EXPECT_GE(s.stage_wait_us[i], 0) << op << " " << s.stage_us[i].first;
          EXPECT_LE(s.stage_wait_us[i], s.stage_us[i].second + 1)
              << op << " " << s.stage_us[i].first;
          wait += s.stage_wait_us[i];
        }
        if (g.rank() == 0) {
          EXPECT_GE(wait, 0.5 * kLateUs) << algorithm_name(algo) << " " << op;
        }
      };
      auto late = [&] {
        g.barrier();
        if (g.rank() == 1)
          std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(kLateUs)));
      };
      late();
      auto r = b.dispatch(a);
      check("dispatch");
      std::vector<char> in(static_cast<size_t>(r.num_recv_rows * c.hidden) * 4, 0);
      late();
      b.combine({TensorView(in.data(), c.dtype, {r.num_recv_rows, c.hidden}), r.handle});
      check("combine");
    });
  }
}

}  // namespace
}  // namespace ubep::test

namespace ubep::test {
namespace {
// Calls that move more than a few MiB write rows with non-temporal stores; check that path too.
TEST(DispatchCombineEdges, LargeCallsUseStreamingStores) {
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    Case c;
    c.experts = 8;
    c.hidden = 4096;
    c.dtype = DType::kFP32;
    c.capacity = 200;
    c.topk = 3;
    c.layout = l;
    c.tokens = {200, 173};
    run_case(2, c, 1);
  }
}

// A rank whose rows outgrow kTokenOrderBytes (4 MiB) sends them token by token
// (DispatchCall::send_tokens), one under it destination by destination: here both in one call
// (4.9 MB of fp32 rows on rank 0, 2.8 MB on rank 1), every layout and placement, bsp and ubep
// against the reference, with 3 ranks so a token's destinations are rotated and deduplicated.
TEST(DispatchCombineEdges, RowsPastTheCacheGoTokenByToken) {
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    Case c;
    c.experts = 9;
    c.hidden = 4096;
    c.dtype = DType::kFP32;
    c.capacity = 300;
    c.topk = 4;
    c.layout = l;
    c.tokens = {300, 173, 0};
    run_case(3, c, 1);
  }
}

// A throughput combine's rows take software prefetch or not as the reducer's tuner measured
// faster (ep::TokenReducer, PolicyTuner): on one buffer, calls 3 to 10 of a size alternate both
// ways (2 warm-up calls, then 4 probes of each). Every call's output must be the reference's
// bits either way, for bsp and ubep. Rows of 2048 elements: the vector loops run, and their
// prefetches reach into the next token's rows.
TEST(DispatchCombineEdges, ThroughputCombinesStayExactWhileTheReducerProbesPrefetch) {
  Case c;
  c.experts = 12;
  c.hidden = 2048;
  c.dtype = DType::kBF16;
  c.capacity = 7;
  c.topk = 3;
  c.layout = Layout::kThroughput;
  c.tokens = {7, 5, 6};
  run_case(3, c, 12);
}
}  // namespace
}  // namespace ubep::test
