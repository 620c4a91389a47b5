// Groups that span hosts (forced with GroupOptions::ranks_per_host; thread ranks talk between
// "hosts" through the in-process transport): the relay path of bsp and ubep against the
// reference and the baseline, and the network counters against the deduplicated volume.
#include <gtest/gtest.h>

#include <atomic>
#include <set>

#include "harness.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

// Token rows that must cross between hosts: one per (token, remote host with >= 1 of its experts).
uint64_t expected_network_rows(const Problem& p, int me) {
  const RankInput& in = p.inputs[static_cast<size_t>(me)];
  const int El = p.experts / p.ranks;
  uint64_t rows = 0;
  for (int64_t t = 0; t < in.tokens; ++t) {
    std::set<int> hosts;
    for (int j = 0; j < in.topk; ++j) {
      const int64_t e = in.topk_idx[static_cast<size_t>(t * in.topk + j)];
      if (e >= 0 && p.host_of(static_cast<int>(e / El)) != p.host_of(me))
        hosts.insert(p.host_of(static_cast<int>(e / El)));
    }
    rows += hosts.size();
  }
  return rows;
}

struct Param {
  int ranks, per_host, topk;
  Layout layout;
  DType dtype;
};

class MultiHost : public ::testing::TestWithParam<Param> {};

TEST_P(MultiHost, RelayMatchesReferenceAndCrossesOncePerHost) {
  const Param pr = GetParam();
  Case c;
  c.experts = 4 * pr.ranks;
  c.hidden = 20;
  c.capacity = 9;
  c.topk = pr.topk;
  c.layout = pr.layout;
  c.dtype = pr.dtype;
  GroupOptions opts;
  opts.ranks_per_host = pr.per_host;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < pr.ranks; ++r)
      tokens.push_back(static_cast<int64_t>((seed * 5 + static_cast<uint64_t>(r) * 3) % 10));
    Problem p = make_problem(pr.ranks, c.experts, c.hidden, c.dtype, tokens, c.topk,
                             seed % 2 ? Routing::kHot : Routing::kWithDrops, seed * 101);
    p.ranks_per_host = pr.per_host;
    c.seed = seed;
    run_on_threads(
        pr.ranks,
        [&](Group& g) {
          ASSERT_GT(g.num_hosts(), 1);
          Buffer bsp(g, config_for(c, Algorithm::kBsp));
          Buffer ubep(g, config_for(c, Algorithm::kUbep));
          AlltoallBaseline base(g, config_for(c, Algorithm::kBsp));
          for (int rep = 0; rep < 2; ++rep) {
            auto a = run_and_check(g, c, p, &bsp, nullptr);
            auto u = run_and_check(g, c, p, &ubep, nullptr, rep == 1);
            auto d = run_and_check(g, c, p, nullptr, &base);
            EXPECT_EQ(a, u) << "bsp and ubep differ on rank " << g.rank();
            EXPECT_EQ(a, d) << "bsp and the baseline differ on rank " << g.rank();
          }
          // Dispatch alone, to read its counters.
          DispatchResult r = ubep.dispatch(
              p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout));
          EXPECT_EQ(ubep.last_stats().barriers, 0u);
          EXPECT_EQ(ubep.last_stats().network_rows, expected_network_rows(p, g.rank()));
          (void)r;
        },
        opts);
  }
}

std::vector<Param> params() {
  std::vector<Param> ps;
  for (auto [ranks, per_host] : std::vector<std::pair<int, int>>{{4, 2}, {6, 2}, {5, 2}, {6, 3}})
    for (Layout l : {Layout::kThroughput, Layout::kLatency})
      ps.push_back(
          {ranks, per_host, ranks == 6 ? 8 : 2, l, ranks == 5 ? DType::kFP32 : DType::kBF16});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Hosts, MultiHost, ::testing::ValuesIn(params()), [](const auto& i) {
  return std::to_string(i.param.ranks) + "ranks_" + std::to_string(i.param.per_host) + "perhost_" +
         layout_name(i.param.layout);
});

TEST(MultiHostStress, BackToBackCallsAcrossHosts) {
  Case c;
  c.experts = 8;
  c.hidden = 8;
  c.capacity = 6;
  c.topk = 3;
  GroupOptions opts;
  opts.ranks_per_host = 2;
  opts.timeout = std::chrono::milliseconds(10000);
  std::vector<Problem> problems;
  for (int i = 0; i < 8; ++i) {
    std::vector<int64_t> tokens{i % 7, (i * 3) % 7, 6, (i * 5) % 7};
    problems.push_back(make_problem(4, c.experts, c.hidden, c.dtype, tokens, c.topk,
                                    Routing::kWithDrops, 900 + static_cast<uint64_t>(i)));
    problems.back().ranks_per_host = 2;
  }
  run_on_threads(
      4,
      [&](Group& g) {
        BufferConfig cfg = config_for(c, Algorithm::kUbep);
        cfg.initial_epoch = 0xFFFFFFFFull - 20;
        Buffer b(g, cfg);
        for (int i = 0; i < 400 && !::testing::Test::HasFailure(); ++i) {
          Case ci = c;
          ci.layout = i % 3 ? Layout::kThroughput : Layout::kLatency;
          run_and_check(g, ci, problems[static_cast<size_t>(i) % problems.size()], &b, nullptr,
                        i % 2 == 0);
        }
      },
      opts);
}

}  // namespace
}  // namespace ubep::test
