// The multi-host correctness suites over the TCP transport with one launcher per host (issue 32;
// ubep/tcp_group.hpp): no MPI job spans the hosts. Run on virtual hosts by tcp_hosts.sh
// (scripts/vhosts.sh launch) or as launchers on one machine (loopback). Every rank builds the same
// random problem and checks its results against the reference (bit-identical; combine in the
// relay's per-host order), as test_mpi's MultiHost and Fp8 suites do over MPI. The MPI
// baseline is left out: it needs an MPI communicator.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <thread>

#include "host_launcher.hpp"
#include "multihost_suites.hpp"
#include "ubep/error.hpp"
#include "ubep/tcp_group.hpp"

namespace ubep::test {
namespace {

Group* g_group = nullptr;

TEST(TcpHosts, GroupSpansTheLaunchersHosts) {
  Group& g = *g_group;
  const TcpLaunch l = TcpLaunch::from_env(0);
  ASSERT_EQ(g.size(), l.hosts * l.ranks_per_host);
  ASSERT_EQ(g.num_hosts(), l.hosts);
  for (int r = 0; r < g.size(); ++r) EXPECT_EQ(g.host_of(r), r / l.ranks_per_host) << r;
  for (int i = 0; i < 20; ++i) g.barrier();
  std::vector<int> all(static_cast<size_t>(g.size()));
  const int mine = g.rank() * 7 + 1;
  g.allgather(&mine, all.data(), sizeof mine);
  for (int r = 0; r < g.size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], r * 7 + 1);
}

// bsp and ubep through the relay, both layouts, against the reference and each other, with the
// network counters (each token crosses to a remote host at most once).
TEST(TcpHosts, RelayMatchesReference) {
  Group& g = *g_group;
  check_relay_matches_reference(g, g.size() / g.num_hosts(), /*with_baseline=*/false);
}

// fp8 codes and scales (given, or cast on send) bit-identical to the reference codec through bsp
// and ubep, both layouts and placements; combine in bf16 against the reference sum.
TEST(TcpHosts, Fp8MatchesReferenceCodec) {
  check_fp8_matches_reference_codec(*g_group, /*with_baseline=*/false);
}

// Back-to-back ubep calls with changing routing, token counts and layouts and random delays on
// some ranks: every result checked (the transport's ordering under load).
TEST(TcpHosts, BackToBackUbepCalls) {
  Group& g = *g_group;
  Case c;
  c.experts = 3 * g.size();
  c.hidden = 8;
  c.capacity = 6;
  c.topk = 2;
  Buffer b(g, config_for(c, Algorithm::kUbep));
  std::vector<Problem> problems;
  for (int i = 0; i < 8; ++i) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < g.size(); ++r) tokens.push_back(static_cast<int64_t>((i + r * 3) % 7));
    problems.push_back(make_problem(g.size(), c.experts, c.hidden, c.dtype, tokens, c.topk,
                                    Routing::kWithDrops, 500 + static_cast<uint64_t>(i)));
    problems.back().ranks_per_host = g.size() / g.num_hosts();
  }
  std::mt19937 delay(static_cast<unsigned>(g.rank()) * 13 + 7);
  for (int i = 0; i < 300; ++i) {
    c.layout = (i / 3) % 2 ? Layout::kLatency : Layout::kThroughput;
    if (g.rank() % 2 == 1 && delay() % 16 == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(delay() % 300));
    run_and_check(g, c, problems[static_cast<size_t>(i) % problems.size()], &b, nullptr,
                  i % 4 == 0);
    if (::testing::Test::HasFailure()) break;
  }
}

int open_fds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += !e.is_directory();
  return n;
}

// Groups made and destroyed again and again in one process (the rendezvous port is free again
// once a group is set up): one checked call each, and the process's open files stay flat
// (sockets, listeners, shared-memory segments, the heartbeat's and death watch's descriptors).
TEST(TcpHosts, GroupsComeAndGoWithoutLeaking) {
  Group& world = *g_group;
  const TcpLaunch launch = TcpLaunch::from_env(world.rank() % (world.size() / world.num_hosts()));
  int before = 0;
  for (int round = 0; round < 6; ++round) {
    if (round == 1) before = open_fds();  // after the first: lazily opened things are open
    GroupOptions opts;
    opts.timeout = std::chrono::seconds(30);
    std::unique_ptr<Group> g = make_tcp_group(launch, opts);
    Case c;
    c.experts = 2 * g->size();
    c.hidden = 16;
    c.capacity = 5;
    c.topk = 2;
    Buffer b(*g, config_for(c, Algorithm::kUbep));
    Problem p = make_problem(g->size(), c.experts, c.hidden, c.dtype,
                             std::vector<int64_t>(static_cast<size_t>(g->size()), 5), c.topk,
                             Routing::kUniform, 40 + static_cast<uint64_t>(round));
    p.ranks_per_host = g->size() / g->num_hosts();
    run_and_check(*g, c, p, &b, nullptr);
    g->barrier();  // nobody's group goes while a peer may still read from it
  }
  EXPECT_EQ(open_fds(), before);
}

int rank_main(int local_rank) {
  try {
    const TcpLaunch launch = TcpLaunch::from_env(local_rank);
    if (launch.rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    GroupOptions opts;
    opts.timeout = std::chrono::seconds(60);
    std::unique_ptr<Group> g = make_tcp_group(launch, opts);
    g_group = g.get();
    const int rc = RUN_ALL_TESTS();
    // Every rank's result to rank 0's exit status: the launchers' worst status is the test's.
    std::vector<int> all(static_cast<size_t>(g->size()));
    g->allgather(&rc, all.data(), sizeof rc);
    g_group = nullptr;
    int worst = 0;
    for (int x : all) worst = std::max(worst, x);
    return worst;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "local rank %d: %s\n", local_rank, e.what());
    return 3;
  }
}

}  // namespace
}  // namespace ubep::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return ubep::test::run_host_ranks(ubep::test::rank_main);
}
