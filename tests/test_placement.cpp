// Per-source placement (issue 14): ranges, the compact() step, call agreement, and the property
// that makes it worth having -- a sender never waits for a late peer.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "expect_invalid.hpp"
#include "harness.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

// Source s sends `rows_from(s)` tokens, all to expert 0 of rank 1 (plus nothing else): empty
// sources, a full source (capacity rows to one expert), and ranges must come out exact.
TEST(Placement, RangesWithEmptyAndFullSources) {
  constexpr int R = 3, E = 6, T = 5;
  constexpr int64_t H = 8;
  const int64_t rows_from[R] = {0, T, 2};  // rank 0 empty, rank 1 full
  for (Layout layout : {Layout::kLatency, Layout::kThroughput})
    for (Placement placement : {Placement::kCompact, Placement::kPerSource})
      for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
        SCOPED_TRACE(std::string(layout_name(layout)) + " " + placement_name(placement) + " " +
                     algorithm_name(algo));
        run_on_threads(R, [&](Group& g) {
          BufferConfig cfg;
          cfg.device = test_device();
          cfg.max_tokens_per_rank = T;
          cfg.hidden = H;
          cfg.dtype = DType::kFP32;
          cfg.num_experts = E;
          cfg.max_topk = 1;
          cfg.algorithm = algo;
          cfg.placement = placement;
          Buffer buf(g, cfg);
          const int64_t n = rows_from[g.rank()];
          std::vector<float> x(static_cast<size_t>(n * H));
          for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(g.rank() * 1000 + i);
          std::vector<int64_t> idx(static_cast<size_t>(n), 2);  // expert 2 = rank 1's expert 0
          std::vector<float> w(static_cast<size_t>(n), 1.0f);
          DispatchArgs a;
          a.x = on_test_device(TensorView(x.data(), DType::kFP32, {n, H}));
          a.topk_idx = on_test_device(TensorView(idx.data(), DType::kInt64, {n, 1}));
          a.topk_weights = on_test_device(TensorView(w.data(), DType::kFP32, {n, 1}));
          a.layout = layout;
          DispatchResult r = buf.dispatch(a);
          EXPECT_EQ(r.placement, placement);
          const auto* range = r.recv_range.as<const int64_t>();
          const bool latency = layout == Layout::kLatency;
          int64_t prefix = 0;
          for (int s = 0; s < R; ++s) {
            const int64_t* rr = range + 2 * s;  // expert 0 (latency) or overall (throughput)
            const int64_t want = g.rank() == 1 ? rows_from[s] : 0;
            EXPECT_EQ(rr[1], want) << "source " << s;
            EXPECT_EQ(rr[0], placement == Placement::kPerSource ? s * T : prefix) << "source " << s;
            prefix += want;
            // Every row of the range is the source's token i, in order.
            for (int64_t i = 0; i < rr[1]; ++i) {
              const int64_t row = rr[0] + i;
              const auto* src = r.recv_src.as<const int64_t>() + 2 * row;
              EXPECT_EQ(src[0], s);
              EXPECT_EQ(src[1], i);
              EXPECT_EQ(r.recv_x.as<const float>()[row * H + 3],
                        static_cast<float>(s * 1000 + i * H + 3));
            }
          }
          if (latency && g.rank() == 1) {
            EXPECT_EQ(r.recv_count.as<const int64_t>()[0], T + 2);
          }
          // compact(): the valid rows, dense, by (expert,) source, token.
          TensorView packed = buf.compact();
          ASSERT_EQ(packed.dim(0), g.rank() == 1 ? T + 2 : 0);
          for (int64_t i = 0; i < packed.dim(0); ++i) {
            const int s = i < T ? 1 : 2;
            const int64_t t = i < T ? i : i - T;
            EXPECT_EQ(packed.as<const float>()[i * H], static_cast<float>(s * 1000 + t * H));
          }
          // Combine from compact() order equals combine from the placement's own order.
          CombineArgs ca{packed, r.handle, /*compacted=*/true};
          TensorView y = buf.combine(ca);
          for (int64_t t = 0; t < n; ++t)
            for (int64_t h = 0; h < H; ++h)
              EXPECT_EQ(y.as<const float>()[t * H + h], x[static_cast<size_t>(t * H + h)]);
        });
      }
}

// Ranks 1..R-1 call dispatch_send while rank 0 has not started its call yet. With per-source
// placement their sends must complete anyway (an event order, not a timing); with compact
// placement they must not complete before rank 0 arrived (they need its count records).
void late_rank_case(Placement placement) {
  constexpr int R = 4;
  std::atomic<int> sent_early{0};
  std::atomic<bool> rank0_started{false};
  GroupOptions opts;
  opts.timeout = std::chrono::seconds(20);
  run_on_threads(
      R,
      [&](Group& g) {
        BufferConfig cfg;
        cfg.device = test_device();
        cfg.max_tokens_per_rank = 16;
        cfg.hidden = 32;
        cfg.dtype = DType::kFP32;
        cfg.num_experts = 8;
        cfg.max_topk = 2;
        cfg.placement = placement;
        Buffer buf(g, cfg);
        const Problem p =
            make_problem(R, 8, 32, DType::kFP32, {16, 16, 16, 16}, 2, Routing::kUniform, 7);
        for (int call = 0; call < 3; ++call) {
          const DispatchArgs a =
              p.inputs[static_cast<size_t>(g.rank())].args(DType::kFP32, 32, Layout::kLatency);
          if (g.rank() == 0) {
            if (placement == Placement::kPerSource) {
              // Away until every other rank's send has completed (bounded).
              const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
              while (sent_early.load() < (R - 1) * (call + 1) &&
                     std::chrono::steady_clock::now() < deadline)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
              EXPECT_EQ(sent_early.load(), (R - 1) * (call + 1))
                  << "call " << call << ": a sender waited for the late rank 0";
            } else {
              std::this_thread::sleep_for(std::chrono::milliseconds(30));
            }
            rank0_started.store(true);
            buf.dispatch_send(a);
          } else {
            buf.dispatch_send(a);
            if (placement == Placement::kCompact) {
              EXPECT_TRUE(rank0_started.load()) << "compact send finished before rank 0 came";
            }
            sent_early.fetch_add(1);
          }
          DispatchResult r = buf.dispatch_recv();
          TensorView out = buf.combine_buffer();
          std::memcpy(out.data, r.recv_x.data, r.recv_x.bytes());
          buf.combine({out, r.handle});
          // Everyone is done with this call before rank 0 may be late again.
          g.barrier();
          if (g.rank() == 0) rank0_started.store(false);
          g.barrier();
        }
      },
      opts);
}

TEST(Placement, PerSourceSendsNeverWaitForALateRank) { late_rank_case(Placement::kPerSource); }
TEST(Placement, CompactSendsWaitForLowerRanks) { late_rank_case(Placement::kCompact); }

// The receive hook per piece: with per-source placement, ranks 1..R-1 get every range that
// ranks 1..R-1 send them -- rows valid, (begin, count) equal to the final recv_range -- while
// rank 0 has not started its call (event order: rank 0 waits for them, bounded). Compact
// placement only checks the ranges (they need rank 0's counts).
void receive_hook_case(Placement placement, Layout layout) {
  constexpr int R = 4;
  Case c;
  c.capacity = 16;
  c.hidden = 32;
  c.experts = 8;
  c.topk = 2;
  c.layout = layout;
  c.placement = placement;
  const bool per_source = placement == Placement::kPerSource;
  const bool latency = layout == Layout::kLatency;
  std::atomic<int> hooks_done{0};
  run_on_threads(R, [&](Group& g) {
    Buffer buf(g, config_for(c, Algorithm::kUbep));
    const int El = buf.num_local_experts();
    const Problem p = make_problem(R, c.experts, c.hidden, c.dtype, {16, 9, 0, 16}, c.topk,
                                   Routing::kUniform, 11);
    const ExpectedDispatch want = expected_dispatch(p, g.rank());
    for (int call = 0; call < 3; ++call) {
      const DispatchArgs a =
          p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, layout);
      const int first = g.rank() != 0 && per_source ? 1 : 0;  // sources waited for early
      if (g.rank() == 0 && per_source) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (hooks_done.load() < (R - 1) * (call + 1) &&
               std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        EXPECT_EQ(hooks_done.load(), (R - 1) * (call + 1))
            << "call " << call << ": a receive hook waited for the late rank 0";
      }
      buf.dispatch_send(a);
      std::vector<std::array<int64_t, 2>> seen;
      const DispatchResult pending = latency ? buf.pending_dispatch() : DispatchResult{};
      for (int e = 0; e < (latency ? El : 1); ++e)
        for (int s = first; s < R; ++s) {
          const std::array<int64_t, 2> range = buf.wait_recv_range(s, e);
          seen.push_back(range);
          if (!latency) continue;  // throughput views are known only after dispatch_recv
          // The owner writes recv_src (LatencyRecord): the hook's rows must carry it already.
          std::vector<int64_t> tokens;  // source s's tokens for expert e, in order
          for (const auto& row : want.expert_rows[static_cast<size_t>(e)])
            if (row[0] == s) tokens.push_back(row[1]);
          ASSERT_EQ(range[1], static_cast<int64_t>(tokens.size())) << "expert " << e;
          for (int64_t i = 0; i < range[1]; ++i) {
            const auto* src =
                pending.recv_src.as<const int64_t>() + 2 * (e * R * c.capacity + range[0] + i);
            EXPECT_EQ(src[0], s) << "expert " << e << " row " << range[0] + i;
            EXPECT_EQ(src[1], tokens[static_cast<size_t>(i)])
                << "expert " << e << " row " << range[0] + i;
          }
        }
      if (g.rank() != 0) hooks_done.fetch_add(1);
      const DispatchResult r = buf.dispatch_recv();
      size_t i = 0;
      for (int e = 0; e < (latency ? El : 1); ++e)
        for (int s = first; s < R; ++s, ++i) {
          const int64_t* want = r.recv_range.as<const int64_t>() + 2 * (e * R + s);
          EXPECT_EQ(seen[i][0], want[0]) << "expert " << e << " source " << s;
          EXPECT_EQ(seen[i][1], want[1]) << "expert " << e << " source " << s;
        }
      expect_invalid([&] { buf.wait_recv_range(0, 0); }, {"no dispatch_send outstanding"});
      run_and_check(g, c, p, &buf, nullptr);  // the buffer stays right for whole calls
      g.barrier();
    }
  });
}

TEST(Placement, ReceiveHookPerSourceNeverWaitsForALateRank) {
  receive_hook_case(Placement::kPerSource, Layout::kLatency);
  receive_hook_case(Placement::kPerSource, Layout::kThroughput);
}
TEST(Placement, ReceiveHookCompactRanges) {
  receive_hook_case(Placement::kCompact, Layout::kLatency);
  receive_hook_case(Placement::kCompact, Layout::kThroughput);
}

TEST(Placement, ReceiveHookRejectsBadArguments) {
  run_on_threads(2, [&](Group& g) {
    Case c;
    c.layout = Layout::kLatency;
    Buffer buf(g, config_for(c, Algorithm::kUbep));
    const Problem p =
        make_problem(2, c.experts, c.hidden, c.dtype, {8, 8}, c.topk, Routing::kUniform, 5);
    buf.dispatch_send(p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout));
    expect_invalid([&] { buf.wait_recv_range(2, 0); }, {"source 2", "[0, 2)"});
    expect_invalid([&] { buf.wait_recv_range(-1, 0); }, {"source -1"});
    expect_invalid([&] { buf.wait_recv_range(0, 4); }, {"local_expert 4", "[0, 4)"});
    buf.dispatch_recv();  // a rejected hook leaves the call intact
  });
}

// Ranks that make different calls are named, for both algorithms, instead of misreading rows.
TEST(Placement, MismatchedLayoutIsNamed) {
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
    run_on_threads(2, [&](Group& g) {
      BufferConfig cfg;
      cfg.device = test_device();
      cfg.max_tokens_per_rank = 4;
      cfg.hidden = 8;
      cfg.dtype = DType::kFP32;
      cfg.num_experts = 4;
      cfg.max_topk = 1;
      cfg.algorithm = algo;
      Buffer buf(g, cfg);
      const Problem p = make_problem(2, 4, 8, DType::kFP32, {4, 4}, 1, Routing::kUniform, 3);
      const Layout mine = g.rank() == 0 ? Layout::kLatency : Layout::kThroughput;
      const DispatchArgs a = p.inputs[static_cast<size_t>(g.rank())].args(DType::kFP32, 8, mine);
      expect_invalid([&] { buf.dispatch(a); }, {"rank ", "made a different call"});
    });
  }
}

// One buffer, calls of changing size and layout: receive_counts rewrites only the ranges of
// experts that received rows in a latency call or the one before (dispatch_call.cpp), so every
// (expert, source) range and count must still be exact after a large call, a one-token call, an
// empty call, a throughput call in between and a call that a peer made differently.
TEST(Placement, RangesStayExactAcrossCallsOfChangingSize) {
  constexpr int R = 3;
  for (Placement placement : {Placement::kAuto, Placement::kCompact, Placement::kPerSource})
    for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
      SCOPED_TRACE(std::string(placement_name(placement)) + " " + algorithm_name(algo));
      Case c;
      c.experts = 3 * 40;  // 40 local experts: count records of 3 cache lines
      c.hidden = 8;
      c.capacity = 6;
      c.topk = 2;
      c.placement = placement;
      run_on_threads(R, [&](Group& g) {
        Buffer buf(g, config_for(c, algo));
        std::mt19937_64 same_on_every_rank(91);
        for (int call = 0; call < 24; ++call) {
          Case k = c;
          const uint64_t pick = same_on_every_rank();
          k.layout = pick % 4 == 0 ? Layout::kThroughput : Layout::kLatency;
          const int64_t sizes[4] = {0, 1, 2, c.capacity};
          for (int r = 0; r < R; ++r) k.tokens.push_back(sizes[(pick >> (2 * r + 2)) % 4]);
          k.routing = (pick >> 9) % 2 ? Routing::kHot : Routing::kUniform;
          k.seed = pick;
          SCOPED_TRACE(k.describe() + " call " + std::to_string(call));
          // Rank 1 makes the other layout: named, and the next calls exact. The host engine
          // keeps the buffer after it; the CUDA kernels' engine breaks it (create a new one).
          if (call == 9 && test_device().type == DeviceType::kCpu) {
            const Problem p = make_problem(R, k.experts, k.hidden, k.dtype, {1, 1, 1}, k.topk,
                                           Routing::kUniform, 5);
            const Layout mine = g.rank() == 1 ? Layout::kThroughput : Layout::kLatency;
            const DispatchArgs a = p.inputs[static_cast<size_t>(g.rank())].args(k.dtype, 8, mine);
            expect_invalid([&] { buf.dispatch(a); }, {"made a different call"});
            g.barrier();
            continue;
          }
          const Problem p =
              make_problem(R, k.experts, k.hidden, k.dtype, k.tokens, k.topk, k.routing, k.seed);
          run_and_check(g, k, p, &buf, nullptr);
          g.barrier();
        }
      });
    }
}

}  // namespace
}  // namespace ubep::test
