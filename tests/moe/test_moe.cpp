// The expert layer against an independent reference, serial vs overlapped (bitwise), against
// Buffer's latency combine (bitwise), padding edge cases, BLAS FFN and bad input. Ranks are
// threads; the harness is moe_harness.hpp, the epoch and stress runs test_moe_epochs.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>

#include "moe_harness.hpp"

namespace ubep::moe {
namespace {

using namespace test;

struct Param {
  int ranks, topk;
  RouterMode mode;
};

class ExpertLayerModes : public ::testing::TestWithParam<Param> {};

TEST_P(ExpertLayerModes, BitIdenticalToReferenceAndSerial) {
  const Param p = GetParam();
  for (DType dt : {DType::kBF16, DType::kFP32})
    for (int64_t tile : {1, 3, 8}) {
      Case c;
      c.ranks = p.ranks;
      c.topk = p.topk;
      c.mode = p.mode;
      c.experts = std::max(8, 4 * p.ranks);
      c.dtype = dt;
      c.tile = tile;
      c.compute_workers = tile == 3 ? 2 : 1;
      c.comm_workers = tile == 8 ? 2 : 1;
      c.seed = static_cast<uint64_t>(tile * 17 + p.topk + 100 * p.ranks + static_cast<int>(p.mode));
      run_case(c);
    }
}

std::vector<Param> params() {
  std::vector<Param> ps;
  for (int ranks : {1, 2, 3, 4})
    for (int topk : {1, 2, 8})
      for (RouterMode m :
           {RouterMode::kBalanced, RouterMode::kModerateSkew, RouterMode::kStressSkew})
        ps.push_back({ranks, topk, m});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(All, ExpertLayerModes, ::testing::ValuesIn(params()),
                         [](const auto& info) {
                           return "r" + std::to_string(info.param.ranks) + "_top" +
                                  std::to_string(info.param.topk) + "_" +
                                  router_mode_name(info.param.mode);
                         });

TEST(ExpertLayer, LocalFirstAblationMatches) {
  Case c;
  c.remote_first = false;
  c.ranks = 3;
  c.experts = 12;
  run_case(c);
}

// Hand-made routing: expert 0 of rank 0 gets no rows, expert 1 of rank 0 gets fewer rows than a
// tile from rank 1, expert 2 of rank 0 gets exactly one tile from rank 1, expert 3 more than a
// tile, and rank 1 has zero tokens in one call.
TEST(ExpertLayer, PaddingEdgeCases) {
  const int64_t H = 8, tile = 4;
  const int experts = 8, K = 2;
  const DType dt = DType::kFP32;
  run_on_threads(2, [&](Group& g) {
    BufferConfig bc;
    bc.max_tokens_per_rank = 8;
    bc.hidden = H;
    bc.dtype = dt;
    bc.num_experts = experts;
    bc.max_topk = K;
    Buffer buffer(g, bc);
    ExpertLayerConfig lc;
    lc.max_tokens_per_rank = 8;
    lc.hidden = H;
    lc.dtype = dt;
    lc.num_experts = experts;
    lc.max_topk = K;
    lc.tile_rows = tile;
    lc.comm_workers = 2;
    ExpertLayer layer(g, lc);
    const TileFn fn = test_tile_fn(g.rank(), 4, H);
    for (int variant = 0; variant < 2; ++variant) {
      std::vector<RankData> all(2);
      // Rank 1: tokens 0..2 -> expert 1 (3 rows < tile); tokens 3..6 -> expert 2 (exactly a tile);
      // every token also -> expert 3 (7 rows: a full tile plus 3 of padding), and token 7 ->
      // expert 5 (local to rank 1) only.
      RankData& r1 = all[1];
      r1.tokens = variant == 0 ? 8 : 0;
      r1.topk = K;
      for (int64_t t = 0; t < r1.tokens; ++t) {
        const int64_t e0 = t < 3 ? 1 : t < 7 ? 2 : 5;
        r1.idx.push_back(e0);
        r1.idx.push_back(t < 7 ? 3 : -1);
        r1.w.push_back(0.75f);
        r1.w.push_back(0.25f);
      }
      // Rank 0: two tokens for expert 6 (remote, rank 1) and expert 3 (local).
      RankData& r0 = all[0];
      r0.tokens = 2;
      r0.topk = K;
      r0.idx = {6, 3, 3, -1};
      r0.w = {0.5f, 0.5f, 1.0f, 0.0f};
      for (auto* r : {&r0, &r1}) {
        r->x.resize(static_cast<size_t>(r->tokens * H) * 4);
        for (int64_t i = 0; i < r->tokens * H; ++i)
          store(r->x.data(), i, 0.25f * static_cast<float>(i % 13) - 1.0f, dt);
      }
      const RankData& me = all[static_cast<size_t>(g.rank())];
      DispatchArgs a;
      a.x = TensorView(me.x.data(), dt, {me.tokens, H});
      a.topk_idx = TensorView(me.idx.data(), DType::kInt64, {me.tokens, K});
      a.topk_weights = TensorView(me.w.data(), DType::kFP32, {me.tokens, K});
      DispatchResult d = buffer.dispatch(a);
      const auto want = reference_y(all, g.rank(), H, dt);
      for (Schedule s : {Schedule::kSerial, Schedule::kOverlapped}) {
        TensorView y = layer.run(d, a.topk_idx, a.topk_weights, fn, s);
        EXPECT_TRUE(same_bits(y, want))
            << "rank " << g.rank() << " variant " << variant << " " << schedule_name(s);
        const LayerStats& st = layer.last_stats();
        if (g.rank() == 0 && variant == 0) {
          // Expert 0: none. Expert 1: 3 remote rows (1 tile). Expert 2: 4 remote (1 tile).
          // Expert 3: 7 remote (2 tiles) + 2 local (1 tile).
          EXPECT_EQ(st.rows, 3 + 4 + 7 + 2);
          EXPECT_EQ(st.tiles, 5);
          EXPECT_EQ(st.remote_tiles, 4);
          EXPECT_EQ(st.padded_rows, 5 * tile);
          EXPECT_EQ(st.remote_rows, 14);
        }
        if (g.rank() == 0 && variant == 1) {
          EXPECT_EQ(st.rows, 2);  // its own tokens 0 and 1 -> expert 3
          EXPECT_EQ(st.remote_tiles, 0);
        }
      }
    }
  });
}

// The bundled BLAS FFN: serial and overlapped agree bitwise; both match a double-precision
// reference within bf16 rounding.
TEST(ExpertFfnTest, GatedAndSingleMatchReference) {
  for (FfnKind kind : {FfnKind::kGated, FfnKind::kSingle}) {
    const int64_t H = 32, I = 48, cap = 16;
    const int experts = 4, K = 2, ranks = 2;
    const DType dt = DType::kBF16;
    std::vector<RankData> all;
    for (int r = 0; r < ranks; ++r)
      all.push_back(make_rank(RouterMode::kModerateSkew, experts, K, cap - r, H, dt,
                              5 + static_cast<uint64_t>(r)));
    // Reference FFN weights from a full-size ExpertFfn holding every global expert.
    // One scratch per rank thread (worker = rank): the FFN is called from both at once.
    ExpertFfn ref_ffn(kind, experts, 0, H, I, ranks, 1, 77);
    run_on_threads(ranks, [&](Group& g) {
      BufferConfig bc;
      bc.max_tokens_per_rank = cap;
      bc.hidden = H;
      bc.dtype = dt;
      bc.num_experts = experts;
      bc.max_topk = K;
      Buffer buffer(g, bc);
      ExpertLayerConfig lc;
      lc.max_tokens_per_rank = cap;
      lc.hidden = H;
      lc.dtype = dt;
      lc.num_experts = experts;
      lc.max_topk = K;
      lc.tile_rows = 4;
      lc.compute_workers = 2;
      ExpertLayer layer(g, lc);
      const int El = layer.num_local_experts();
      ExpertFfn ffn(kind, El, g.rank() * El, H, I, 2, 4, 77);
      const RankData& me = all[static_cast<size_t>(g.rank())];
      DispatchArgs a;
      a.x = TensorView(me.x.data(), dt, {me.tokens, H});
      a.topk_idx = TensorView(me.idx.data(), DType::kInt64, {me.tokens, K});
      a.topk_weights = TensorView(me.w.data(), DType::kFP32, {me.tokens, K});
      DispatchResult d = buffer.dispatch(a);
      TensorView ys = layer.run(d, a.topk_idx, a.topk_weights, ffn.tile_fn(), Schedule::kSerial);
      std::vector<char> s(static_cast<const char*>(ys.data),
                          static_cast<const char*>(ys.data) + ys.bytes());
      TensorView yo =
          layer.run(d, a.topk_idx, a.topk_weights, ffn.tile_fn(), Schedule::kOverlapped);
      EXPECT_TRUE(same_bits(yo, s)) << "serial and overlapped differ with the BLAS FFN";
      // Reference: the same weights through the one-row path of the full FFN.
      std::vector<float> in(static_cast<size_t>(H)), out(static_cast<size_t>(H));
      double max_err = 0;
      for (int64_t t = 0; t < me.tokens; ++t) {
        for (int64_t h = 0; h < H; ++h)
          in[static_cast<size_t>(h)] = load(me.x.data(), t * H + h, dt);
        std::vector<double> acc(static_cast<size_t>(H), 0.0);
        for (int k = 0; k < K; ++k) {
          const int64_t e = me.idx[static_cast<size_t>(t * K + k)];
          if (e < 0) continue;
          TileTask tt;
          tt.local_expert = static_cast<int>(e);
          tt.rows = 1;
          tt.in = in.data();
          tt.in_ld = H;
          tt.out = out.data();
          tt.out_ld = H;
          tt.worker = g.rank();
          ref_ffn(tt);
          for (int64_t h = 0; h < H; ++h)
            acc[static_cast<size_t>(h)] +=
                me.w[static_cast<size_t>(t * K + k)] * out[static_cast<size_t>(h)];
        }
        for (int64_t h = 0; h < H; ++h) {
          const double got = load(static_cast<const char*>(yo.data), t * H + h, dt);
          max_err = std::max(max_err, std::abs(got - acc[static_cast<size_t>(h)]) /
                                          (1.0 + std::abs(acc[static_cast<size_t>(h)])));
        }
      }
      EXPECT_LT(max_err, 2e-2) << ffn_kind_name(kind);
    });
  }
}

TEST(ExpertLayer, BadInputThrowsAndLeavesTheGroupUsable) {
  run_on_threads(2, [&](Group& g) {
    ExpertLayerConfig bad;
    bad.tile_rows = 0;
    EXPECT_THROW(ExpertLayer(g, bad), InvalidArgument);
    bad = ExpertLayerConfig{};
    bad.num_experts = 3;
    EXPECT_THROW(ExpertLayer(g, bad), InvalidArgument);
    bad = ExpertLayerConfig{};
    bad.comm_workers = 0;
    EXPECT_THROW(ExpertLayer(g, bad), InvalidArgument);
    EXPECT_THROW(route(RouterMode::kBalanced, 4, 5, 1, 1), InvalidArgument);
    EXPECT_THROW(parse_router_mode("zipf"), InvalidArgument);

    const int64_t H = 8;
    BufferConfig bc;
    bc.max_tokens_per_rank = 4;
    bc.hidden = H;
    bc.dtype = DType::kFP32;
    bc.num_experts = 4;
    bc.max_topk = 2;
    Buffer buffer(g, bc);
    ExpertLayerConfig lc;
    lc.max_tokens_per_rank = 4;
    lc.hidden = H;
    lc.dtype = DType::kFP32;
    lc.num_experts = 4;
    lc.max_topk = 2;
    lc.tile_rows = 2;
    ExpertLayer layer(g, lc);
    const TileFn fn = test_tile_fn(g.rank(), 2, H);
    std::vector<float> x(4 * H, 1.0f);
    std::vector<int64_t> idx = {0, 3, 1, 2, 2, -1, 3, 0};
    std::vector<float> w(8, 0.5f);
    DispatchArgs a;
    a.x = TensorView(x.data(), DType::kFP32, {4, H});
    a.topk_idx = TensorView(idx.data(), DType::kInt64, {4, 2});
    a.topk_weights = TensorView(w.data(), DType::kFP32, {4, 2});
    DispatchResult d = buffer.dispatch(a);
    // Every rank passes the same bad value, so every rank throws before communicating.
    std::vector<int64_t> bad_idx = idx;
    bad_idx[3] = 4;
    try {
      layer.run(d, TensorView(bad_idx.data(), DType::kInt64, {4, 2}), a.topk_weights, fn,
                Schedule::kOverlapped);
      ADD_FAILURE() << "expert id 4 accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("expert id 4"), std::string::npos) << e.what();
    }
    EXPECT_THROW(
        layer.run(d, a.topk_idx, TensorView(w.data(), DType::kFP32, {4, 1}), fn, Schedule::kSerial),
        InvalidArgument);
    EXPECT_THROW(layer.run(d, a.topk_idx, a.topk_weights, TileFn{}, Schedule::kSerial),
                 InvalidArgument);
    DispatchResult dl = d;
    dl.layout = Layout::kLatency;
    EXPECT_THROW(layer.run(dl, a.topk_idx, a.topk_weights, fn, Schedule::kSerial), InvalidArgument);
    // Still usable.
    TensorView y1 = layer.run(d, a.topk_idx, a.topk_weights, fn, Schedule::kSerial);
    std::vector<char> s(static_cast<const char*>(y1.data),
                        static_cast<const char*>(y1.data) + y1.bytes());
    TensorView y2 = layer.run(d, a.topk_idx, a.topk_weights, fn, Schedule::kOverlapped);
    EXPECT_TRUE(same_bits(y2, s));
  });
}

}  // namespace
}  // namespace ubep::moe
