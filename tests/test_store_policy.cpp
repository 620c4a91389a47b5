// ep::DispatchCall::streams_row: which dispatch rows go with non-temporal stores. A rank's rows to
// itself take plain stores while all of the call's rows to itself fit kPlainSelfBytes, and stream
// beyond; counted from the routing for both layouts (latency: one row per (token, expert) here;
// throughput: one per token sent here). Rows to peers, and rows relayed from another source,
// take what ep::StoreTuner chose for the call's bytes to peers: it alternates both policies over
// its probes (after a size class's warm-up calls), keeps the one with the lower median send time,
// probes again after a run that doubles, and streams large calls untimed. The results of either
// store are the same bits (test_dispatch_combine).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ep/dispatch_call.hpp"
#include "ep/store_tuner.hpp"

namespace ubep::ep {
namespace {

constexpr int kRanks = 2, kExperts = 16, kTopk = 8;
constexpr size_t kRowBytes = 7168 * 2;  // a bf16 row of hidden 7168

BufferConfig config() {
  BufferConfig cfg;
  cfg.max_tokens_per_rank = 128;
  cfg.hidden = 7168;
  cfg.dtype = DType::kBF16;
  cfg.num_experts = kExperts;
  cfg.max_topk = kTopk;
  return cfg;
}

// `tokens` tokens on rank 0, each to `here` experts of rank 0 (experts 0..7) and the rest of
// rank 1's (8..15).
struct Call {
  std::vector<uint16_t> x;
  std::vector<int64_t> idx;
  std::vector<float> w;
  DispatchCall call{0, config(), kRanks};

  Call(int64_t tokens, int here, Layout layout) {
    for (int64_t t = 0; t < tokens; ++t)
      for (int j = 0; j < kTopk; ++j) {
        idx.push_back(j < here ? j : 8 + j);
        w.push_back(0.125f);
      }
    x.assign(static_cast<size_t>(tokens) * 7168, 0);
    DispatchArgs a;
    a.x = TensorView(x.data(), DType::kBF16, {tokens, 7168});
    a.topk_idx = TensorView(idx.data(), DType::kInt64, {tokens, kTopk});
    a.topk_weights = TensorView(w.data(), DType::kFP32, {tokens, kTopk});
    a.layout = layout;
    call.route(a, config(), [] { return RowArrays{}; });
  }
};

TEST(StorePolicy, ASmallCallsRowsToItselfTakePlainStores) {
  Call c(1, 4, Layout::kLatency);  // 4 rows to itself: 56 KiB
  EXPECT_FALSE(c.call.streams_row(0, 0, kRowBytes));
  EXPECT_TRUE(c.call.streams_row(1, 0, kRowBytes)) << "a row into a peer's window streams";
  EXPECT_TRUE(c.call.streams_row(0, 1, kRowBytes)) << "a row relayed from another source streams";
}

TEST(StorePolicy, RowsToItselfStreamOnceTheyOutgrowTheBound) {
  // Latency: 4 rows per token to itself. 4 tokens: 16 rows, 224 KiB (plain); 5: 280 KiB.
  EXPECT_FALSE(Call(4, 4, Layout::kLatency).call.streams_row(0, 0, kRowBytes));
  EXPECT_TRUE(Call(5, 4, Layout::kLatency).call.streams_row(0, 0, kRowBytes));
  // The bound is on bytes: the same 16 rows with a larger row stream.
  EXPECT_TRUE(Call(4, 4, Layout::kLatency).call.streams_row(0, 0, 2 * kRowBytes));
  // Throughput: one row per token sent here, whatever its number of experts here.
  const size_t limit_rows = DispatchCall::kPlainSelfBytes / kRowBytes;  // 18
  EXPECT_FALSE(Call(static_cast<int64_t>(limit_rows), 3, Layout::kThroughput)
                   .call.streams_row(0, 0, kRowBytes));
  EXPECT_TRUE(Call(static_cast<int64_t>(limit_rows) + 1, 3, Layout::kThroughput)
                  .call.streams_row(0, 0, kRowBytes));
}

TEST(StorePolicy, RowsToPeersTakeTheTunersChoice) {
  Call c(1, 4, Layout::kLatency);  // 4 rows to rank 1: 56 KiB
  const RowCodec codec{kRowBytes, 0};
  for (int i = 0; i < StoreTuner::kWarmupCalls; ++i) {
    c.call.choose_stores(codec);
    EXPECT_TRUE(c.call.streams_row(1, 0, kRowBytes)) << "warm-up calls stream";
    c.call.sent(1.0);
  }
  // The tuner's first probe streams, its second stores plainly.
  c.call.choose_stores(codec);
  EXPECT_TRUE(c.call.streams_row(1, 0, kRowBytes));
  c.call.sent(10.0);
  c.call.choose_stores(codec);
  EXPECT_FALSE(c.call.streams_row(1, 0, kRowBytes)) << "the second probe stores plainly";
  EXPECT_FALSE(c.call.streams_row(0, 1, kRowBytes)) << "relayed rows follow the peers' policy";
  EXPECT_FALSE(c.call.streams_row(0, 0, kRowBytes)) << "rows to itself keep their own rule";
  c.call.sent(5.0);
}

// A size class's first calls stream, untimed (cold windows).
void warm_up(StoreTuner& tuner, size_t bytes) {
  for (int i = 0; i < StoreTuner::kWarmupCalls; ++i) {
    EXPECT_TRUE(tuner.stream(bytes)) << "warm-up call " << i;
    tuner.record(0.001);  // ignored
  }
}

// Probes `tuner` through one round at `bytes`, the streamed calls taking stream_us and the plain
// ones plain_us; returns the policy it then keeps (true: stream).
bool probe_round(StoreTuner& tuner, size_t bytes, double stream_us, double plain_us) {
  for (int i = 0; i < 2 * StoreTuner::kProbes; ++i) {
    const bool s = tuner.stream(bytes);
    EXPECT_EQ(s, i % 2 == 0) << "probe " << i << " alternates, streamed first";
    tuner.record(s ? stream_us : plain_us);
  }
  return tuner.stream(bytes);
}

TEST(StoreTuner, KeepsTheFasterPolicyThenProbesAgain) {
  StoreTuner tuner;
  const size_t bytes = 100 << 10;
  warm_up(tuner, bytes);
  EXPECT_FALSE(probe_round(tuner, bytes, 10.0, 6.0)) << "plain was faster";
  tuner.record(1000.0);  // a call on the chosen policy: not a probe, ignored
  for (int i = 1; i < StoreTuner::kFirstExploitCalls; ++i) ASSERT_FALSE(tuner.stream(bytes)) << i;
  // The machine changed: the next round finds streaming faster, and keeps it twice as long.
  EXPECT_TRUE(probe_round(tuner, bytes, 6.0, 10.0)) << "streaming was faster in the new round";
  for (int i = 1; i < 2 * StoreTuner::kFirstExploitCalls; ++i)
    ASSERT_TRUE(tuner.stream(bytes)) << i;
  EXPECT_FALSE(probe_round(tuner, bytes, 10.0, 6.0)) << "then probed again";
}

TEST(StoreTuner, OneSlowProbeDoesNotDecide) {
  StoreTuner tuner;
  warm_up(tuner, 64 << 10);
  // Plain is faster in 3 of its 4 probes; one of them hit a descheduling (900 us).
  const double plain[StoreTuner::kProbes] = {6.0, 900.0, 6.5, 6.2};
  for (int i = 0; i < 2 * StoreTuner::kProbes; ++i) {
    const bool s = tuner.stream(64 << 10);
    tuner.record(s ? 10.0 : plain[i / 2]);
  }
  EXPECT_FALSE(tuner.stream(64 << 10)) << "the median, not the mean, decides";
}

TEST(StoreTuner, SizeClassesLearnApartAndLargeCallsAlwaysStream) {
  StoreTuner tuner;
  warm_up(tuner, 40 << 10);
  EXPECT_FALSE(probe_round(tuner, 40 << 10, 10.0, 6.0));
  // Another size class has not been probed: it warms up and starts its own round.
  warm_up(tuner, 200 << 10);
  EXPECT_TRUE(tuner.stream(200 << 10));
  tuner.record(3.0);
  EXPECT_FALSE(tuner.stream(200 << 10)) << "its second probe";
  tuner.record(3.0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(tuner.stream(StoreTuner::kAlwaysStreamBytes)) << "large calls stream";
    tuner.record(0.001);  // not a probe: ignored
  }
  EXPECT_TRUE(tuner.stream(0)) << "nothing to peers";
}

TEST(StoreTuner, ACallThatFailedBeforeItsTimeLeavesTheRoundIntact) {
  StoreTuner tuner;
  const size_t bytes = 8 << 10;
  warm_up(tuner, bytes);
  EXPECT_TRUE(tuner.stream(bytes));  // probe 0 (streamed) fails: never recorded
  // The round restarts at the same probe: streamed again, then alternating.
  EXPECT_TRUE(probe_round(tuner, bytes, 5.0, 9.0));
}

// The tuner itself, as the combine's reduction uses it (TokenReducer: whether throughput rows
// take software prefetch): no size limit, the first policy being the default.
TEST(PolicyTuner, LargeSizesAreTunedToo) {
  PolicyTuner tuner;
  const size_t bytes = size_t{58} << 20;  // a prefill combine's output per rank
  for (int i = 0; i < PolicyTuner::kWarmupCalls; ++i) {
    EXPECT_FALSE(tuner.second(bytes)) << "warm-up call " << i << " takes the first policy";
    tuner.record(0.001);  // ignored
  }
  for (int i = 0; i < 2 * PolicyTuner::kProbes; ++i) {
    const bool second = tuner.second(bytes);
    EXPECT_EQ(second, i % 2 == 1) << "probe " << i << " alternates, first policy first";
    tuner.record(second ? 8'900.0 : 11'200.0);
  }
  for (int i = 0; i < PolicyTuner::kFirstExploitCalls; ++i)
    ASSERT_TRUE(tuner.second(bytes)) << "the faster second policy is kept, call " << i;
  EXPECT_FALSE(tuner.second(0)) << "an empty call takes the first policy";
  tuner.record(1.0);  // not a probe: ignored
  EXPECT_FALSE(tuner.second(size_t{1} << 63)) << "a new size class warms up first";
}

TEST(PolicyTuner, AnEqualMedianKeepsTheFirstPolicy) {
  PolicyTuner tuner(size_t{1} << 20);
  for (int i = 0; i < PolicyTuner::kWarmupCalls; ++i) tuner.second(4096);
  for (int i = 0; i < 2 * PolicyTuner::kProbes; ++i) {
    tuner.second(4096);
    tuner.record(5.0);
  }
  EXPECT_FALSE(tuner.second(4096)) << "the second policy must be faster to be kept";
  EXPECT_FALSE(tuner.second(size_t{1} << 20)) << "untuned from 1 MiB on";
}

}  // namespace
}  // namespace ubep::ep
