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
  entry_rank.resize(T * K);
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
  const int K = topk, R = ranks;
  const auto entries = static_cast<size_t>(num_tokens) * static_cast<size_t>(K);
  std::fill(dest_rows.begin(), dest_rows.end(), 0);
  std::fill(dest_expert_rows.begin(), dest_expert_rows.end(), 0);
  // The weights as given (a masked entry's too: combine skips it by its id).
  if (entries) std::memcpy(topk_weights.data(), a.topk_weights.data, entries * sizeof(float));
  bool any_masked = false;
  for (int r = 0; masked && r < R; ++r) any_masked = any_masked || masked[r] != 0;
  const int32_t* __restrict rank_of = expert_rank.data();
  // [R, local experts] is indexed by the global expert id: r * local_experts + local == e.
  int32_t* __restrict expert_rows = dest_expert_rows.data();
  int32_t* __restrict ids_out = topk_idx.data();
  int32_t* __restrict slots = expert_slot.data();
  int32_t* __restrict entry_ranks = entry_rank.data();
  uint8_t* __restrict sent = sent_to.data();
  int32_t* __restrict dest_slots = dest_slot.data();
  int32_t* __restrict rows = dest_rows.data();
  int32_t* __restrict tokens_of = dest_tokens.data();
  // Per entry a few stores and one counter: no library call per token (a memset of R bytes was
  // one), no per-entry weight copy (one memcpy above), no division. 4096 x 8, one thread, hot:
  // best 144-148 -> 114-122 us in the quiet pairs of rprobe (docs/PERFORMANCE.md, issue 31).
  int64_t dropped = 0;  // a register count, not a per-rank array: no store per entry
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t* ids = idx + t * K;
    uint8_t* sent_row = sent + t * R;
    for (int r = 0; r < R; ++r) sent_row[r] = 0;
    for (int j = 0; j < K; ++j) {
      auto e = static_cast<int32_t>(ids[j]);
      if (any_masked && e >= 0 && masked[rank_of[e]]) e = -1;
      const int64_t tk = t * K + j;
      ids_out[tk] = e;
      if (e < 0) {
        slots[tk] = -1;
        entry_ranks[tk] = -1;
        ++dropped;
        continue;
      }
      slots[tk] = expert_rows[e]++;
      const int32_t r = rank_of[e];
      entry_ranks[tk] = r;
      sent_row[r] = 1;
    }
    int32_t* slot_row = dest_slots + t * R;
    for (int r = 0; r < R; ++r) {
      if (!sent_row[r]) {
        slot_row[r] = -1;
        continue;
      }
      slot_row[r] = rows[r]++;
      tokens_of[r * max_tokens + slot_row[r]] = static_cast<int32_t>(t);
    }
  }
  num_entries = static_cast<int64_t>(entries) - dropped;
}

}  // namespace ubep::ep
