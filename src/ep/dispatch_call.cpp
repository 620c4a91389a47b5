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
      reached_(static_cast<size_t>(cfg.num_experts / R)),
      per_source_offsets_(static_cast<size_t>(R), 0),
      offsets_ready_(static_cast<size_t>(R)),
      masked_(static_cast<size_t>(R), 0) {}

void DispatchCall::build_routing(const DispatchArgs& a, const BufferConfig& cfg) {
  routing_.build(a, cfg, masked_.data());  // validates: throws before anything is sent
  weights_replaced_ = false;
  reached_listed_ = false;  // until this call's receive_counts
  layout_ = a.layout;
  placement_ = cfg.placement == Placement::kAuto ? placement_for(layout_) : cfg.placement;
  // Rows to itself and to peers: O(R) for throughput (a row per token and destination); for
  // latency the routing counted every row (num_entries), so only this rank's own experts are
  // summed, not every rank's (a small call's fixed cost: docs/PERFORMANCE.md, issue 31).
  if (layout_ == Layout::kThroughput) {
    const auto& rows = routing_.dest_rows;
    rows_to_self_ = rows[static_cast<size_t>(rank)];
    rows_to_peers_ = std::accumulate(rows.begin(), rows.end(), int64_t{0}) - rows_to_self_;
  } else {
    const int32_t* self = &routing_.dest_expert_rows[static_cast<size_t>(rank * local_experts)];
    int32_t to_self = 0;  // T x K < 2^30 at most (ConfigChecks: T < 2^24 here, K <= 64)
    for (int e = 0; e < local_experts; ++e) to_self += self[e];
    rows_to_self_ = to_self;
    rows_to_peers_ = routing_.num_entries - rows_to_self_;
  }
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
  uint8_t& per_source = per_source_offsets_[static_cast<size_t>(dest)];
  if (placement_ == Placement::kPerSource) {
    if (!per_source) std::fill(eo, eo + local_experts, rank * max_tokens);
    per_source = 1;
    row_offset_at_[static_cast<size_t>(dest)] = rank * max_tokens;
    return;
  }
  int64_t rows = 0;
  for (int s = 0; s < rank; ++s)
    if (!masked(s)) rows += *w.count(dest, s).rows();  // a masked rank sends nothing
  row_offset_at_[static_cast<size_t>(dest)] = rows;
  if (layout_ != Layout::kLatency) return;
  per_source = 0;
  // Only the experts this rank sends to at dest: nothing else reads their offsets (place_row and
  // combine_row look up the experts of this rank's own tokens), and a small call reaches few of
  // the local experts (one token: at most topk of them), while reading all of them is
  // local_experts x rank loads per destination (E x rank in all, whatever the call's size).
  const int32_t* mine = &routing_.dest_expert_rows[static_cast<size_t>(dest * local_experts)];
  for (int e = 0; e < local_experts; ++e) {
    if (mine[e] == 0) continue;
    int64_t before = 0;
    for (int s = 0; s < rank; ++s)
      if (!masked(s)) before += w.count(dest, s).expert_rows()[e];
    eo[e] = before;
  }
}

void DispatchCall::receive_counts(const Window& w) {
  if (layout_ == Layout::kLatency && sparse_ranges_ && ranges_placement_ == placement_ &&
      receive_expert_counts(w)) {
    reached_listed_ = true;  // last_reached_: this call's experts with rows
    return;
  }
  receive_all_counts(w);
  // The dense pass leaves every range of an expert that received nothing at its empty value,
  // which the sparse pass relies on, unless a source made another call (its ranges left as
  // they were) or the table held the throughput layout's [R, 2] ranges.
  sparse_ranges_ = layout_ == Layout::kLatency && shape_mismatch() < 0;
  ranges_placement_ = placement_;
  last_reached_.clear();
  for (int e = 0; e < (sparse_ranges_ ? local_experts : 0); ++e)
    for (int s = 0; s < ranks; ++s)
      if (range(e, s)[1] != 0) {
        last_reached_.push_back(e);
        break;
      }
  reached_listed_ = sparse_ranges_;
}

// Invariant between calls (sparse_ranges_): every range (e, s) of an expert not in last_reached_
// holds its empty value {per-source ? s x T : 0, 0}, which depends only on the placement. A call
// then rewrites only the experts that received rows in it or in the last call: O(those x R), not
// O(local experts x R) = O(E) (two sources x 128 experts here: counts stage 0.77 -> 0.61 us of a
// tiny call, docs/PERFORMANCE.md, thirteenth session). The ranges are the caller's view
// (Arrivals), read-only: a caller that wrote an empty range would see its write again.
bool DispatchCall::receive_expert_counts(const Window& w) {
  const bool per_source = placement_ == Placement::kPerSource;
  sources_.assign(static_cast<size_t>(ranks), nullptr);
  for (int s = 0; s < ranks; ++s) {
    if (masked(s)) continue;  // nothing from it: its ranges read as empty
    CountRecord rec = w.count(rank, s);
    if (*rec.shape() != shape()) return false;  // the dense pass names it
    if (*rec.topk() != routing_.topk) topk_mismatch_.store(s, std::memory_order_relaxed);
    sources_[static_cast<size_t>(s)] = rec.expert_rows();
  }
  // Local bounds and restrict pointers: a store through an int32_t* could otherwise alias the
  // local_experts member and reload it every iteration, which kept these loops scalar (6-8
  // instructions per expert and source under callgrind; vectorized now).
  const int El = local_experts;
  int64_t* __restrict counts = recv_count_.get<int64_t>();
  int32_t* __restrict reached = reached_.data();
  std::fill(reached, reached + El, 0);
  for (int32_t e : last_reached_) reached[e] = 1;  // the last call's: to empty them again
  for (const int32_t* x : sources_)
    if (const int32_t* __restrict rows = x)
      for (int e = 0; e < El; ++e) reached[e] |= rows[e];
  int64_t total = 0;
  last_reached_.clear();
  for (int e = 0; e < El; ++e) {
    if (!reached[e]) continue;
    int64_t* r = recv_range_.get<int64_t>() + 2 * static_cast<size_t>(e) * ranks;
    int64_t before = 0;
    bool rows = false;
    for (int s = 0; s < ranks; ++s) {
      const int32_t* x = sources_[static_cast<size_t>(s)];
      const int64_t n = x ? x[e] : 0;
      r[2 * s] = per_source ? s * max_tokens : before;
      r[2 * s + 1] = n;
      before += n;
      rows |= n != 0;
    }
    counts[e] = before;
    total += before;
    if (rows) last_reached_.push_back(e);
  }
  num_recv_rows_ = total;
  return true;
}

void DispatchCall::receive_all_counts(const Window& w) {
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
  } else {  // the source as record_sources() noted it, token and k from the sender's record
    *owner = static_cast<int>(w.at<int64_t>(rank, w.map().lat_src)[2 * row]);
    const LatencyRecord& rec = w.at<LatencyRecord>(rank, w.map().lat_rec)[row];
    *push_slot = rec.token() * max_topk + rec.k();
  }
}

DispatchCall::RowTags DispatchCall::row_tags(const Window& w) const {
  if (layout_ == Layout::kLatency) return {nullptr, w.at<LatencyRecord>(rank, w.map().lat_rec)};
  return {w.at<Tag>(rank, w.map().tp_tag), nullptr};
}

DispatchCall::SourceNotes DispatchCall::source_notes(const Window& w) const {
  if (layout_ != Layout::kLatency) return {};
  return {w.at<LatencyRecord>(rank, w.map().lat_rec), w.at<int64_t>(rank, w.map().lat_src)};
}

void DispatchCall::record_sources(const Window& w) const {
  const SourceNotes notes = source_notes(w);
  if (!notes.src) return;
  for_each_range([&](int, int s, int64_t begin, int64_t count, int64_t base) {
    for (int64_t p = base + begin; p < base + begin + count; ++p) notes.note(p, s);
  });
}

}  // namespace ubep::ep
