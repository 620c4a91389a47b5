// The dispatch kernel's routing numbering (routing_hd.hpp), run lane by lane on the CPU the way
// route() in dispatch.cuh runs it on a warp -- 32 tokens per chunk, a ballot per chunk, the chunk
// table, running per-expert counts -- and compared with ep::Routing::build, the numbering the
// CPU backend and therefore the placement model and the reference rely on.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "backend/cuda/routing_hd.hpp"
#include "ep/routing.hpp"

namespace ubep {
namespace {

struct Emulated {
  std::vector<int32_t> dest_slot, dest_tokens, expert_slot, dest_rows, dest_expert_rows;
};

Emulated emulate_route(const std::vector<int64_t>& idx, int64_t n, int K, int R, int E, int64_t T) {
  const int El = E / R;
  Emulated o;
  o.dest_slot.assign(static_cast<size_t>(n * R), -7);
  o.dest_tokens.assign(static_cast<size_t>(R * T), -7);
  o.expert_slot.assign(static_cast<size_t>(n * K), -7);
  o.dest_rows.assign(static_cast<size_t>(R), 0);
  o.dest_expert_rows.assign(static_cast<size_t>(R * El), 0);
  // The copy loop: dropped ids get expert slot -1.
  for (int64_t i = 0; i < n * K; ++i)
    if (cuda_hd::expert_at(idx.data(), i / K, static_cast<int>(i % K), K, E) < 0)
      o.expert_slot[static_cast<size_t>(i)] = -1;
  std::vector<int> chunk(static_cast<size_t>(32 * K));
  for (int r = 0; r < R; ++r) {  // one warp per destination
    std::vector<int32_t> ecount(static_cast<size_t>(El), 0);
    int32_t rows = 0;
    for (int64_t c0 = 0; c0 < n; c0 += 32) {
      unsigned ballot = 0;
      for (int lane = 0; lane < 32; ++lane)
        if (cuda_hd::chunk_row(idx.data(), c0 + lane, n, K, E, El, r,
                               &chunk[static_cast<size_t>(lane * K)]))
          ballot |= 1u << lane;
      for (int lane = 0; lane < 32; ++lane) {
        const int64_t t = c0 + lane;
        if (t >= n) continue;
        const bool on = (ballot >> lane) & 1u;
        const int32_t slot = on ? cuda_hd::chunk_dest_slot(rows, ballot, lane) : -1;
        o.dest_slot[static_cast<size_t>(t * R + r)] = slot;
        if (on) o.dest_tokens[static_cast<size_t>(r * T + slot)] = static_cast<int32_t>(t);
        for (int j = 0; j < K; ++j) {
          const int e = chunk[static_cast<size_t>(lane * K + j)];
          if (e >= 0)
            o.expert_slot[static_cast<size_t>(t * K + j)] = cuda_hd::chunk_expert_slot(
                chunk.data(), K, lane, e, ecount[static_cast<size_t>(e - r * El)]);
        }
      }
      for (int le = 0; le < El; ++le)
        ecount[static_cast<size_t>(le)] +=
            cuda_hd::chunk_expert_count(chunk.data(), K, r * El + le);
      rows += cuda_hd::popcount(ballot);
    }
    o.dest_rows[static_cast<size_t>(r)] = rows;
    for (int le = 0; le < El; ++le)
      o.dest_expert_rows[static_cast<size_t>(r * El + le)] = ecount[static_cast<size_t>(le)];
  }
  return o;
}

TEST(CudaRouting, WarpNumberingMatchesCpuRouting) {
  std::mt19937_64 rng(3);
  for (auto [R, E, K, T] :
       {std::tuple{1, 4, 2, 5}, std::tuple{2, 8, 3, 31}, std::tuple{4, 16, 4, 33},
        std::tuple{8, 256, 8, 128}, std::tuple{3, 12, 5, 100}, std::tuple{16, 64, 8, 70}}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{T / 2}, int64_t{T}}) {
      std::vector<int64_t> idx;
      std::vector<float> w;
      for (int64_t t = 0; t < n; ++t) {
        std::vector<int64_t> chosen;
        while (static_cast<int>(chosen.size()) < K) {
          int64_t e = static_cast<int64_t>(rng() % static_cast<uint64_t>(E));
          if (rng() % 5 == 0) e = -1;  // drops
          if (e >= 0 && std::find(chosen.begin(), chosen.end(), e) != chosen.end()) continue;
          chosen.push_back(e);
        }
        for (int64_t e : chosen) {
          idx.push_back(e);
          w.push_back(0.5f);
        }
      }
      BufferConfig cfg;
      cfg.max_tokens_per_rank = T;
      cfg.hidden = 8;
      cfg.dtype = DType::kFP32;
      cfg.num_experts = E;
      cfg.max_topk = K;
      std::vector<float> x(static_cast<size_t>(n * 8));
      DispatchArgs a;
      a.x = TensorView(x.data(), DType::kFP32, {n, 8});
      a.topk_idx = TensorView(idx.data(), DType::kInt64, {n, K});
      a.topk_weights = TensorView(w.data(), DType::kFP32, {n, K});
      ep::Routing want(R, E, T, K);
      want.build(a, cfg);
      const Emulated got = emulate_route(idx, n, K, R, E, T);
      const std::string at =
          "R=" + std::to_string(R) + " K=" + std::to_string(K) + " n=" + std::to_string(n);
      for (int r = 0; r < R; ++r) {
        ASSERT_EQ(got.dest_rows[static_cast<size_t>(r)], want.dest_rows[static_cast<size_t>(r)])
            << at;
        for (int64_t i = 0; i < want.dest_rows[static_cast<size_t>(r)]; ++i)
          ASSERT_EQ(got.dest_tokens[static_cast<size_t>(r * T + i)], want.dest_token(r, i)) << at;
        for (int le = 0; le < E / R; ++le)
          ASSERT_EQ(got.dest_expert_rows[static_cast<size_t>(r * (E / R) + le)],
                    want.dest_expert_rows[static_cast<size_t>(r * (E / R) + le)])
              << at;
      }
      for (int64_t t = 0; t < n; ++t) {
        for (int r = 0; r < R; ++r)
          ASSERT_EQ(got.dest_slot[static_cast<size_t>(t * R + r)], want.slot_at(t, r))
              << at << " t=" << t;
        for (int j = 0; j < K; ++j)
          ASSERT_EQ(got.expert_slot[static_cast<size_t>(t * K + j)],
                    want.expert_slot[static_cast<size_t>(t * K + j)])
              << at << " t=" << t << " j=" << j;
      }
    }
  }
}

}  // namespace
}  // namespace ubep
