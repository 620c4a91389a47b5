// Repeated combine of one dispatch (DeepEP's own tests combine one dispatch twice, with and
// without zero_copy): every combine checked bit for bit against the single-process reference,
// for both algorithms, layouts and placements, split-phase and zero-copy, over several calls in
// a row (both window halves), and a peer that starts its first combine late.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "harness.hpp"
#include "ubep/bf16.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

// A second expert, different from expert_fn for every value, so the two combines' rows differ.
float other_expert(float v, int64_t which) {
  return 0.125f * static_cast<float>(which % 4) - 0.5f * v - 1.0f;
}

// The experts' outputs for dispatch result r, shaped like recv_x: `expert` applied to every valid
// received row (the reference's `which`: the expert rank in the throughput layout, the global
// expert id in the latency layout); rows outside recv_range stay 0.
std::vector<char> outputs(const DispatchResult& r, const Case& c, int me, int ranks,
                          ExpertFn expert) {
  const int64_t H = c.hidden;
  const int El = c.experts / ranks;
  const auto* x = static_cast<const char*>(r.recv_x.data);
  const auto* range = r.recv_range.as<const int64_t>();
  std::vector<char> out(static_cast<size_t>(r.recv_x.bytes()), 0);
  auto fill = [&](int64_t pos, int64_t which) {
    for (int64_t h = 0; h < H; ++h)
      store_value(out.data(), pos * H + h, expert(load_value(x, pos * H + h, c.dtype), which),
                  c.dtype);
  };
  for (int e = 0; e < (c.layout == Layout::kLatency ? El : 1); ++e)
    for (int s = 0; s < ranks; ++s) {
      const int64_t* br = range + 2 * (e * ranks + s);
      for (int64_t p = br[0]; p < br[0] + br[1]; ++p) {
        if (c.layout == Layout::kThroughput)
          fill(p, me);
        else
          fill(e * r.recv_x.dim(1) + p, static_cast<int64_t>(me) * El + e);
      }
    }
  return out;
}

void expect_bits(const TensorView& y, const std::vector<float>& want, DType dt, int64_t tokens,
                 int64_t H, const std::string& what) {
  ASSERT_EQ(y.dim(0), tokens) << what;
  for (int64_t i = 0; i < tokens * H; ++i) {
    const float got = load_value(y.data, i, dt), w = want[static_cast<size_t>(i)];
    if (std::memcmp(&got, &w, 4) != 0) {
      ADD_FAILURE() << what << ": token " << i / H << " h " << i % H << ": got " << got << " want "
                    << w;
      return;
    }
  }
}

struct Mode {
  Algorithm algo;
  bool split = false;      // combine_send + combine_recv
  bool zero_copy = false;  // the first combine from combine_buffer()
};

void run_repeats(const Mode& m) {
  constexpr int R = 3;
  for (Layout layout : {Layout::kThroughput, Layout::kLatency})
    for (Placement placement : {Placement::kCompact, Placement::kPerSource}) {
      Case c;
      c.experts = 12;
      c.hidden = 32;
      c.dtype = DType::kBF16;
      c.capacity = 6;
      c.topk = 3;
      c.layout = layout;
      c.placement = placement;
      SCOPED_TRACE(std::string(algorithm_name(m.algo)) + " " + layout_name(layout) + " " +
                   placement_name(placement) + (m.split ? " split" : "") +
                   (m.zero_copy ? " zero-copy" : ""));
      run_on_threads(R, [&](Group& g) {
        Buffer b(g, config_for(c, m.algo));
        const int me = g.rank();
        for (int call = 0; call < 3; ++call) {  // calls in both halves of the window
          const Problem p =
              make_problem(R, c.experts, c.hidden, c.dtype, {6, call == 1 ? 0 : 4, 5}, c.topk,
                           Routing::kWithDrops, 40 + static_cast<uint64_t>(call));
          const RankInput& in = p.inputs[static_cast<size_t>(me)];
          const DispatchResult r = b.dispatch(in.args(c.dtype, c.hidden, layout));
          const std::vector<char> first = outputs(r, c, me, R, expert_fn);
          const std::vector<char> second = outputs(r, c, me, R, other_expert);
          auto combine = [&](const std::vector<char>& x, bool zero_copy,
                             const float* weights = nullptr, char* out = nullptr) {
            CombineArgs a;
            a.handle = r.handle;
            a.x = r.recv_x;
            a.x.dtype = c.dtype;
            a.x.data = const_cast<char*>(x.data());
            if (zero_copy) {
              a.x = b.combine_buffer();
              if (!x.empty()) std::memcpy(a.x.data, x.data(), x.size());
            }
            if (weights)
              a.topk_weights = on_test_device(
                  TensorView(weights, DType::kFP32, {in.tokens, static_cast<int64_t>(c.topk)}));
            if (out) a.out = on_test_device(TensorView(out, c.dtype, {in.tokens, c.hidden}));
            if (!m.split) return b.combine(a);
            b.combine_send(a);
            return b.combine_recv();
          };
          const auto want1 = expected_combine(p, me, layout);
          const auto want2 = expected_combine(p, me, layout, other_expert);
          expect_bits(combine(first, m.zero_copy), want1, c.dtype, in.tokens, c.hidden, "first");
          expect_bits(combine(second, false), want2, c.dtype, in.tokens, c.hidden, "second");
          expect_bits(combine(first, false), want1, c.dtype, in.tokens, c.hidden, "third");
          // Into the caller's memory (CombineArgs::out): y is that memory, the same bits.
          std::vector<char> mine(static_cast<size_t>(in.tokens * c.hidden) * 2 + 1);
          const TensorView y = combine(second, false, nullptr, mine.data());
          EXPECT_EQ(y.data, static_cast<void*>(mine.data()));
          expect_bits(y, want2, c.dtype, in.tokens, c.hidden, "into out");
          if (layout == Layout::kLatency) {
            // Weights replaced in one combine, then the dispatch's again in the next.
            Problem pw = p;
            for (RankInput& ri : pw.inputs)
              for (float& w : ri.topk_weights) w = 0.75f - 2.0f * w;
            const float* w = pw.inputs[static_cast<size_t>(me)].topk_weights.data();
            expect_bits(combine(second, false, w), expected_combine(pw, me, layout, other_expert),
                        c.dtype, in.tokens, c.hidden, "replaced weights");
            expect_bits(combine(first, false), want1, c.dtype, in.tokens, c.hidden,
                        "the dispatch's weights again");
          }
        }
        // Ordinary calls afterwards.
        const Problem p =
            make_problem(R, c.experts, c.hidden, c.dtype, {6, 6, 6}, c.topk, Routing::kUniform, 77);
        run_and_check(g, c, p, &b, nullptr);
        run_and_check(g, c, p, &b, nullptr, true);
      });
    }
}

TEST(RepeatedCombine, Bsp) { run_repeats({Algorithm::kBsp}); }
TEST(RepeatedCombine, Ubep) { run_repeats({Algorithm::kUbep}); }
TEST(RepeatedCombine, UbepZeroCopyFirst) { run_repeats({Algorithm::kUbep, false, true}); }
TEST(RepeatedCombine, BspZeroCopyFirst) { run_repeats({Algorithm::kBsp, false, true}); }
TEST(RepeatedCombine, UbepSplitPhase) { run_repeats({Algorithm::kUbep, true, false}); }

// Rank 0 routes only to its own experts, so its first combine needs nothing from rank 1 and it
// reaches its second combine while rank 1 has not begun its first, which reads rank 0's rows in
// place (ubep): the second combine must not rewrite them before rank 1 is done.
TEST(RepeatedCombine, PeerStillInTheFirstCombine) {
  Case c;
  c.experts = 4;
  c.hidden = 16;
  c.dtype = DType::kFP32;
  c.capacity = 4;
  c.topk = 2;
  c.layout = Layout::kLatency;
  for (Algorithm algo : {Algorithm::kUbep, Algorithm::kBsp}) {
    SCOPED_TRACE(algorithm_name(algo));
    Problem p = make_problem(2, c.experts, c.hidden, c.dtype, {4, 4}, c.topk, Routing::kUniform, 5);
    for (size_t i = 0; i < p.inputs[0].topk_idx.size(); ++i)
      p.inputs[0].topk_idx[i] = static_cast<int64_t>(i % 2);  // experts 0 and 1: rank 0's
    for (size_t i = 0; i < p.inputs[1].topk_idx.size(); ++i)
      p.inputs[1].topk_idx[i] = static_cast<int64_t>(i % 4);  // both ranks' experts
    run_on_threads(2, [&](Group& g) {
      Buffer b(g, config_for(c, algo));
      const int me = g.rank();
      const RankInput& in = p.inputs[static_cast<size_t>(me)];
      const DispatchResult r = b.dispatch(in.args(c.dtype, c.hidden, c.layout));
      const std::vector<char> first = outputs(r, c, me, 2, expert_fn);
      const std::vector<char> second = outputs(r, c, me, 2, other_expert);
      auto combine = [&](const std::vector<char>& x) {
        CombineArgs a{r.recv_x, r.handle};
        a.x.data = const_cast<char*>(x.data());
        return b.combine(a);
      };
      if (me == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      expect_bits(combine(first), expected_combine(p, me, c.layout), c.dtype, in.tokens, c.hidden,
                  "first");
      expect_bits(combine(second), expected_combine(p, me, c.layout, other_expert), c.dtype,
                  in.tokens, c.hidden, "second");
    });
  }
}

}  // namespace
}  // namespace ubep::test
