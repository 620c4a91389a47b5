// fp8 dispatch through every implementation: bsp, ubep (one host and across hosts, through the
// relay) and the all-to-all baseline, both layouts, both placements, codes and scales passed in
// or cast on send; each result must equal the reference codec's bits. fp8 buffers combine in
// bf16, checked against the reference sum.
#include <gtest/gtest.h>

#include "expect_invalid.hpp"
#include "fp8_dispatch_check.hpp"
#include "harness.hpp"
#include "ubep/fp8.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

struct Fp8Case {
  int ranks = 3, per_host = 0;
  int64_t hidden = 200;  // two blocks, the last partial
  Layout layout = Layout::kThroughput;
  Placement placement = Placement::kCompact;
  bool cast_on_send = false;
  bool pow2 = false;
};

BufferConfig fp8_config(const Fp8Case& c, int experts, int64_t capacity, int topk, Algorithm a) {
  BufferConfig cfg;
  cfg.max_tokens_per_rank = capacity;
  cfg.hidden = c.hidden;
  cfg.dtype = DType::kFP8E4M3;
  cfg.fp8_pow2_scales = c.pow2;
  cfg.num_experts = experts;
  cfg.max_topk = topk;
  cfg.algorithm = a;
  cfg.placement = c.placement;
  cfg.num_workers = 1;  // the cast and the sends split over two members
  return cfg;
}

// Dispatches on rank g.rank() with `run`, checks the rows, then (one host) combines the
// dequantized rows in bf16 and checks y.
template <typename Dispatch, typename Combine>
void dispatch_and_combine(Group& g, const Fp8Case& c, const Problem& p,
                          const std::vector<RefFp8>& q, Dispatch&& dispatch, Combine&& combine) {
  const int me = g.rank();
  const DispatchArgs a =
      c.cast_on_send ? p.inputs[static_cast<size_t>(me)].args(DType::kBF16, c.hidden, c.layout)
                     : fp8_args(p, q[static_cast<size_t>(me)], me, c.layout);
  const DispatchResult r = dispatch(a);
  check_fp8_dispatch(r, p, q, me);
  if (c.per_host) return;  // across hosts the fp32 sum order differs per host: rows only
  std::vector<uint16_t> expert_out = dequantized_bf16(r, c.hidden);
  CombineArgs ca;
  ca.handle = r.handle;
  ca.x = r.recv_x;  // the same shape, in bf16
  ca.x.data = expert_out.data();
  ca.x.dtype = DType::kBF16;
  check_fp8_combine(combine(ca), p, q, me, c.layout);
}

void run_case(const Fp8Case& c) {
  const int experts = 4 * c.ranks, topk = 3;
  const int64_t capacity = 7;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < c.ranks; ++r)
      tokens.push_back(static_cast<int64_t>((seed * 3 + static_cast<uint64_t>(r) * 5) % 8));
    Problem p = make_problem(c.ranks, experts, c.hidden, DType::kBF16, tokens, topk,
                             seed == 1 ? Routing::kHot : Routing::kWithDrops, seed * 31);
    p.ranks_per_host = c.per_host;
    const std::vector<RefFp8> q = ref_quantize_problem(p, c.pow2);
    GroupOptions opts;
    opts.ranks_per_host = c.per_host;
    run_on_threads(
        c.ranks,
        [&](Group& g) {
          for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
            SCOPED_TRACE(algorithm_name(algo));
            Buffer buf(g, fp8_config(c, experts, capacity, topk, algo));
            for (int rep = 0; rep < 2; ++rep)  // both window halves
              dispatch_and_combine(
                  g, c, p, q, [&](const DispatchArgs& a) { return buf.dispatch(a); },
                  [&](const CombineArgs& a) { return buf.combine(a); });
          }
          SCOPED_TRACE("baseline");
          AlltoallBaseline base(g, fp8_config(c, experts, capacity, topk, Algorithm::kBsp));
          dispatch_and_combine(
              g, c, p, q, [&](const DispatchArgs& a) { return base.dispatch(a); },
              [&](const CombineArgs& a) { return base.combine(a); });
        },
        opts);
  }
}

std::string name_of(const Fp8Case& c) {
  return std::string(layout_name(c.layout)) + " " + placement_name(c.placement) +
         (c.cast_on_send ? " cast-on-send" : " given") + (c.pow2 ? " pow2" : "") + " ranks " +
         std::to_string(c.ranks) + " per host " + std::to_string(c.per_host) + " hidden " +
         std::to_string(c.hidden);
}

TEST(Fp8Dispatch, MatchesTheReferenceEverywhere) {
  for (Layout layout : {Layout::kThroughput, Layout::kLatency})
    for (Placement placement : {Placement::kCompact, Placement::kPerSource})
      for (bool cast : {false, true}) {
        Fp8Case c;
        c.layout = layout;
        c.placement = placement;
        c.cast_on_send = cast;
        c.pow2 = cast && placement == Placement::kPerSource;
        c.hidden = cast ? 256 : 200;
        SCOPED_TRACE(name_of(c));
        run_case(c);
      }
}

TEST(Fp8Dispatch, AcrossHostsThroughTheRelay) {
  for (Layout layout : {Layout::kThroughput, Layout::kLatency})
    for (bool cast : {false, true}) {
      Fp8Case c;
      c.ranks = 4;
      c.per_host = 2;
      c.layout = layout;
      c.cast_on_send = cast;
      SCOPED_TRACE(name_of(c));
      run_case(c);
    }
}

TEST(Fp8Dispatch, CompactCopiesScalesToo) {
  Fp8Case c;
  c.layout = Layout::kLatency;
  c.placement = Placement::kPerSource;
  Problem p = make_problem(2, 4, c.hidden, DType::kBF16, {5, 3}, 2, Routing::kUniform, 5);
  const std::vector<RefFp8> q = ref_quantize_problem(p, false);
  run_on_threads(2, [&](Group& g) {
    Buffer buf(g, fp8_config(c, 4, 6, 2, Algorithm::kUbep));
    buf.dispatch(fp8_args(p, q[static_cast<size_t>(g.rank())], g.rank(), c.layout));
    expect_invalid([&] { buf.compact_scales(); }, "compact() first");
    const TensorView x = buf.compact(), s = buf.compact_scales();
    ASSERT_EQ(s.dim(0), x.dim(0));
    // Row i of the compacted pair is the i-th valid row, in (expert, source, token) order.
    const ExpectedDispatch ex = expected_dispatch(p, g.rank());
    int64_t i = 0;
    for (const auto& rows : ex.expert_rows)
      for (const auto& src : rows) {
        const RefFp8& want = q[static_cast<size_t>(src[0])];
        EXPECT_EQ(0, std::memcmp(x.as<const uint8_t>() + i * c.hidden,
                                 &want.codes[static_cast<size_t>(src[1] * c.hidden)],
                                 static_cast<size_t>(c.hidden)));
        EXPECT_EQ(0, std::memcmp(s.as<const float>() + i * want.blocks,
                                 &want.scales[static_cast<size_t>(src[1] * want.blocks)],
                                 static_cast<size_t>(want.blocks) * 4));
        ++i;
      }
    EXPECT_EQ(i, x.dim(0));
  });
}

TEST(Fp8Dispatch, RejectsMismatchedInputsClearly) {
  Fp8Case c;
  Problem p = make_problem(2, 4, c.hidden, DType::kBF16, {3, 3}, 2, Routing::kUniform, 9);
  const std::vector<RefFp8> q = ref_quantize_problem(p, false);
  run_on_threads(2, [&](Group& g) {
    Buffer buf(g, fp8_config(c, 4, 6, 2, Algorithm::kUbep));
    AlltoallBaseline base(g, fp8_config(c, 4, 6, 2, Algorithm::kBsp));
    DispatchArgs a = fp8_args(p, q[static_cast<size_t>(g.rank())], g.rank(), c.layout);
    DispatchArgs no_scales = a;
    no_scales.x_scales = {};
    expect_invalid([&] { buf.dispatch(no_scales); }, {"x_scales", "[3, 2]", "none"});
    expect_invalid([&] { base.dispatch(no_scales); }, {"x_scales", "[3, 2]"});
    DispatchArgs bad_shape = a;
    bad_shape.x_scales.shape[1] = 1;
    expect_invalid([&] { buf.dispatch(bad_shape); }, {"x_scales", "fp32[3, 1]"});
    DispatchArgs bf16_with_scales =
        p.inputs[static_cast<size_t>(g.rank())].args(DType::kBF16, c.hidden, c.layout);
    bf16_with_scales.x_scales = a.x_scales;
    expect_invalid([&] { buf.dispatch(bf16_with_scales); }, {"x_scales", "bf16 x"});
    DispatchArgs int_x = a;
    int_x.x.dtype = DType::kInt32;
    expect_invalid([&] { buf.dispatch(int_x); }, {"int32", "fp8", "cast on send"});
    // The buffer still works after the rejections, and combine wants bf16.
    const DispatchResult r = buf.dispatch(a);
    CombineArgs ca;
    ca.handle = r.handle;
    ca.x = r.recv_x;  // fp8: not a combine dtype
    expect_invalid([&] { buf.combine(ca); }, {"fp8", "bf16", "combine"});
    EXPECT_EQ(buf.combine_buffer().dtype, DType::kBF16);
    EXPECT_EQ(combine_dtype(buf.config()), DType::kBF16);
  });
  // A bf16 buffer has no scales to give or take.
  run_on_threads(1, [&](Group& g) {
    BufferConfig cfg = fp8_config(c, 4, 6, 2, Algorithm::kUbep);
    cfg.dtype = DType::kBF16;
    Buffer buf(g, cfg);
    DispatchArgs a = p.inputs[0].args(DType::kBF16, c.hidden, c.layout);
    a.x_scales = TensorView(q[0].scales.data(), DType::kFP32, {3, 2});
    expect_invalid([&] { buf.dispatch(a); }, "x_scales");
    a.x_scales = {};
    EXPECT_EQ(buf.dispatch(a).recv_x_scales.ndim, 0);
    expect_invalid([&] { buf.compact_scales(); }, "no scales");
  });
}

}  // namespace
}  // namespace ubep::test
