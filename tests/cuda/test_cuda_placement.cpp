// CPU-side tests of the CUDA backend's placement (issue 14; docs/CUDA.md "Placement"): the
// kernels' placement arithmetic (device_plan.hpp, UBEP_HD) run as a host model against the
// independent reference, and the sequencer's handling of placement, recv_range, compact() and
// compacted combine input. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "backend/cuda/hd_math.hpp"
#include "backend/cuda/host_logic.hpp"
#include "backend/cuda/sequencer.hpp"
#include "ep/routing.hpp"
#include "reference.hpp"
#include "sequencer_rig.hpp"
#include "ubep/error.hpp"

namespace ubep {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

using cuda_test::cuda_config;

// A host model of the kernels' placement: count records from ep::Routing (the numbering the
// device routing reproduces), offsets from source_offset -- summed from lower ranks' records as
// the offset role does (compact) or the source's fixed region (per-source) -- rows placed with
// tp_position / lat_position, the receiver's ranges from source_offset as receive() computes
// them, combine rows located as the combine warps do and reduced with the kernels' recipe.
// Every range, row and output is compared with the independent reference, for every placement
// x layout x dtype, 1-8 ranks, with an empty source (rank 1) and a full one (rank 0 sends
// max_tokens rows to expert 1).
class PlacementModel : public ::testing::TestWithParam<std::tuple<int, Layout, DType, Placement>> {
};

TEST_P(PlacementModel, MatchesReference) {
  const auto [R, layout, dt, placement] = GetParam();
  const bool per_source = placement == Placement::kPerSource;
  const int E = 4 * R, K = 3, El = E / R;
  const int64_t H = 24, T = 9;
  std::vector<int64_t> tokens;
  for (int r = 0; r < R; ++r) tokens.push_back(r == 0 ? T : r == 1 ? 0 : (r * 5 + 3) % (T + 1));
  test::Problem p = test::make_problem(R, E, H, dt, tokens, K, test::Routing::kWithDrops,
                                       11u + static_cast<unsigned>(R));
  for (int64_t t = 0; t < T; ++t)  // rank 0: every token to expert 1 (first pick), a full source
    for (int j = 0; j < K; ++j) {
      int64_t& e = p.inputs[0].topk_idx[static_cast<size_t>(t * K + j)];
      e = j == 0 ? 1 : (e == 1 ? -1 : e);
    }
  BufferConfig cfg;
  cfg.max_tokens_per_rank = T;
  cfg.hidden = H;
  cfg.dtype = dt;
  cfg.num_experts = E;
  cfg.max_topk = K;
  const protocol::WindowLayout map = cuda_host::window_layout(cfg, R);
  const int64_t RT = map.tp_rows();
  std::vector<ep::Routing> routing;
  for (int s = 0; s < R; ++s) {
    routing.emplace_back(R, E, T, K);
    routing.back().build(p.inputs[static_cast<size_t>(s)].args(dt, H, layout), cfg);
  }
  // Offsets: what compute_offsets (dispatch.cuh) computes -- compact: the sum of the count
  // records of sources < s; per-source: without reading any.
  auto row_off = [&](int s, int d) {
    int64_t n = 0;
    for (int q = 0; q < (per_source ? 0 : s); ++q)
      n += routing[static_cast<size_t>(q)].dest_rows[static_cast<size_t>(d)];
    return cuda_hd::source_offset(per_source, s, T, n);
  };
  auto expert_off = [&](int s, int d, int le) {
    int64_t n = 0;
    for (int q = 0; q < (per_source ? 0 : s); ++q)
      n += routing[static_cast<size_t>(q)].dest_expert_rows[static_cast<size_t>(d * El + le)];
    return cuda_hd::source_offset(per_source, s, T, n);
  };
  // Dispatch: (source, token, k) at every position of every destination.
  std::vector<std::vector<std::array<int64_t, 3>>> at(
      static_cast<size_t>(R),
      std::vector<std::array<int64_t, 3>>(static_cast<size_t>(std::max<int64_t>(RT * El, RT)),
                                          {-1, -1, -1}));
  for (int s = 0; s < R; ++s) {
    const ep::Routing& ro = routing[static_cast<size_t>(s)];
    for (int d = 0; d < R; ++d)
      for (int64_t i = 0; i < ro.dest_rows[static_cast<size_t>(d)]; ++i) {
        const int32_t t = ro.dest_token(d, i);
        if (layout == Layout::kThroughput) {
          at[static_cast<size_t>(d)][static_cast<size_t>(cuda_hd::tp_position(row_off(s, d), i))] =
              {s, t, -1};
        } else {
          for (int j = 0; j < K; ++j) {
            const int32_t e = ro.topk_idx[static_cast<size_t>(t * K + j)];
            if (e < 0 || e / El != d) continue;
            const int64_t pos =
                cuda_hd::lat_position(RT, e % El, expert_off(s, d, e % El),
                                      ro.expert_slot[static_cast<size_t>(t * K + j)]);
            at[static_cast<size_t>(d)][static_cast<size_t>(pos)] = {s, t, j};
          }
        }
      }
  }
  // Receiver: the ranges receive() publishes (source_offset over the count records, in source
  // order), against the reference's rows of each source; every row inside a range is the
  // reference's, and every position outside the ranges is empty.
  for (int d = 0; d < R; ++d) {
    const test::ExpectedDispatch ex = test::expected_dispatch(p, d);
    std::vector<bool> covered(at[static_cast<size_t>(d)].size(), false);
    for (int le = 0; le < (layout == Layout::kLatency ? El : 1); ++le) {
      const auto& want =
          layout == Layout::kLatency ? ex.expert_rows[static_cast<size_t>(le)] : ex.src;
      size_t next = 0;
      int64_t before = 0, want_before = 0;
      for (int s = 0; s < R; ++s) {
        const ep::Routing& ro = routing[static_cast<size_t>(s)];
        const int64_t n = layout == Layout::kLatency
                              ? ro.dest_expert_rows[static_cast<size_t>(d * El + le)]
                              : ro.dest_rows[static_cast<size_t>(d)];
        const int64_t begin = cuda_hd::source_offset(per_source, s, T, before);
        before += n;
        // Independently: the reference's rows from s, and where the placement puts them.
        int64_t want_n = 0;
        for (const auto& row : want) want_n += row[0] == s;
        ASSERT_EQ(n, want_n) << "rank " << d << " expert " << le << " source " << s;
        ASSERT_EQ(begin, per_source ? s * T : want_before) << "rank " << d << " source " << s;
        ASSERT_LE(begin + n, layout == Layout::kLatency ? RT : (per_source ? RT : T * R));
        want_before += want_n;
        for (int64_t q = 0; q < n; ++q, ++next) {
          const size_t pos =
              static_cast<size_t>((layout == Layout::kLatency ? le * RT : 0) + begin + q);
          covered[pos] = true;
          EXPECT_EQ(at[static_cast<size_t>(d)][pos][0], want[next][0])
              << "rank " << d << " expert " << le << " source " << s << " row " << q;
          EXPECT_EQ(at[static_cast<size_t>(d)][pos][1], want[next][1])
              << "rank " << d << " expert " << le << " source " << s << " row " << q;
        }
      }
      EXPECT_EQ(next, want.size());
    }
    for (size_t pos = 0; pos < covered.size(); ++pos) {
      if (!covered[pos]) {
        EXPECT_EQ(at[static_cast<size_t>(d)][pos][0], -1) << "stray row " << pos;
      }
    }
  }
  // Combine: locate (combine.cuh) then the fixed-order sum with the kernels' recipe.
  for (int s = 0; s < R; ++s) {
    const ep::Routing& ro = routing[static_cast<size_t>(s)];
    const std::vector<float> want = test::expected_combine(p, s, layout);
    for (int64_t t = 0; t < ro.num_tokens; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0.0f;
        for (int i = 0; i < (layout == Layout::kThroughput ? R : K); ++i) {
          int r;
          int64_t pos, which;
          float w = 1.0f;
          if (layout == Layout::kThroughput) {
            const int32_t slot = ro.slot_at(t, i);
            if (slot < 0) continue;
            r = i;
            pos = cuda_hd::tp_position(row_off(s, r), slot);
            which = r;
          } else {
            const int32_t e = ro.topk_idx[static_cast<size_t>(t * K + i)];
            if (e < 0) continue;
            r = e / El;
            pos = cuda_hd::lat_position(RT, e % El, expert_off(s, r, e % El),
                                        ro.expert_slot[static_cast<size_t>(t * K + i)]);
            w = ro.topk_weights[static_cast<size_t>(t * K + i)];
            which = e;
            ASSERT_EQ(at[static_cast<size_t>(r)][static_cast<size_t>(pos)][2], i);
          }
          const auto& src = at[static_cast<size_t>(r)][static_cast<size_t>(pos)];
          ASSERT_EQ(src[0], s);
          ASSERT_EQ(src[1], t);
          // The expert's output row, as the expert rank stores it (rounded to the dtype).
          const float v = test::stored(test::expert_fn(p.value(s, t, h), which), dt);
          acc = layout == Layout::kLatency ? cuda_hd::add_weighted_term(acc, w, v)
                                           : cuda_hd::add_term(acc, v);
        }
        const float got =
            dt == DType::kBF16 ? cuda_hd::bf16_to_float(cuda_hd::float_to_bf16(acc)) : acc;
        ASSERT_EQ(bits(got), bits(want[static_cast<size_t>(t * H + h)]))
            << "rank " << s << " token " << t;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, PlacementModel,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                       ::testing::Values(Layout::kThroughput, Layout::kLatency),
                       ::testing::Values(DType::kBF16, DType::kFP32),
                       ::testing::Values(Placement::kCompact, Placement::kPerSource)));

// Placement in the sequencer: auto resolves per layout as on the CPU (placement_for), an
// explicit one is kept; the kernels get per_source, the result the placement and recv_range's
// shape; compact() is refused outside [dispatch_recv, combine); compacted combine input is
// checked for dtype/hidden and may not alias the combine window; the new error words name the
// peer.
TEST(CudaHost, SequencerPlacementAndCompact) {
  for (Placement pl : {Placement::kAuto, Placement::kCompact, Placement::kPerSource})
    for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
      BufferConfig cfg = cuda_config();
      cfg.placement = pl;
      cuda_test::SequencerRig rig(cfg, 1 << 16);
      cuda_host::Sequencer& q = rig.q;
      std::vector<char> out(1 << 16);
      auto dev = [&](DType t, std::initializer_list<int64_t> dims) { return rig.dev(t, dims); };
      const DispatchArgs a = rig.dispatch_args(l);
      const std::vector<DispatchArgs> args{a, a};
      const cuda_host::LaunchResources res;
      const Placement want = pl == Placement::kAuto ? placement_for(l) : pl;
      const cuda_hd::LaunchParams ps = q.dispatch(args, cuda_hd::kSend, res);
      EXPECT_EQ(ps.per_source, want == Placement::kPerSource);
      EXPECT_THROW(q.compact(res), InvalidArgument);  // dispatch_recv outstanding
      q.dispatch({}, cuda_hd::kRecv, res);
      EXPECT_THROW(q.compact(res), InvalidArgument);  // no output memory given
      for (int i = 0; i < 2; ++i) q.set_compact_memory(i, out.data() + i * 4096);
      const cuda_hd::LaunchParams pk = q.compact(res);
      EXPECT_EQ(pk.phases, static_cast<uint32_t>(cuda_hd::kCompact));
      EXPECT_EQ(pk.io[1].compact_out, out.data() + 4096);
      const std::vector<TensorView> dense = q.compacted();
      EXPECT_EQ(dense[0].dim(0), l == Layout::kLatency ? 2 * 32 : 32);  // El * R*T, or R*T
      const DispatchResult r = q.results()[0];
      EXPECT_EQ(r.placement, want);
      EXPECT_EQ(r.recv_range.dtype, DType::kInt64);
      EXPECT_EQ(r.recv_range.ndim, l == Layout::kLatency ? 3 : 2);
      EXPECT_EQ(r.recv_range.numel(), l == Layout::kLatency ? 2 * 4 * 2 : 4 * 2);
      EXPECT_EQ(r.recv_x.dim(l == Layout::kLatency ? 1 : 0), 32);  // capacity in both placements
      std::vector<CombineArgs> c(2);
      for (auto& x : c) {
        x.handle = r.handle;
        x.compacted = true;
        x.x = dev(DType::kBF16, {3, 16});  // any row count: checked on the device
      }
      c[1].x = dev(DType::kBF16, {3, 15});
      EXPECT_THROW(q.combine(c, cuda_hd::kCombSend, res), InvalidArgument);  // hidden
      c[1].x = q.combine_buffer(1);
      c[1].x.shape = {3, 16, 0};
      c[1].x.ndim = 2;
      EXPECT_THROW(q.combine(c, cuda_hd::kCombSend, res), InvalidArgument);  // aliases the window
      c[1].x = dev(DType::kBF16, {5, 16});
      c[1].x = dev(DType::kBF16, {5, 16});
      c[1].topk_weights = dev(DType::kFP32, {4, 2});
      EXPECT_THROW(q.combine(c, cuda_hd::kCombSend, res), InvalidArgument);  // not supported
      c[1].topk_weights = {};
      const cuda_hd::LaunchParams pc = q.combine(c, cuda_hd::kCombSend, res);
      EXPECT_TRUE(pc.io[0].comb_in_compacted);
      EXPECT_EQ(pc.io[0].comb_in_rows, 3);
      EXPECT_EQ(pc.io[1].comb_in_rows, 5);
      EXPECT_THROW(q.compact(res), InvalidArgument);  // after combine
    }
  cuda_hd::ErrorInfo e{};
  e.code = cuda_hd::kShapeMismatch;
  e.rank = 1;
  e.peer = 3;
  e.index = cuda_hd::call_shape_of(true, true);
  try {
    cuda_host::throw_if_error(e, 1.0);
    FAIL();
  } catch (const InvalidArgument& x) {
    EXPECT_NE(std::string(x.what()).find(
                  "rank 3 made a different call (layout or placement) than rank 1"),
              std::string::npos)
        << x.what();
  }
  e = {};
  e.code = cuda_hd::kCompactedShort;
  e.rank = 2;
  e.index = 7;
  e.tag = 5;
  EXPECT_NE(cuda_host::describe(e, 1).find("has 5 rows, fewer than the 7"), std::string::npos);
  // The kernels' shape word is the CPU's (protocol::call_shape of the enums' values).
  EXPECT_EQ(cuda_hd::call_shape_of(true, true),
            protocol::call_shape(static_cast<int>(Layout::kLatency),
                                 static_cast<int>(Placement::kPerSource)));
  EXPECT_EQ(cuda_hd::call_shape_of(false, false),
            protocol::call_shape(static_cast<int>(Layout::kThroughput),
                                 static_cast<int>(Placement::kCompact)));
}

}  // namespace
}  // namespace ubep
