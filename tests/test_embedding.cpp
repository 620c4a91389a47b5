// The seams the Python package (python/) is built on, tested without Python so they hold in
// every build (the sanitizer builds have no Python): weights replaced at combine, the views of a
// split-phase call handed out before it completes, and the wait interrupt hook.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/wait.hpp"
#include "expect_invalid.hpp"
#include "harness.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

std::vector<char> bytes_of(const TensorView& v) {
  return {static_cast<const char*>(v.data), static_cast<const char*>(v.data) + v.bytes()};
}

Case latency_case() {
  Case c;
  c.experts = 8;
  c.capacity = 6;
  c.topk = 3;
  c.dtype = DType::kBF16;
  c.layout = Layout::kLatency;
  c.tokens = {6, 4};
  return c;
}

// DeepEP passes the weights to low_latency_combine: dispatching with w1 and combining with w2
// must give exactly what dispatching with w2 gives.
TEST(Embedding, CombineWeightsReplaceTheDispatchWeights) {
  const Case c = latency_case();
  const Problem p =
      make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, Routing::kWithDrops, 11);
  for (Algorithm algo : {Algorithm::kUbep, Algorithm::kBsp}) {
    run_on_threads(2, [&](Group& g) {
      const RankInput& in = p.inputs[static_cast<size_t>(g.rank())];
      std::vector<float> w2(in.topk_weights.size());
      for (size_t i = 0; i < w2.size(); ++i) w2[i] = 0.25f + 0.01f * static_cast<float>(i);
      RankInput in2 = in;
      in2.topk_weights = w2;
      Buffer want_buf(g, config_for(c, algo)), got_buf(g, config_for(c, algo));

      DispatchResult r = want_buf.dispatch(in2.args(c.dtype, c.hidden, c.layout));
      const std::vector<char> want = bytes_of(want_buf.combine({r.recv_x, r.handle}));

      const DispatchArgs a = in.args(c.dtype, c.hidden, c.layout);
      r = got_buf.dispatch(a);
      CombineArgs ca{r.recv_x, r.handle};
      ca.topk_weights = TensorView(w2.data(), DType::kFP32, {a.topk_idx.dim(0), c.topk});
      EXPECT_EQ(bytes_of(got_buf.combine(ca)), want);

      // Wrong shape: named, and the buffer stays usable.
      r = got_buf.dispatch(a);
      ca = CombineArgs{r.recv_x, r.handle};
      ca.topk_weights = TensorView(w2.data(), DType::kFP32, {a.topk_idx.dim(0), c.topk - 1});
      expect_invalid([&] { got_buf.combine(ca); }, {"topk_weights must be fp32", "got fp32"});
      ca.topk_weights = TensorView();
      got_buf.combine(ca);
    });
  }
}

TEST(Embedding, CombineWeightsOnlyInTheLatencyLayout) {
  Case c = latency_case();
  c.layout = Layout::kThroughput;
  const Problem p =
      make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, Routing::kUniform, 12);
  run_on_threads(2, [&](Group& g) {
    const RankInput& in = p.inputs[static_cast<size_t>(g.rank())];
    Buffer b(g, config_for(c, Algorithm::kUbep));
    const DispatchArgs a = in.args(c.dtype, c.hidden, c.layout);
    DispatchResult r = b.dispatch(a);
    CombineArgs ca{r.recv_x, r.handle};
    ca.topk_weights = a.topk_weights;
    expect_invalid([&] { b.combine(ca); }, "only replace the dispatch's in the latency layout");
    b.combine({r.recv_x, r.handle});
  });
}

// The views pending_dispatch/pending_combine hand out are the ones *_recv returns.
TEST(Embedding, PendingViewsAreTheResults) {
  const Case c = latency_case();
  const Problem p =
      make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, Routing::kHot, 13);
  run_on_threads(2, [&](Group& g) {
    Buffer b(g, config_for(c, Algorithm::kUbep));
    expect_invalid([&] { b.pending_dispatch(); }, "no latency-layout dispatch_send outstanding");
    expect_invalid([&] { b.pending_combine(); }, "no combine_send outstanding");
    const DispatchArgs a =
        p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout);
    b.dispatch_send(a);
    const DispatchResult pending = b.pending_dispatch();
    const DispatchResult r = b.dispatch_recv();
    EXPECT_EQ(pending.recv_x.data, r.recv_x.data);
    EXPECT_EQ(pending.recv_x.describe(), r.recv_x.describe());
    EXPECT_EQ(pending.recv_count.data, r.recv_count.data);
    EXPECT_EQ(pending.recv_src.data, r.recv_src.data);
    EXPECT_EQ(pending.handle, r.handle);
    b.combine_send({r.recv_x, r.handle});
    const TensorView y_pending = b.pending_combine();
    const TensorView y = b.combine_recv();
    EXPECT_EQ(y_pending.data, y.data);
    EXPECT_EQ(y_pending.describe(), y.describe());
  });
}

std::atomic<bool> g_interrupt{false};
bool interrupted() { return g_interrupt.load(); }

// An embedder's interrupt (Ctrl-C in Python) ends a wait long before the timeout.
TEST(Embedding, InterruptHookEndsAWait) {
  g_interrupt = false;
  wait_interrupt_hook.store(&interrupted);
  WaitPolicy policy;
  policy.timeout = std::chrono::seconds(60);
  std::thread later([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    g_interrupt = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    wait_until([] { return false; }, policy, [] { return std::string("the test's flag"); });
    ADD_FAILURE() << "the wait did not end";
  } catch (const TimeoutError&) {
    ADD_FAILURE() << "timed out instead of being interrupted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted while waiting for the test's flag"),
              std::string::npos)
        << e.what();
  }
  later.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // A ready condition returns even with the flag up; no hook, no effect.
  wait_until([] { return true; }, policy, [] { return std::string(); });
  wait_interrupt_hook.store(nullptr);
}

}  // namespace
}  // namespace ubep::test
