#include "ep/dispatch_call.hpp"

#include <cstring>
#include <numeric>

#include "ubep/error.hpp"

namespace ubep::ep {

DispatchCall::DispatchCall(int r, const BufferConfig& cfg, int R)
    : rank(r),
      ranks(R),
      local_experts(cfg.num_experts / R),
      max_tokens(cfg.max_tokens_per_rank),
      routing_(R, cfg.num_experts, cfg.max_tokens_per_rank, cfg.max_topk),
      row_offset_at_(static_cast<size_t>(R)),
      expert_offset_at_(static_cast<size_t>(R) * static_cast<size_t>(cfg.num_experts / R)),
      recv_count_(static_cast<size_t>(cfg.num_experts / R) * 8),
      recv_range_(static_cast<size_t>(cfg.num_experts / R) * static_cast<size_t>(R) * 16),
      offsets_ready_(static_cast<size_t>(R)),
      masked_(static_cast<size_t>(R), 0) {}

void DispatchCall::build_routing(const DispatchArgs& a, const BufferConfig& cfg) {
  routing_.build(a, cfg, masked_.data());  // validates: throws before anything is sent
  weights_replaced_ = false;
  layout_ = a.layout;
  placement_ = cfg.placement == Placement::kAuto ? placement_for(layout_) : cfg.placement;
  const auto& rows =
      layout_ == Layout::kThroughput ? routing_.dest_rows : routing_.dest_expert_rows;
  const int per_rank = layout_ == Layout::kThroughput ? 1 : local_experts;
  const auto self = rows.begin() + rank * per_rank;
  rows_to_self_ = std::accumulate(self, self + per_rank, int64_t{0});
  rows_to_peers_ = std::accumulate(rows.begin(), rows.end(), int64_t{0}) - rows_to_self_;
  topk_mismatch_.store(-1, std::memory_order_relaxed);
  shape_mismatch_.store(-1, std::memory_order_relaxed);
}

void DispatchCall::use_combine_weights(const float* weights) {
  std::vector<float>& w = routing_.topk_weights;
  if (!weights) {
    if (weights_replaced_) std::copy(dispatch_weights_.begin(), dispatch_weights_.end(), w.begin());
    weights_replaced_ = false;
    return;
  }
  if (!weights_replaced_) dispatch_weights_.assign(w.begin(), w.end());
  weights_replaced_ = true;
  const size_t n = static_cast<size_t>(routing_.num_tokens) * static_cast<size_t>(routing_.topk);
  if (n > 0) std::memcpy(w.data(), weights, n * sizeof(float));
}

void DispatchCall::compute_offsets(const Window& w, int dest) {
  int64_t* eo = &expert_offset_at_[static_cast<size_t>(dest * local_experts)];
  if (placement_ == Placement::kPerSource) {
    std::fill(eo, eo + local_experts, rank * max_tokens);
    row_offset_at_[static_cast<size_t>(dest)] = rank * max_tokens;
    return;
  }
  int64_t rows = 0;
  std::fill(eo, eo + local_experts, 0);
  for (int s = 0; s < rank; ++s) {
    if (masked(s)) continue;  // sends nothing
    CountRecord rec = w.count(dest, s);
    rows += *rec.rows();
    if (layout_ == Layout::kLatency)
      for (int e = 0; e < local_experts; ++e) eo[e] += rec.expert_rows()[e];
  }
  row_offset_at_[static_cast<size_t>(dest)] = rows;
}

void DispatchCall::receive_counts(const Window& w) {
  int64_t rows = 0;
  auto* counts = recv_count_.get<int64_t>();
  std::fill(counts, counts + local_experts, 0);
  const bool per_source = placement_ == Placement::kPerSource;
  for (int s = 0; s < ranks; ++s) {
    if (masked(s)) {  // nothing from it, ever: an empty range where its rows would start
      if (layout_ == Layout::kThroughput) {
        int64_t* r = recv_range_.get<int64_t>() + 2 * s;
        r[0] = per_source ? s * max_tokens : rows;
        r[1] = 0;
      } else {
        for (int e = 0; e < local_experts; ++e) {
          int64_t* r = recv_range_.get<int64_t>() + 2 * (e * ranks + s);
          r[0] = per_source ? s * max_tokens : counts[e];
          r[1] = 0;
        }
      }
      continue;
    }
    CountRecord rec = w.count(rank, s);
    if (*rec.topk() != routing_.topk) topk_mismatch_.store(s, std::memory_order_relaxed);
    if (*rec.shape() != shape()) {
      // A different call: its counts mean something else, so read none of them.
      shape_mismatch_.store(s, std::memory_order_relaxed);
      continue;
    }
    if (layout_ == Layout::kThroughput) {
      int64_t* r = recv_range_.get<int64_t>() + 2 * s;
      r[0] = per_source ? s * max_tokens : rows;
      r[1] = *rec.rows();
    }
    rows += *rec.rows();
    for (int e = 0; e < local_experts; ++e) {
      if (layout_ == Layout::kLatency) {
        int64_t* r = recv_range_.get<int64_t>() + 2 * (e * ranks + s);
        r[0] = per_source ? s * max_tokens : counts[e];
        r[1] = rec.expert_rows()[e];
      }
      counts[e] += rec.expert_rows()[e];
    }
  }
  num_recv_rows_ = layout_ == Layout::kThroughput ? rows : 0;
  if (layout_ == Layout::kLatency)
    for (int e = 0; e < local_experts; ++e) num_recv_rows_ += counts[e];
}

std::array<int64_t, 2> DispatchCall::range_from_counts(const Window& w, int e, int s) const {
  int64_t begin = 0;
  for (int src = first_range_source(s); src <= s; ++src) {
    if (masked(src)) {
      if (src == s) return {placement_ == Placement::kPerSource ? s * max_tokens : begin, 0};
      continue;
    }
    CountRecord rec = w.count(rank, src);
    UBEP_CHECK(*rec.shape() == shape(), MismatchedCallError, "dispatch: rank ", src,
               " made a different call (layout or placement) than rank ", rank);
    const int64_t n = layout_ == Layout::kLatency ? rec.expert_rows()[e] : *rec.rows();
    if (src < s)
      begin += n;
    else
      return {placement_ == Placement::kPerSource ? s * max_tokens : begin, n};
  }
  return {0, 0};  // unreachable: the loop ends at s
}

void DispatchCall::row_owner(const Window& w, int max_topk, int64_t row, int* owner,
                             int64_t* push_slot) const {
  if (layout_ == Layout::kThroughput) {
    const int64_t* s = w.at<int64_t>(rank, w.map().tp_src) + 2 * row;
    *owner = static_cast<int>(s[0]);
    *push_slot = static_cast<int64_t>(rank) * max_tokens + s[1];
  } else {
    const int64_t* s = w.at<int64_t>(rank, w.map().lat_src) + 2 * row;
    *owner = static_cast<int>(s[0]);
    *push_slot = s[1] * max_topk + w.at<int8_t>(rank, w.map().lat_k)[row];
  }
}

}  // namespace ubep::ep
