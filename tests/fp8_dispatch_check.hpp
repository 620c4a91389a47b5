// Checks fp8 dispatch results and fp8 buffers' bf16 combine against the reference (shared by
// the thread-rank and MPI suites).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "fp8_reference.hpp"
#include "reference.hpp"

namespace ubep::test {

// Every rank's bf16 x quantized by the reference codec.
inline std::vector<RefFp8> ref_quantize_problem(const Problem& p, bool pow2) {
  std::vector<RefFp8> q;
  for (const RankInput& in : p.inputs)
    q.push_back(ref_fp8_quantize(bf16_values(in.x_bf16), in.tokens, p.hidden, pow2));
  return q;
}

// Dispatch args with x = the reference's codes and x_scales = its scales.
inline DispatchArgs fp8_args(const Problem& p, const RefFp8& q, int rank, Layout layout) {
  DispatchArgs a = p.inputs[static_cast<size_t>(rank)].args(DType::kBF16, p.hidden, layout);
  a.x = TensorView(q.codes.data(), DType::kFP8E4M3, {q.rows, q.hidden});
  a.x_scales = TensorView(q.scales.data(), DType::kFP32, {q.rows, q.blocks});
  return a;
}

// Every valid row of recv_x / recv_x_scales on rank `me` must hold its source token's codes and
// scales bit for bit. Rows are located through recv_range when the result has one (Buffer), or
// packed in order (the baseline).
inline void check_fp8_dispatch(const DispatchResult& r, const Problem& p,
                               const std::vector<RefFp8>& q, int me) {
  const ExpectedDispatch ex = expected_dispatch(p, me);
  const int64_t H = p.hidden, nb = (H + 127) / 128;
  ASSERT_EQ(r.recv_x.dtype, DType::kFP8E4M3);
  ASSERT_EQ(r.recv_x_scales.dtype, DType::kFP32);
  ASSERT_EQ(r.recv_x_scales.ndim, r.recv_x.ndim);
  ASSERT_EQ(r.recv_x_scales.dim(r.recv_x.ndim - 1), nb);
  const auto* codes = r.recv_x.as<const uint8_t>();
  const auto* scales = r.recv_x_scales.as<const float>();
  const bool latency = r.layout == Layout::kLatency;
  const int64_t RT = latency ? r.recv_x.dim(1) : 0;
  const auto* range = r.recv_range.ndim ? r.recv_range.as<const int64_t>() : nullptr;
  const int experts = latency ? p.experts / p.ranks : 1;
  for (int e = 0; e < experts; ++e) {
    const auto& rows = latency ? ex.expert_rows[static_cast<size_t>(e)] : ex.src;
    size_t i = 0;
    int64_t packed = 0;
    for (int s = 0; s < p.ranks; ++s) {
      int64_t count = 0;
      while (i + static_cast<size_t>(count) < rows.size() &&
             rows[i + static_cast<size_t>(count)][0] == s)
        ++count;
      int64_t begin = packed;
      if (range) {
        const int64_t* rr = range + 2 * (latency ? e * p.ranks + s : s);
        EXPECT_EQ(rr[1], count) << "rows from source " << s << " at expert " << e;
        begin = rr[0];
      }
      for (int64_t k = 0; k < count; ++k) {
        const auto& src = rows[i + static_cast<size_t>(k)];
        const RefFp8& want = q[static_cast<size_t>(src[0])];
        const int64_t row = e * RT + begin + k;
        ASSERT_EQ(0, std::memcmp(codes + row * H, &want.codes[static_cast<size_t>(src[1] * H)],
                                 static_cast<size_t>(H)))
            << "codes of row " << row << " (rank " << src[0] << " token " << src[1] << ")";
        ASSERT_EQ(0, std::memcmp(scales + row * nb, &want.scales[static_cast<size_t>(src[1] * nb)],
                                 static_cast<size_t>(nb) * 4))
            << "scales of row " << row << " (rank " << src[0] << " token " << src[1] << ")";
      }
      i += static_cast<size_t>(count);
      packed += count;
    }
  }
}

// The experts of an fp8 buffer: every row of recv_x dequantized and rounded to bf16 (the
// combine dtype), shaped like recv_x.
inline std::vector<uint16_t> dequantized_bf16(const DispatchResult& r, int64_t hidden) {
  const int64_t rows = r.recv_x.numel() / hidden, nb = (hidden + 127) / 128;
  std::vector<uint16_t> out(static_cast<size_t>(rows * hidden));
  const auto* codes = r.recv_x.as<const uint8_t>();
  const auto* scales = r.recv_x_scales.as<const float>();
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t h = 0; h < hidden; ++h)
      out[static_cast<size_t>(row * hidden + h)] = float_to_bf16(
          static_cast<float>(ref_e4m3_value(codes[row * hidden + h])) * scales[row * nb + h / 128]);
  return out;
}

// y on rank `me` when every expert returned dequantized_bf16: per token, the bf16 value v of
// its own row (the same at every expert), summed in fp32 once per receiving rank (throughput)
// or weighted per selected expert in ascending k (latency), rounded to bf16.
inline void check_fp8_combine(const TensorView& y, const Problem& p, const std::vector<RefFp8>& q,
                              int me, Layout layout) {
  const RankInput& in = p.inputs[static_cast<size_t>(me)];
  const RefFp8& mine = q[static_cast<size_t>(me)];
  const int64_t H = p.hidden, El = p.experts / p.ranks;
  ASSERT_EQ(y.dtype, DType::kBF16);
  ASSERT_EQ(y.dim(0), in.tokens);
  for (int64_t t = 0; t < in.tokens; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float v = bf16_to_float(float_to_bf16(
          static_cast<float>(ref_e4m3_value(mine.codes[static_cast<size_t>(t * H + h)])) *
          mine.scales[static_cast<size_t>(t * mine.blocks + h / 128)]));
      float acc = 0.0f;
      std::vector<bool> seen(static_cast<size_t>(p.ranks), false);
      for (int j = 0; j < in.topk; ++j) {
        const int64_t e = in.topk_idx[static_cast<size_t>(t * in.topk + j)];
        if (e < 0) continue;
        if (layout == Layout::kLatency) {
          const float w = in.topk_weights[static_cast<size_t>(t * in.topk + j)];
          acc += w * v;
        } else {
          seen[static_cast<size_t>(e / El)] = true;
        }
      }
      if (layout == Layout::kThroughput)
        for (int s = 0; s < p.ranks; ++s)
          if (seen[static_cast<size_t>(s)]) acc += v;
      ASSERT_EQ(y.as<const uint16_t>()[t * H + h], float_to_bf16(acc))
          << "y[" << t << ", " << h << "] on rank " << me;
    }
}

}  // namespace ubep::test
