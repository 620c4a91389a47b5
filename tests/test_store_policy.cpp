// ep::DispatchCall::streams_row: which dispatch rows go with non-temporal stores. A rank's rows to
// itself take plain stores while all of the call's rows to itself fit kPlainSelfBytes; rows to a
// peer, rows relayed from another source, and a large call's rows to itself stream. Counted from
// the routing for both layouts (latency: one row per (token, expert) here; throughput: one per
// token sent here). The results of either store are the same bits (test_dispatch_combine).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ep/dispatch_call.hpp"

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

}  // namespace
}  // namespace ubep::ep
