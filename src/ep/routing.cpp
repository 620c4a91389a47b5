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
}

void validate_dispatch(const DispatchArgs& a, const BufferConfig& cfg) {
  protocol::check_dispatch_args(a, cfg);
  protocol::check_expert_ids(a, cfg);
}

void Routing::build(const DispatchArgs& a, const BufferConfig& cfg, const uint8_t* masked) {
  validate_dispatch(a, cfg);
  num_tokens = a.x.dim(0);
  topk = static_cast<int>(a.topk_idx.dim(1));
  const auto* idx = a.topk_idx.as<const int64_t>();
  const auto* w = a.topk_weights.as<const float>();
  std::fill(dest_rows.begin(), dest_rows.end(), 0);
  std::fill(dest_expert_rows.begin(), dest_expert_rows.end(), 0);
  const int K = topk;
  for (int64_t t = 0; t < num_tokens; ++t) {
    uint8_t* sent_row = &sent_to[static_cast<size_t>(t * ranks)];
    std::memset(sent_row, 0, static_cast<size_t>(ranks));
    for (int j = 0; j < K; ++j) {
      auto e = static_cast<int32_t>(idx[t * K + j]);
      if (e >= 0 && masked && masked[e / local_experts]) e = -1;
      const size_t tk = static_cast<size_t>(t * K + j);
      topk_idx[tk] = e;
      topk_weights[tk] = w[t * K + j];
      expert_slot[tk] = -1;
      if (e < 0) continue;
      const int r = e / local_experts;
      expert_slot[tk] =
          dest_expert_rows[static_cast<size_t>(r * local_experts + e % local_experts)]++;
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
