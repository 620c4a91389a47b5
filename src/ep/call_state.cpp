#include "ep/call_state.hpp"

#include "ubep/error.hpp"

namespace ubep::ep {

CallState::CallState(int r, const BufferConfig& cfg, int R)
    : routing(R, cfg.num_experts, cfg.max_tokens_per_rank, cfg.max_topk),
      rank(r),
      ranks(R),
      local_experts(cfg.num_experts / R),
      T(cfg.max_tokens_per_rank),
      row_offset_at(static_cast<size_t>(R)),
      expert_offset_at(static_cast<size_t>(R) * static_cast<size_t>(cfg.num_experts / R)),
      recv_count(static_cast<size_t>(cfg.num_experts / R) * 8),
      recv_range(static_cast<size_t>(cfg.num_experts / R) * static_cast<size_t>(R) * 16),
      offsets_ready_(static_cast<size_t>(R)),
      masked_(static_cast<size_t>(R), 0) {}

void CallState::begin(const DispatchArgs& a, const BufferConfig& cfg, size_t row_bytes) {
  routing.build(a, cfg, masked_.data());  // validates: throws before anything is sent
  double rows = 0;
  for (int d = 0; d < ranks; ++d) rows += routing.dest_rows[static_cast<size_t>(d)];
  if (a.layout == Layout::kLatency) {
    rows = 0;
    for (int64_t i = 0; i < routing.num_tokens * routing.topk; ++i)
      rows += routing.topk_idx[static_cast<size_t>(i)] >= 0;
  }
  stream_rows = rows * static_cast<double>(row_bytes) >= kStreamBytes;
  layout = a.layout;
  placement = cfg.placement == Placement::kAuto ? placement_for(layout) : cfg.placement;
  topk_mismatch_.store(-1, std::memory_order_relaxed);
  shape_mismatch_.store(-1, std::memory_order_relaxed);
}

void CallState::compute_offsets(const Window& w, int dest) {
  int64_t* eo = &expert_offset_at[static_cast<size_t>(dest * local_experts)];
  if (placement == Placement::kPerSource) {
    std::fill(eo, eo + local_experts, rank * T);
    row_offset_at[static_cast<size_t>(dest)] = rank * T;
    return;
  }
  int64_t rows = 0;
  std::fill(eo, eo + local_experts, 0);
  for (int s = 0; s < rank; ++s) {
    if (masked(s)) continue;  // sends nothing
    CountRecord rec = w.count(dest, s);
    rows += *rec.rows();
    if (layout == Layout::kLatency)
      for (int e = 0; e < local_experts; ++e) eo[e] += rec.expert_rows()[e];
  }
  row_offset_at[static_cast<size_t>(dest)] = rows;
}

void CallState::receive_counts(const Window& w) {
  int64_t rows = 0;
  auto* counts = recv_count.get<int64_t>();
  std::fill(counts, counts + local_experts, 0);
  const bool per_source = placement == Placement::kPerSource;
  for (int s = 0; s < ranks; ++s) {
    if (masked(s)) {  // nothing from it, ever: an empty range where its rows would start
      if (layout == Layout::kThroughput) {
        int64_t* r = recv_range.get<int64_t>() + 2 * s;
        r[0] = per_source ? s * T : rows;
        r[1] = 0;
      } else {
        for (int e = 0; e < local_experts; ++e) {
          int64_t* r = recv_range.get<int64_t>() + 2 * (e * ranks + s);
          r[0] = per_source ? s * T : counts[e];
          r[1] = 0;
        }
      }
      continue;
    }
    CountRecord rec = w.count(rank, s);
    if (*rec.topk() != routing.topk) topk_mismatch_.store(s, std::memory_order_relaxed);
    if (*rec.shape() != shape()) {
      // A different call: its counts mean something else, so read none of them.
      shape_mismatch_.store(s, std::memory_order_relaxed);
      continue;
    }
    if (layout == Layout::kThroughput) {
      int64_t* r = recv_range.get<int64_t>() + 2 * s;
      r[0] = per_source ? s * T : rows;
      r[1] = *rec.rows();
    }
    rows += *rec.rows();
    for (int e = 0; e < local_experts; ++e) {
      if (layout == Layout::kLatency) {
        int64_t* r = recv_range.get<int64_t>() + 2 * (e * ranks + s);
        r[0] = per_source ? s * T : counts[e];
        r[1] = rec.expert_rows()[e];
      }
      counts[e] += rec.expert_rows()[e];
    }
  }
  num_recv_rows = layout == Layout::kThroughput ? rows : 0;
  if (layout == Layout::kLatency)
    for (int e = 0; e < local_experts; ++e) num_recv_rows += counts[e];
}

std::array<int64_t, 2> CallState::range_from_counts(const Window& w, int e, int s) const {
  int64_t begin = 0;
  for (int src = first_range_source(s); src <= s; ++src) {
    if (masked(src)) {
      if (src == s) return {placement == Placement::kPerSource ? s * T : begin, 0};
      continue;
    }
    CountRecord rec = w.count(rank, src);
    UBEP_CHECK(*rec.shape() == shape(), MismatchedCallError, "dispatch: rank ", src,
               " made a different call (layout or placement) than rank ", rank);
    const int64_t n = layout == Layout::kLatency ? rec.expert_rows()[e] : *rec.rows();
    if (src < s)
      begin += n;
    else
      return {placement == Placement::kPerSource ? s * T : begin, n};
  }
  return {0, 0};  // unreachable: the loop ends at s
}

void CallState::row_owner(const Window& w, int max_topk, int64_t row, int* owner,
                          int64_t* push_slot) const {
  if (layout == Layout::kThroughput) {
    const int64_t* s = w.at<int64_t>(rank, w.map().tp_src) + 2 * row;
    *owner = static_cast<int>(s[0]);
    *push_slot = static_cast<int64_t>(rank) * T + s[1];
  } else {
    const int64_t* s = w.at<int64_t>(rank, w.map().lat_src) + 2 * row;
    *owner = static_cast<int>(s[0]);
    *push_slot = s[1] * max_topk + w.at<int8_t>(rank, w.map().lat_k)[row];
  }
}

}  // namespace ubep::ep
