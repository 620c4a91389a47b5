// The fp8 bounds' untimed expert steps (ubep-bench --bound-expert match), against the library's
// dequantizer and bf16 rounding, row by row.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "bench/bench.hpp"
#include "expect_invalid.hpp"
#include "harness.hpp"
#include "ubep/bf16.hpp"
#include "ubep/fp8.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

constexpr int64_t kTokens = 2, kTopk = 2, kExperts = 4, kRanks = 2, kHidden = 256;

tools::BoundShape latency_shape() {
  tools::BoundShape shape;
  shape.layout = Layout::kLatency;
  shape.placement = Placement::kPerSource;
  shape.local_experts = kExperts / kRanks;
  shape.max_tokens = kTokens;
  return shape;
}

std::vector<uint8_t> test_codes() {
  std::vector<uint8_t> codes(static_cast<size_t>(kHidden));
  for (size_t i = 0; i < codes.size(); ++i)
    codes[i] = static_cast<uint8_t>(i * 5 % 0x7e);  // no NaN codes
  return codes;
}

// The bf16 row the library's dequantizer and rounding make of `codes` with `scales`.
std::vector<uint16_t> dequantized(const std::vector<uint8_t>& codes, const float* scales) {
  std::vector<float> f(static_cast<size_t>(kHidden));
  fp8_dequantize_rows(codes.data(), scales, 1, kHidden, f.data());
  std::vector<uint16_t> out(f.size());
  for (size_t h = 0; h < out.size(); ++h) out[h] = float_to_bf16(f[h]);
  return out;
}

size_t rows_received(const tools::RowPlaces& p) {
  size_t n = 0;
  for (const auto& run : p.runs) n += static_cast<size_t>(run.second);
  return n;
}

// The fp8 combine bound's harness (bf16 rows), its untimed expert step doing the bench's fp8
// expert's work: every row this rank received, its first hidden bytes dequantized as codes with
// scales of one into the combine input (reference: the library's dequantizer and bf16 rounding,
// row by row), and its time reported. A harness of codes with scales is refused, naming why.
TEST(BenchBound, Fp8ExpertStepDequantizesEveryReceivedRow) {
  constexpr int64_t n = kTokens, K = kTopk, E = kExperts, R = kRanks, H = kHidden;
  const int64_t nb = fp8_scales_per_row(H);
  const std::vector<uint8_t> codes = test_codes();
  const std::vector<float> ones(static_cast<size_t>(nb), 1.0f);
  const std::vector<uint16_t> want = dequantized(codes, ones.data());
  // Every token's bf16-sized row starts with the same codes: every received row has `want`.
  std::vector<char> rows(static_cast<size_t>(n * H * 2));
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(&rows[static_cast<size_t>(t * H * 2)], codes.data(), H);
  const std::vector<float> scales(static_cast<size_t>(n * nb), 1.0f);
  run_on_threads(R, [&](Group& g) {
    const std::vector<int64_t> idx = {0, 3, 1, 2};  // every token to both ranks
    const auto sends = tools::send_rows(idx, n, K, E, R, g.rank(), Layout::kLatency);
    const tools::BoundShape shape = latency_shape();
    const tools::RowPlaces p = tools::place_rows(g, sends, shape);
    ASSERT_FALSE(p.runs.empty());
    tools::BoundHarness bf16_rows(g, sends, rows.data(), H * 2, shape);
    tools::BoundHarness with_scales(g, sends, rows.data(), H, shape,
                                    reinterpret_cast<const char*>(scales.data()),
                                    static_cast<size_t>(nb) * sizeof(float));
    expect_invalid([&] { bf16_rows.set_fp8_expert(H + 1); }, {"set_fp8_expert", "hidden 257"});
    expect_invalid([&] { with_scales.set_fp8_expert(H); }, {"set_fp8_expert", "scales 8"});
    bf16_rows.set_fp8_expert(H);
    bf16_rows.run(1, true);
    const size_t received = rows_received(p);
    for (size_t k = 0; k < received; ++k)
      EXPECT_EQ(bf16_rows.last_expert_row(k), want) << "rank " << g.rank() << " row " << k;
    EXPECT_TRUE(bf16_rows.last_expert_row(received).empty());
    for (const auto& r : bf16_rows.rows()) EXPECT_GT(r.expert_step_us, 0) << r.impl << " " << r.op;
  });
}

// The fp8 dispatch bound's harness (codes and scales) chained to the bf16 one: its expert step
// dequantizes every fp8 row it received, with that row's own scales, into the bf16 harness's
// combine input (the calls' expert; scales of one instead would fail here), and it reports the
// dispatch only (the combine is the bf16 harness's). Mismatched harnesses are refused, naming
// the sizes.
TEST(BenchBound, Fp8DispatchExpertStepDequantizesWithTheRowsScales) {
  constexpr int64_t n = kTokens, K = kTopk, E = kExperts, R = kRanks, H = kHidden;
  const int64_t nb = fp8_scales_per_row(H);
  ASSERT_EQ(nb, 2);
  const std::vector<uint8_t> codes = test_codes();
  const float token_scales[2] = {0.5f, 4.0f};  // per 128-value block: both blocks differ
  const std::vector<uint16_t> want = dequantized(codes, token_scales);
  const std::vector<float> ones(static_cast<size_t>(nb), 1.0f);
  ASSERT_NE(want, dequantized(codes, ones.data()));
  std::vector<uint8_t> fp8_rows(static_cast<size_t>(n * H));
  std::vector<float> scales(static_cast<size_t>(n * nb));
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(&fp8_rows[static_cast<size_t>(t * H)], codes.data(), H);
    std::memcpy(&scales[static_cast<size_t>(t * nb)], token_scales, sizeof token_scales);
  }
  const std::vector<char> bf16_x(static_cast<size_t>(n * H * 2), 0);
  run_on_threads(R, [&](Group& g) {
    const std::vector<int64_t> idx = {0, 3, 1, 2};  // every token to both ranks
    const auto sends = tools::send_rows(idx, n, K, E, R, g.rank(), Layout::kLatency);
    const tools::BoundShape shape = latency_shape();
    const tools::RowPlaces p = tools::place_rows(g, sends, shape);
    tools::BoundHarness bf16_rows(g, sends, bf16_x.data(), H * 2, shape);
    tools::BoundHarness fp8(g, sends, reinterpret_cast<const char*>(fp8_rows.data()), H, shape,
                            reinterpret_cast<const char*>(scales.data()),
                            static_cast<size_t>(nb) * sizeof(float));
    tools::BoundHarness too_wide(g, sends, bf16_x.data(), H, shape);
    expect_invalid([&] { bf16_rows.set_fp8_expert_into(fp8); },
                   {"set_fp8_expert_into", "rows of 512 bytes with scales 0"});
    expect_invalid([&] { fp8.set_fp8_expert_into(too_wide); },
                   {"set_fp8_expert_into", "not 256 bytes with scales 0"});
    bf16_rows.set_fp8_expert(H);
    fp8.set_fp8_expert_into(bf16_rows);
    fp8.run(1, true);
    const size_t received = rows_received(p);
    ASSERT_GT(received, 0u);
    for (size_t k = 0; k < received; ++k)
      EXPECT_EQ(fp8.last_expert_row(k), want) << "rank " << g.rank() << " row " << k;
    EXPECT_TRUE(fp8.last_expert_row(received).empty());
    const auto rows = fp8.rows();
    EXPECT_EQ(rows.size(), 2u);  // bound and bound_packed, dispatch only
    for (const auto& r : rows) {
      EXPECT_EQ(r.op, "dispatch") << r.impl;
      EXPECT_GT(r.median_us, 0) << r.impl;
      EXPECT_GT(r.expert_step_us, 0) << r.impl;
    }
    bf16_rows.run(1, false);  // still runs on its own (its rows' combine bound)
  });
}

}  // namespace
}  // namespace ubep::test
