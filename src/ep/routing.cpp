#include "ep/routing.hpp"

#include <algorithm>
#include <cstring>

#include "protocol/call_checks.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

Routing::Routing(int r, int num_experts, int64_t t, int k)
    : ranks(r), local_experts(num_experts / r), max_tokens(t), max_topk(k) {
  const auto T = static_cast<size_t>(t), R = static_cast<size_t>(r), K = static_cast<size_t>(k);
  topk_idx.resize(T * K);
  topk_weights.resize(T * K);
  expert_slot.resize(T * K);
  sent_to.resize(T * R);
  dest_slot.resize(T * R);
  dest_rows.resize(R);
  dest_tokens.resize(R * T);
  dest_expert_rows.resize(R * static_cast<size_t>(local_experts));
  expert_rank.resize(static_cast<size_t>(num_experts));
  expert_local.resize(static_cast<size_t>(num_experts));
  last_token.resize(static_cast<size_t>(num_experts));
  for (int e = 0; e < num_experts; ++e) {
    expert_rank[static_cast<size_t>(e)] = e / local_experts;
    expert_local[static_cast<size_t>(e)] = e % local_experts;
  }
}

void validate_dispatch(const DispatchArgs& a, const BufferConfig& cfg) {
  protocol::check_dispatch_args(a, cfg);
  protocol::check_expert_ids(a, cfg);
}

void Routing::build(const DispatchArgs& a, const BufferConfig& cfg, const uint8_t* masked) {
  // Every check before anything here changes: a rejected dispatch leaves the last one's
  // routing, which its combine still reads.
  protocol::check_dispatch_args(a, cfg);
  protocol::check_expert_ids(a, cfg, &last_token);
  num_tokens = a.x.dim(0);
  topk = static_cast<int>(a.topk_idx.dim(1));
  const auto* idx = a.topk_idx.as<const int64_t>();
  const auto* w = a.topk_weights.as<const float>();
  std::fill(dest_rows.begin(), dest_rows.end(), 0);
  std::fill(dest_expert_rows.begin(), dest_expert_rows.end(), 0);
  const int K = topk;
  const int32_t* __restrict rank_of = expert_rank.data();
  const int32_t* __restrict local_of = expert_local.data();
  int32_t* __restrict expert_rows = dest_expert_rows.data();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t* ids = idx + t * K;
    uint8_t* sent_row = &sent_to[static_cast<size_t>(t * ranks)];
    std::memset(sent_row, 0, static_cast<size_t>(ranks));
    for (int j = 0; j < K; ++j) {
      auto e = static_cast<int32_t>(ids[j]);
      if (e >= 0 && masked && masked[rank_of[e]]) e = -1;
      const size_t tk = static_cast<size_t>(t * K + j);
      topk_idx[tk] = e;
      topk_weights[tk] = w[t * K + j];
      expert_slot[tk] = -1;
      if (e < 0) continue;
      const int r = rank_of[e];
      expert_slot[tk] = expert_rows[static_cast<size_t>(r * local_experts + local_of[e])]++;
      sent_row[r] = 1;
    }
    int32_t* slot_row = &dest_slot[static_cast<size_t>(t * ranks)];
    for (int r = 0; r < ranks; ++r) {
      slot_row[r] = -1;
      if (!sent_row[r]) continue;
      slot_row[r] = dest_rows[static_cast<size_t>(r)]++;
      dest_tokens[static_cast<size_t>(r * max_tokens + slot_row[r])] = static_cast<int32_t>(t);
    }
  }
}

}  // namespace ubep::ep
