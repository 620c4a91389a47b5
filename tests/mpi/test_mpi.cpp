// The multi-process suite: run under mpirun (ctest does, with 2 and 4 processes). Every process
// builds the same random problem, runs its rank's part, and checks it against the reference.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <random>
#include <thread>

#include "mpi_gtest_main.hpp"
#include "multihost_suites.hpp"
#include "ubep/error.hpp"
#include "ubep/mpi_group.hpp"

namespace ubep::test {
namespace {

struct Param {
  int topk;
  DType dtype;
  Layout layout;
  Routing routing;
};

class ProcessRanks : public ::testing::TestWithParam<Param> {};

TEST_P(ProcessRanks, AllImplementationsMatchReferenceAndEachOther) {
  Group& g = *g_group;
  const Param pr = GetParam();
  Case c;
  c.experts = 4 * g.size();
  c.hidden = 40;
  c.dtype = pr.dtype;
  c.capacity = 11;
  c.topk = pr.topk;
  c.layout = pr.layout;
  c.routing = pr.routing;
  Buffer bsp(g, config_for(c, Algorithm::kBsp));
  Buffer ubep(g, config_for(c, Algorithm::kUbep));
  AlltoallBaseline base(g, config_for(c, Algorithm::kBsp));
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < g.size(); ++r)
      tokens.push_back(static_cast<int64_t>((seed * 7 + static_cast<uint64_t>(r) * 5) % 12));
    c.seed = seed;
    const Problem p =
        make_problem(g.size(), c.experts, c.hidden, c.dtype, tokens, c.topk, c.routing, seed * 31);
    auto a = run_and_check(g, c, p, &bsp, nullptr);
    auto b = run_and_check(g, c, p, &ubep, nullptr);
    auto d = run_and_check(g, c, p, nullptr, &base);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, d);
  }
  EXPECT_EQ(bsp.last_stats().barriers, 2u);  // bsp combine
  EXPECT_EQ(ubep.last_stats().barriers, 0u);
}

std::vector<Param> params() {
  std::vector<Param> ps;
  for (int k : {1, 2, 8})
    for (DType dt : {DType::kBF16, DType::kFP32})
      for (Layout l : {Layout::kThroughput, Layout::kLatency})
        ps.push_back({k, dt, l, k == 8 ? Routing::kHot : Routing::kWithDrops});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Sweep, ProcessRanks, ::testing::ValuesIn(params()), [](const auto& i) {
  return "top" + std::to_string(i.param.topk) + "_" + dtype_name(i.param.dtype) + "_" +
         layout_name(i.param.layout);
});

// Thousands of back-to-back calls with changing routing, token counts and layouts, random
// delays on some ranks, starting near the epoch wrap-around; every result checked.
TEST(ProcessRanksStress, BackToBackUbepCalls) {
  Group& g = *g_group;
  Case c;
  c.experts = 3 * g.size();
  c.hidden = 8;
  c.capacity = 6;
  c.topk = 2;
  BufferConfig cfg = config_for(c, Algorithm::kUbep);
  cfg.initial_epoch = 0xFFFFFFFFull - 50;
  Buffer b(g, cfg);
  std::vector<Problem> problems;
  for (int i = 0; i < 16; ++i) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < g.size(); ++r) tokens.push_back(static_cast<int64_t>((i + r * 3) % 7));
    problems.push_back(make_problem(g.size(), c.experts, c.hidden, c.dtype, tokens, c.topk,
                                    Routing::kWithDrops, 500 + static_cast<uint64_t>(i)));
  }
  std::mt19937 delay(static_cast<unsigned>(g.rank()) * 13 + 7);
  for (int i = 0; i < 2000; ++i) {
    c.layout = (i / 3) % 2 ? Layout::kLatency : Layout::kThroughput;
    if (g.rank() % 2 == 1 && delay() % 16 == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(delay() % 300));
    run_and_check(g, c, problems[static_cast<size_t>(i) % problems.size()], &b, nullptr,
                  i % 4 == 0);
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(ProcessRanksErrors, BadInputThenValidCall) {
  Group& g = *g_group;
  Case c;
  c.experts = 2 * g.size();
  c.capacity = 4;
  c.topk = 1;
  c.tokens.assign(static_cast<size_t>(g.size()), 4);
  const Problem p =
      make_problem(g.size(), c.experts, c.hidden, c.dtype, c.tokens, c.topk, Routing::kUniform, 9);
  Buffer b(g, config_for(c, Algorithm::kUbep));
  std::vector<int64_t> idx = p.inputs[static_cast<size_t>(g.rank())].topk_idx;
  idx[0] = c.experts;
  DispatchArgs a = p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout);
  a.topk_idx = TensorView(idx.data(), DType::kInt64, {4, 1});
  EXPECT_THROW(b.dispatch(a), InvalidArgument);
  run_and_check(g, c, p, &b, nullptr);
}

// fp8 dispatch on process ranks: codes and scales (given, or cast on send with power-of-two
// scales) bit-identical to the reference codec through bsp, ubep and MPI_Alltoallv, both layouts
// and placements; combine in bf16 against the reference sum.
TEST(ProcessRanksFp8, MatchesReferenceCodec) {
  check_fp8_matches_reference_codec(*g_group, /*with_baseline=*/true);
}

// Forced hosts of 2 ranks (run with --mca btl tcp,self so the "network" is TCP) or, with
// UBEP_TEST_HOSTS=H, the H hosts that discovery finds (virtual hosts, scripts/vhosts.sh: each
// its own network, /dev/shm and hostname): bsp, ubep and the baseline through the relay, against
// the reference, with the network counters.
TEST(ProcessRanksMultiHost, RelayOverMpiMatchesReference) {
  Group& world = *g_group;
  const char* hosts_env = std::getenv("UBEP_TEST_HOSTS");
  const int real_hosts = hosts_env ? std::atoi(hosts_env) : 0;
  if (real_hosts == 0 && (world.size() % 2 != 0 || world.size() < 4))
    GTEST_SKIP() << "needs 4+ ranks";
  GroupOptions opts;
  opts.ranks_per_host = real_hosts > 0 ? 0 : 2;
  auto g = make_mpi_group(MPI_COMM_WORLD, opts);
  const int per_host = real_hosts > 0 ? g->size() / real_hosts : 2;
  ASSERT_EQ(g->num_hosts(), g->size() / per_host);
  for (int r = 0; r < g->size(); ++r) ASSERT_EQ(g->host_of(r), r / per_host) << "rank " << r;
  check_relay_matches_reference(*g, per_host, /*with_baseline=*/true);
}

}  // namespace
}  // namespace ubep::test

int main(int argc, char** argv) {
  return ubep::test::mpi_gtest_main(argc, argv, /*with_world_group=*/true);
}
