// ubep-bench's input handling and measurements, and the MPI baseline's validation and worker
// split (tools/bench, src/baseline).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "baseline/exchange.hpp"
#include "bench/bench.hpp"
#include "expect_invalid.hpp"
#include "harness.hpp"
#include "ubep/baseline.hpp"
#include "ubep/buffer.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

tools::BenchCommand parse(std::vector<std::string> args) {
  std::vector<const char*> argv{"ubep-bench"};
  for (auto& a : args) argv.push_back(a.c_str());
  return tools::parse_bench_args(static_cast<int>(argv.size()), argv.data());
}

TEST(BenchFlags, BadValuesNameTheFlagAndTheValue) {
  expect_invalid([] { parse({"--hidden", "0"}); }, {"--hidden", "got 0"});
  expect_invalid([] { parse({"--hidden", "-3"}); }, {"--hidden", "got -3"});
  expect_invalid([] { parse({"--tokens", "99999999999"}); }, {"--tokens", "99999999999"});
  expect_invalid([] { parse({"--tokens", "-1"}); }, {"--tokens", "got -1"});
  expect_invalid([] { parse({"--timeout", "-1"}); }, {"--timeout", "got -1"});
  expect_invalid([] { parse({"--timeout", "0"}); }, {"--timeout", "got 0"});
  expect_invalid([] { parse({"--ranks", "0"}); }, {"--ranks", "got 0"});
  expect_invalid([] { parse({"--workers", "-2"}); }, {"--workers", "got -2"});
  expect_invalid([] { parse({"--topk", "12x"}); }, {"bad number '12x'", "--topk"});
  expect_invalid([] { parse({"--algo", "mpi,foo"}); }, "'foo'");
  expect_invalid([] { parse({"--routing", "zipf"}); }, "'zipf'");
  expect_invalid([] { parse({"--experts", "4", "--topk", "8"}); }, "exceeds --experts 4");
  expect_invalid([] { parse({"--iters"}); }, "missing value after --iters");
  // Fits the int range but not the memory: refused before anything is sized.
  expect_invalid([] { parse({"--tokens", "1000000", "--hidden", "1000000"}); }, "GB per rank");
}

TEST(BenchFlags, GoodValuesAreKept) {
  const auto c = parse({"--workload", "tiny", "--hidden", "64", "--timeout", "2.5", "--workers",
                        "3", "--ranks", "4"});
  EXPECT_EQ(c.opt.tokens, 1);
  EXPECT_EQ(c.opt.hidden, 64);
  EXPECT_DOUBLE_EQ(c.timeout_s, 2.5);
  EXPECT_EQ(c.opt.workers, 3);
  EXPECT_EQ(c.ranks, 4);
  EXPECT_TRUE(parse({"--help"}).help);
}

TEST(BenchFlags, BoundExpertIsMatchOrCopy) {
  EXPECT_TRUE(parse({}).opt.bound_expert_match);
  EXPECT_FALSE(parse({"--bound-expert", "copy"}).opt.bound_expert_match);
  EXPECT_TRUE(parse({"--bound-expert", "match"}).opt.bound_expert_match);
  expect_invalid([] { parse({"--bound-expert", "gemm"}); }, {"--bound-expert", "'gemm'"});
}

TEST(BenchFlags, RepeatIsParsedAndChecked) {
  EXPECT_EQ(parse({}).opt.repeat, 1);
  EXPECT_EQ(parse({"--repeat", "5"}).opt.repeat, 5);
  expect_invalid([] { parse({"--repeat", "0"}); }, {"--repeat", "got 0"});
}

// Every slice of a run starts with the warm-up calls, not only the first; the timed calls add
// up to --iters, spread as evenly as they divide. The bound harness warms up fully once, then
// at most 2 iterations a slice. Reference: the counts worked out by hand.
TEST(BenchSlices, EverySliceWarmsUpAndTheTimedCallsAddUpToIters) {
  const std::vector<tools::Slice> s = tools::bench_slices(50, 5, 60);
  ASSERT_EQ(s.size(), 5u);
  for (const tools::Slice& x : s) {
    EXPECT_EQ(x.warm, 60);
    EXPECT_EQ(x.timed, 10);
  }
  const std::vector<tools::Slice> uneven = tools::bench_slices(7, 3, 1);
  ASSERT_EQ(uneven.size(), 3u);
  EXPECT_EQ(uneven[0].timed + uneven[1].timed + uneven[2].timed, 7);
  for (const tools::Slice& x : uneven) {
    EXPECT_EQ(x.warm, 1);
    EXPECT_GE(x.timed, 2);
    EXPECT_LE(x.timed, 3);
  }
  // More rounds than iterations: one slice per iteration; no iterations: one slice of warm-up.
  EXPECT_EQ(tools::bench_slices(2, 5, 3).size(), 2u);
  ASSERT_EQ(tools::bench_slices(0, 5, 3).size(), 1u);
  EXPECT_EQ(tools::bench_slices(0, 5, 3)[0].timed, 0);
  EXPECT_EQ(tools::bound_warmup(0, 60), 60);
  EXPECT_EQ(tools::bound_warmup(1, 60), 2);
  EXPECT_EQ(tools::bound_warmup(3, 1), 1);
  EXPECT_EQ(tools::bound_warmup(2, 0), 0);
  expect_invalid([] { tools::bench_slices(10, 0, 1); }, {"rounds 0"});
  expect_invalid([] { tools::bench_slices(10, 2, -1); }, {"warmup -1"});
}

// --repeat's summary: the median of the runs' medians and their range; x_bound the median of each
// run's own ratio (not the ratio of the medians); a bound whose winning kernel changed between
// runs is still one row. Reference: the numbers worked out by hand.
TEST(BenchRepeat, SummaryIsTheMedianOfTheRunsWithTheirRange) {
  auto row = [](const char* impl, const char* variant, const char* op, double us, double xb) {
    tools::BenchRow r;
    r.impl = impl;
    r.variant = variant;
    r.op = op;
    r.dtype = "bf16";
    r.median_us = us;
    r.x_bound = xb;
    return r;
  };
  std::vector<std::vector<tools::BenchRow>> runs = {
      {row("ubep", "", "dispatch", 120, 1.20), row("bound", "memcpy", "dispatch", 100, 1)},
      {row("ubep", "", "dispatch", 100, 1.25), row("bound", "nt-store-64B", "dispatch", 80, 1)},
      {row("ubep", "", "dispatch", 300, 1.10), row("bound", "nt-store-64B", "dispatch", 272, 1)},
      {row("ubep", "", "dispatch", 110, 1.30), row("bound", "memcpy", "dispatch", 85, 1)}};
  const auto sum = tools::summarize_runs(runs);
  ASSERT_EQ(sum.size(), 2u);
  EXPECT_EQ(sum[0].impl, "ubep");
  EXPECT_EQ(sum[0].runs, 4);
  EXPECT_DOUBLE_EQ(sum[0].median_us, 115);  // (110 + 120) / 2
  EXPECT_DOUBLE_EQ(sum[0].run_min_us, 100);
  EXPECT_DOUBLE_EQ(sum[0].run_max_us, 300);
  EXPECT_DOUBLE_EQ(sum[0].x_bound, 1.225);  // (1.20 + 1.25) / 2, not 115 / 92.5
  EXPECT_DOUBLE_EQ(sum[0].x_bound_min, 1.10);
  EXPECT_DOUBLE_EQ(sum[0].x_bound_max, 1.30);
  EXPECT_EQ(sum[1].impl, "bound");
  EXPECT_DOUBLE_EQ(sum[1].median_us, 92.5);  // (85 + 100) / 2
}

// The bench's start barrier (start_barrier.cpp): nobody leaves barrier k before every rank has
// arrived at it, over many rounds with the ranks arriving in random order (3 thread ranks on
// fewer cores, so waiters must also let the others run).
TEST(BenchStartBarrier, NoRankLeavesBeforeAllArrived) {
  constexpr int kRanks = 3, kRounds = 3000;
  std::array<std::atomic<int>, kRanks> arrived{};
  std::atomic<int> early{0};
  run_on_threads(kRanks, [&](Group& g) {
    tools::StartBarrier start(g);
    std::mt19937 rng(static_cast<unsigned>(g.rank()) + 7);
    for (int k = 1; k <= kRounds; ++k) {
      if (rng() % 8 == 0) std::this_thread::yield();
      arrived[static_cast<size_t>(g.rank())].store(k, std::memory_order_relaxed);
      start.wait();
      for (int s = 0; s < kRanks; ++s)
        if (arrived[static_cast<size_t>(s)].load(std::memory_order_relaxed) < k) ++early;
    }
  });
  EXPECT_EQ(early.load(), 0);
}

TEST(BenchBound, SendRowsFollowTheLayout) {
  // 2 tokens, top-2 of 4 experts on 2 ranks (2 per rank). Token 0 -> experts 0, 1 (rank 0
  // twice); token 1 -> experts 1, 3 (ranks 0 and 1).
  const std::vector<int64_t> idx{0, 1, 1, 3};
  const auto lat = tools::send_rows(idx, 2, 2, 4, 2, 0, Layout::kLatency);
  ASSERT_EQ(lat.size(), 4u);  // one row per selected (token, k)
  EXPECT_EQ(lat[0].dest, 1);  // rotated: the next rank first
  EXPECT_EQ(lat[0].token, 1);
  EXPECT_EQ(lat[1].dest, 0);
  const auto thr = tools::send_rows(idx, 2, 2, 4, 2, 0, Layout::kThroughput);
  ASSERT_EQ(thr.size(), 3u);  // one row per (token, destination rank)
}

// The bound puts each row where a real dispatch puts it: every row a rank sends is found at
// its place_rows position in the destination's recv_x, and each destination's runs are exactly
// its recv_range entries (both layouts, both placements, 3 thread ranks, a skewed routing).
class PlaceRows : public ::testing::TestWithParam<std::tuple<Layout, Placement>> {};

TEST_P(PlaceRows, RowsLandWhereTheCallPutsThem) {
  const auto [layout, placement] = GetParam();
  constexpr int R = 3, E = 6, K = 2, H = 64;
  constexpr int64_t T = 5;
  std::vector<const char*> recv(R);  // each rank's recv_x, for the senders to look into
  run_on_threads(R, [&, layout = layout, placement = placement](Group& g) {
    const int me = g.rank();
    std::vector<int64_t> idx;
    std::vector<float> w;
    tools::make_routing(T - me, K, E, "hot", 7 + static_cast<uint64_t>(me), &idx, &w);
    const int64_t n = T - me;  // a different token count per rank
    std::vector<uint16_t> x(static_cast<size_t>(n * H));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(me * 1000 + i);
    BufferConfig cfg;
    cfg.max_tokens_per_rank = T;
    cfg.hidden = H;
    cfg.num_experts = E;
    cfg.max_topk = K;
    cfg.placement = placement;
    cfg.enable_latency_layout = layout == Layout::kLatency;
    Buffer buf(g, cfg);
    DispatchArgs a;
    a.x = TensorView(x.data(), DType::kBF16, {n, H});
    a.topk_idx = TensorView(idx.data(), DType::kInt64, {n, K});
    a.topk_weights = TensorView(w.data(), DType::kFP32, {n, K});
    a.layout = layout;
    const DispatchResult r = buf.dispatch(a);
    const auto sends = tools::send_rows(idx, n, K, E, R, me, layout);
    tools::BoundShape shape;
    shape.layout = layout;
    shape.placement = placement;
    shape.local_experts = E / R;
    shape.max_tokens = T;
    const tools::RowPlaces p = tools::place_rows(g, sends, shape);
    recv[static_cast<size_t>(me)] = static_cast<const char*>(r.recv_x.data);
    g.barrier();
    ASSERT_EQ(p.pos.size(), sends.size());
    for (size_t i = 0; i < sends.size(); ++i) {
      const char* row = recv[static_cast<size_t>(sends[i].dest)] + p.pos[i] * H * 2;
      EXPECT_EQ(std::memcmp(row, &x[static_cast<size_t>(sends[i].token * H)], H * 2), 0)
          << "rank " << me << " row " << i << " to " << sends[i].dest << " at " << p.pos[i];
      EXPECT_LT(p.pos[i], p.region_rows);
    }
    // This rank's runs: its recv_range entries with rows, at the layout's offsets.
    std::vector<std::pair<int64_t, int64_t>> want;
    const auto* range = r.recv_range.as<const int64_t>();
    const int64_t El = layout == Layout::kLatency ? E / R : 1;
    for (int64_t e = 0; e < El; ++e)
      for (int s = 0; s < R; ++s) {
        const int64_t* rr = range + 2 * (e * R + s);
        if (rr[1] > 0)
          want.emplace_back((layout == Layout::kLatency ? e * R * T : 0) + rr[0], rr[1]);
      }
    EXPECT_EQ(p.runs, want) << "rank " << me;
    g.barrier();  // nobody frees its buffer while a peer still reads it
  });
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PlaceRows,
    ::testing::Combine(::testing::Values(Layout::kLatency, Layout::kThroughput),
                       ::testing::Values(Placement::kPerSource, Placement::kCompact)));

// 8 tokens of hidden 256, top-2 of 8 experts, ubep only, a few iterations: the bound tests' run.
tools::BenchOptions tiny_bench_options() {
  tools::BenchOptions o;
  o.tokens = 8;
  o.hidden = 256;
  o.experts = 8;
  o.topk = 2;
  o.iters = 3;
  o.warmup = 1;
  o.algos = {"ubep"};
  return o;
}

// fp8: the dispatch bound moves what the call moves, codes and scales (as the call's window
// holds them, apart); the combine bound moves bf16 rows.
TEST(BenchBound, Fp8DispatchBoundMovesCodesAndScales) {
  std::vector<std::vector<tools::BenchRow>> got(2);
  run_on_threads(2, [&](Group& g) {
    tools::BenchOptions o = tiny_bench_options();
    o.dtype = DType::kFP8E4M3;
    o.quiet = true;
    got[static_cast<size_t>(g.rank())] = tools::run_bench(g, o);
  });
  for (const auto& rows : got) {
    double dispatch_bound = 0, combine_bound = 0, ubep_dispatch = 0;
    for (const auto& r : rows) {
      if (r.impl == "bound") (r.op == "dispatch" ? dispatch_bound : combine_bound) = r.bytes;
      if (r.impl == "ubep" && r.op == "dispatch") ubep_dispatch = r.bytes;
    }
    EXPECT_DOUBLE_EQ(dispatch_bound, 16.0 * (256 + 2 * 4));  // 16 rows of 256 codes + 2 scales
    EXPECT_DOUBLE_EQ(ubep_dispatch, dispatch_bound);
    EXPECT_DOUBLE_EQ(combine_bound, 16.0 * 256 * 2);  // bf16 rows
  }
}

TEST(BenchBound, BoundAndFloorAreMeasuredOnEveryRank) {
  std::vector<std::vector<tools::BenchRow>> got(2);
  run_on_threads(2, [&](Group& g) {
    tools::BenchOptions o = tiny_bench_options();
    o.quiet = true;
    got[static_cast<size_t>(g.rank())] = tools::run_bench(g, o);
  });
  for (const auto& rows : got) {
    int bounds = 0, floors = 0;
    for (const auto& r : rows) {
      if (r.impl == "bound") {
        ++bounds;
        EXPECT_TRUE(r.variant == "memcpy" || r.variant.rfind("nt-store-", 0) == 0 ||
                    (r.op == "combine" && r.variant.rfind("or-reduce", 0) == 0))
            << r.variant;
        EXPECT_GT(r.median_us, 0);
        EXPECT_DOUBLE_EQ(r.bytes, 16.0 * 256 * 2);  // 8 tokens x top-2 rows of 512 bytes
      }
      if (r.impl == "floor") {
        ++floors;
        EXPECT_GT(r.median_us, 0);
      }
      if (r.impl == "ubep") {
        EXPECT_GT(r.x_bound, 0) << r.op;
      }
    }
    EXPECT_EQ(bounds, 2);
    EXPECT_EQ(floors, 1);
  }
}

// A bulk exchange plugged under the baseline (as ubep-bench's oneCCL one is): the in-process
// exchange, named "plugged", that can halve or double the first 16 values of the first row it
// receives (the low exponent bit of 16 bf16 values: no rounding can hide that).
class PluggedExchange : public BulkExchange {
 public:
  PluggedExchange(Group& g, bool corrupt) : inner_(baseline::make_exchange(g)), corrupt_(corrupt) {}
  void alltoallv(const void* send, const int64_t* send_bytes, const int64_t* send_offsets,
                 void* recv, const int64_t* recv_bytes, const int64_t* recv_offsets) override {
    inner_->alltoallv(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    ++calls;
    if (!corrupt_ || recv_bytes[0] < 512) return;  // rows, not the counts
    auto* row = static_cast<unsigned char*>(recv) + recv_offsets[0];
    for (int v = 0; v < 16; ++v) row[2 * v + 1] ^= 1;
    corrupt_ = false;
  }
  const char* name() const override { return "plugged"; }
  inline static std::atomic<int> calls{0};

 private:
  std::unique_ptr<BulkExchange> inner_;
  bool corrupt_;
};

// ubep-bench --algo oneccl runs whatever exchange the build registered under that name: its rows
// carry the exchange's name, and a run whose results differ from the other implementations' fails.
TEST(BenchExchange, PluggedExchangeRunsAndWrongResultsFailTheRun) {
  for (const bool corrupt : {false, true}) {
    SCOPED_TRACE(corrupt ? "corrupting exchange" : "faithful exchange");
    tools::register_exchange("oneccl", [corrupt](Group& g) {
      return std::make_unique<PluggedExchange>(g, corrupt && g.rank() == 1);
    });
    PluggedExchange::calls = 0;
    std::vector<std::vector<tools::BenchRow>> got(2);
    std::vector<std::string> errors(2);
    run_on_threads(2, [&](Group& g) {
      tools::BenchOptions o = tiny_bench_options();
      o.quiet = true;
      o.algos = {"ubep", "oneccl"};
      try {
        got[static_cast<size_t>(g.rank())] = tools::run_bench(g, o);
      } catch (const SystemError& e) {
        errors[static_cast<size_t>(g.rank())] = e.what();
      }
    });
    EXPECT_GT(PluggedExchange::calls.load(), 0);
    for (int r = 0; r < 2; ++r) {
      if (corrupt) {
        EXPECT_NE(errors[r].find("plugged's combine output differs from ubep's"), std::string::npos)
            << errors[r];
        continue;
      }
      EXPECT_EQ(errors[r], "");
      int plugged = 0;
      for (const auto& row : got[r]) plugged += row.impl == "plugged";
      EXPECT_EQ(plugged, 2);  // dispatch and combine
    }
  }
}

TEST(Baseline, BadConfigIsInvalidArgumentNotACrash) {
  run_on_threads(1, [&](Group& g) {
    BufferConfig c;
    c.max_tokens_per_rank = 4;
    c.hidden = 0;  // divided by in the latency combine: SIGFPE before the check
    c.num_experts = 4;
    c.max_topk = 2;
    expect_invalid([&] { AlltoallBaseline b(g, c); }, {"hidden", "got 0"});
    c.hidden = 16;
    c.max_topk = 0;
    expect_invalid([&] { AlltoallBaseline b(g, c); }, {"max_topk", "got 0"});
    c.max_topk = 2;
    c.max_tokens_per_rank = 0;
    expect_invalid([&] { AlltoallBaseline b(g, c); }, "max_tokens_per_rank");
    c.max_tokens_per_rank = 4;
    c.num_workers = -5;
    expect_invalid([&] { AlltoallBaseline b(g, c); }, {"num_workers", "got -5"});
  });
}

TEST(Baseline, NullPointersAreInvalidArgument) {
  run_on_threads(1, [&](Group& g) {
    BufferConfig c;
    c.max_tokens_per_rank = 4;
    c.hidden = 16;
    c.dtype = DType::kFP32;
    c.num_experts = 4;
    c.max_topk = 2;
    AlltoallBaseline b(g, c);
    std::vector<float> x(4 * 16, 1.0f), w(8, 0.5f);
    std::vector<int64_t> idx{0, 1, 1, 2, 2, 3, 3, 0};
    DispatchArgs a;
    a.x = TensorView(x.data(), DType::kFP32, {4, 16});
    a.topk_idx = TensorView(nullptr, DType::kInt64, {4, 2});
    a.topk_weights = TensorView(w.data(), DType::kFP32, {4, 2});
    expect_invalid([&] { b.dispatch(a); }, "topk_idx has no data");
    a.topk_idx = TensorView(idx.data(), DType::kInt64, {4, 2});
    a.topk_weights = TensorView(nullptr, DType::kFP32, {4, 2});
    expect_invalid([&] { b.dispatch(a); }, "topk_weights has no data");
    a.topk_weights = TensorView(w.data(), DType::kFP32, {4, 2});
    a.x = TensorView(nullptr, DType::kFP32, {4, 16});
    expect_invalid([&] { b.dispatch(a); }, "x has no data");
    a.x = TensorView(x.data(), DType::kFP32, {4, 16});
    const DispatchResult r = b.dispatch(a);  // still usable after the rejections
    CombineArgs ca{r.recv_x, r.handle};
    ca.x.data = nullptr;
    expect_invalid([&] { b.combine(ca); }, "x has no data");
    ca.x = r.recv_x;
    EXPECT_EQ(b.combine(ca).dim(0), 4);
  });
}

// The worker split must not change a bit: same outputs with 0 and 2 helpers per rank, checked
// against the reference by the harness too.
TEST(Baseline, WorkersGiveTheSameBits) {
  for (Layout layout : {Layout::kThroughput, Layout::kLatency}) {
    Case c;
    c.experts = 12;
    c.hidden = 40;
    c.dtype = DType::kBF16;
    c.capacity = 9;
    c.topk = 3;
    c.layout = layout;
    c.tokens = {9, 0, 5};
    const int ranks = 3;
    const Problem p =
        make_problem(ranks, c.experts, c.hidden, c.dtype, c.tokens, c.topk, c.routing, c.seed);
    std::vector<std::vector<char>> y0(ranks), y2(ranks);
    run_on_threads(ranks, [&](Group& g) {
      BufferConfig cfg = config_for(c, Algorithm::kBsp);
      cfg.num_workers = 0;
      AlltoallBaseline b0(g, cfg);
      cfg.num_workers = 2;
      AlltoallBaseline b2(g, cfg);
      y0[static_cast<size_t>(g.rank())] = run_and_check(g, c, p, nullptr, &b0);
      y2[static_cast<size_t>(g.rank())] = run_and_check(g, c, p, nullptr, &b2);
    });
    for (int r = 0; r < ranks; ++r)
      EXPECT_EQ(y0[static_cast<size_t>(r)], y2[static_cast<size_t>(r)])
          << "rank " << r << " layout " << layout_name(layout);
  }
}

// The baseline's own bulk exchange (it moved out of Group): on thread ranks a one-copy exchange
// of any byte counts, including zero; a receiver expecting another count than its peer sends
// gets InvalidArgument naming both ranks, after every rank has left the exchange, so the next
// exchange works.
TEST(Baseline, ThreadExchangeMovesVariableBytes) {
  const int R = 3;
  run_on_threads(R, [&](Group& g) {
    auto ex = baseline::make_exchange(g);
    EXPECT_STREQ(ex->name(), "a2a");
    const int me = g.rank();
    auto bytes = [](int from, int to) { return static_cast<int64_t>((from * 2 + to) % 4 * 3); };
    std::vector<int64_t> sb(R), so(R), rb(R), ro(R);
    int64_t st = 0, rt = 0;
    for (int p = 0; p < R; ++p) {
      sb[p] = bytes(me, p);
      so[p] = st;
      st += sb[p];
      rb[p] = bytes(p, me);
      ro[p] = rt;
      rt += rb[p];
    }
    std::vector<char> send(static_cast<size_t>(st) + 1), recv(static_cast<size_t>(rt) + 1, 0);
    for (int p = 0; p < R; ++p)
      for (int64_t i = 0; i < sb[p]; ++i) send[static_cast<size_t>(so[p] + i)] = char(me * 16 + p);
    for (int round = 0; round < 2; ++round) {
      ex->alltoallv(send.data(), sb.data(), so.data(), recv.data(), rb.data(), ro.data());
      for (int p = 0; p < R; ++p)
        for (int64_t i = 0; i < rb[p]; ++i)
          ASSERT_EQ(recv[static_cast<size_t>(ro[p] + i)], char(p * 16 + me)) << "from " << p;
    }
    std::vector<int64_t> wrong = rb;
    if (me == 0) wrong[1] += 1;
    if (me == 0)
      expect_invalid(
          [&] {
            ex->alltoallv(send.data(), sb.data(), so.data(), recv.data(), wrong.data(), ro.data());
          },
          {"rank 1 sends", "which expects"});
    else
      ex->alltoallv(send.data(), sb.data(), so.data(), recv.data(), wrong.data(), ro.data());
    ex->alltoallv(send.data(), sb.data(), so.data(), recv.data(), rb.data(), ro.data());
  });
}

}  // namespace
}  // namespace ubep::test
