// The multi-host correctness suites, shared by every launch that spans hosts: test_mpi (forced
// and virtual hosts under mpirun) and test_tcp_hosts (one launcher per host over TcpRemote).
// Every rank builds the same random problem and checks its results against the reference
// (bit-identical; combine in the relay's per-host order). `with_baseline` adds the MPI
// baseline (AlltoallBaseline), which needs an MPI communicator.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fp8_dispatch_check.hpp"
#include "harness.hpp"

namespace ubep::test {

// bsp and ubep (and the baseline) through the relay, both layouts, against the reference and
// each other, with the network counters: each token crosses to a remote host at most once, so
// rows sent == (token, remote host) pairs.
inline void check_relay_matches_reference(Group& g, int per_host, bool with_baseline) {
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
    std::unique_ptr<AlltoallBaseline> base;
    if (with_baseline) base = std::make_unique<AlltoallBaseline>(g, config_for(c, Algorithm::kBsp));
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
      if (base) {
        EXPECT_EQ(a, run_and_check(g, c, p, nullptr, base.get()));
      }
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

// fp8 codes and scales (given, or cast on send with power-of-two scales) bit-identical to the
// reference codec through bsp and ubep (and the baseline), both layouts and placements; combine
// in bf16 against the reference sum.
inline void check_fp8_matches_reference_codec(Group& g, bool with_baseline) {
  const int R = g.size(), experts = 4 * R, topk = 3;
  const int64_t hidden = 200, capacity = 6;
  std::vector<int64_t> tokens;
  for (int r = 0; r < R; ++r) tokens.push_back((r * 5 + 3) % 7);
  Problem p = make_problem(R, experts, hidden, DType::kBF16, tokens, topk, Routing::kWithDrops, 77);
  // A group that spans hosts: the reference combines in the per-host order of the relay.
  if (g.num_hosts() > 1) p.ranks_per_host = R / g.num_hosts();
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
        auto check = [&](const DispatchResult& r, auto&& combine) {
          check_fp8_dispatch(r, p, q, g.rank());
          std::vector<uint16_t> out = dequantized_bf16(r, hidden);
          CombineArgs ca;
          ca.handle = r.handle;
          ca.x = r.recv_x;
          ca.x.data = out.data();
          ca.x.dtype = DType::kBF16;
          check_fp8_combine(combine(ca), p, q, g.rank(), layout);
        };
        for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
          cfg.algorithm = algo;
          Buffer b(g, cfg);
          check(b.dispatch(a), [&](const CombineArgs& ca) { return b.combine(ca); });
        }
        if (with_baseline) {
          AlltoallBaseline base(g, cfg);
          check(base.dispatch(a), [&](const CombineArgs& ca) { return base.combine(ca); });
        }
      }
  }
}

}  // namespace ubep::test
