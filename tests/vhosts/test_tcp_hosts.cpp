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

#include "fp8_dispatch_check.hpp"
#include "harness.hpp"
#include "host_launcher.hpp"
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
  const int per_host = g.size() / g.num_hosts();
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    Case c;
    c.experts = 4 * g.size();
    c.hidden = 24;
    c.capacity = 10;
    c.topk = 4;
    c.layout = l;
    c.dtype = DType::kBF16;
    Buffer bsp(g, config_for(c, Algorithm::kBsp));
    Buffer ubep(g, config_for(c, Algorithm::kUbep));
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      std::vector<int64_t> tokens;
      for (int r = 0; r < g.size(); ++r)
        tokens.push_back(static_cast<int64_t>((seed * 3 + static_cast<uint64_t>(r)) % 11));
      Problem p = make_problem(g.size(), c.experts, c.hidden, c.dtype, tokens, c.topk,
                               Routing::kHot, seed * 17);
      p.ranks_per_host = per_host;
      auto a = run_and_check(g, c, p, &bsp, nullptr);
      auto u = run_and_check(g, c, p, &ubep, nullptr, seed == 2);
      EXPECT_EQ(a, u);
      ubep.dispatch(p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout));
      const RankInput& in = p.inputs[static_cast<size_t>(g.rank())];
      const int El = c.experts / g.size();
      uint64_t want = 0;
      for (int64_t t = 0; t < in.tokens; ++t) {
        std::vector<bool> hosts(static_cast<size_t>(g.num_hosts()), false);
        for (int j = 0; j < in.topk; ++j) {
          const int64_t e = in.topk_idx[static_cast<size_t>(t * in.topk + j)];
          if (e >= 0 && p.host_of(static_cast<int>(e / El)) != p.host_of(g.rank()))
            hosts[static_cast<size_t>(p.host_of(static_cast<int>(e / El)))] = true;
        }
        for (bool h : hosts) want += h;
      }
      EXPECT_EQ(ubep.last_stats().network_rows, want);
      EXPECT_EQ(ubep.last_stats().barriers, 0u);
    }
  }
}

// fp8 codes and scales (given, or cast on send) bit-identical to the reference codec through bsp
// and ubep, both layouts and placements; combine in bf16 against the reference sum.
TEST(TcpHosts, Fp8MatchesReferenceCodec) {
  Group& g = *g_group;
  const int R = g.size(), experts = 4 * R, topk = 3;
  const int64_t hidden = 200, capacity = 6;
  std::vector<int64_t> tokens;
  for (int r = 0; r < R; ++r) tokens.push_back((r * 5 + 3) % 7);
  Problem p = make_problem(R, experts, hidden, DType::kBF16, tokens, topk, Routing::kWithDrops, 77);
  p.ranks_per_host = R / g.num_hosts();
  for (bool cast : {false, true}) {
    const std::vector<RefFp8> q = ref_quantize_problem(p, cast);
    const DispatchArgs given =
        fp8_args(p, q[static_cast<size_t>(g.rank())], g.rank(), Layout::kThroughput);
    for (Layout layout : {Layout::kThroughput, Layout::kLatency})
      for (Placement placement : {Placement::kCompact, Placement::kPerSource}) {
        SCOPED_TRACE(std::string(layout_name(layout)) + " " + placement_name(placement) +
                     (cast ? " cast-on-send" : " given"));
        BufferConfig cfg;
        cfg.max_tokens_per_rank = capacity;
        cfg.hidden = hidden;
        cfg.dtype = DType::kFP8E4M3;
        cfg.fp8_pow2_scales = cast;
        cfg.num_experts = experts;
        cfg.max_topk = topk;
        cfg.placement = placement;
        DispatchArgs a =
            cast ? p.inputs[static_cast<size_t>(g.rank())].args(DType::kBF16, hidden, layout)
                 : given;
        a.layout = layout;
        for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
          cfg.algorithm = algo;
          Buffer b(g, cfg);
          const DispatchResult r = b.dispatch(a);
          check_fp8_dispatch(r, p, q, g.rank());
          std::vector<uint16_t> out = dequantized_bf16(r, hidden);
          CombineArgs ca;
          ca.handle = r.handle;
          ca.x = r.recv_x;
          ca.x.data = out.data();
          ca.x.dtype = DType::kBF16;
          check_fp8_combine(b.combine(ca), p, q, g.rank(), layout);
        }
      }
  }
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
