// The state of one dispatch/combine pair on one rank: its routing, where this rank's rows go at
// every destination (sender side), what arrived (receiver side), and the placement of rows in
// the window -- the arithmetic both algorithms and the relay share.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <vector>

#include "core/local_array.hpp"
#include "ep/routing.hpp"
#include "ep/window.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

// A peer made a different call (layout or placement) in this call, found by the receive hook:
// an InvalidArgument that leaves the buffer usable (HostEngine's phases let it through without
// breaking the buffer; dispatch_recv then ends the call with the same error on every rank).
class MismatchedCallError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

class CallState {
 public:
  CallState(int rank, const BufferConfig& cfg, int ranks);

  // Validates the inputs and builds the routing (throws before anything is written), then
  // decides the per-call store policy.
  void begin(const DispatchArgs& a, const BufferConfig& cfg, size_t row_bytes);

  // This rank's dispatch rows, by token: the caller's x (and x_scales), or the cast-on-send
  // staging copy (HostEngine::begin_dispatch sets it after begin()).
  RowArrays source;
  Routing routing;
  Layout layout = Layout::kThroughput;
  Placement placement = Placement::kCompact;  // resolved (never kAuto)
  // The count record's call-shape word for this call (protocol.hpp).
  int32_t shape() const {
    return call_shape(static_cast<int>(layout), static_cast<int>(placement));
  }
  int rank, ranks, local_experts;
  int64_t T;  // max tokens per rank
  // The ranks masked in this buffer's agreed view (docs/ELASTIC.md), set between calls by the
  // engine: never sent to, never waited for, their count records read as zero; the routing
  // drops the topk entries of their experts (those weights contribute nothing to combine).
  bool masked(int r) const { return masked_[static_cast<size_t>(r)] != 0; }
  void set_masked(const std::vector<uint8_t>& m) { masked_ = m; }
  int64_t RT() const { return static_cast<int64_t>(ranks) * T; }
  // Rows into a peer's dispatch output: non-temporal stores when the call moves more than
  // kStreamBytes (they skip the read-for-ownership of lines the writer never reads, like
  // DeepEP's no-allocate stores), plain stores for small calls whose rows the receiver reads
  // while they are still in cache.
  static constexpr double kStreamBytes = 4.0 * (1 << 20);
  bool stream_rows = false;

  // --- sender side: where this rank's rows start at each destination (from the count records
  // of the lower-ranked sources). Kept for combine, which reads the rows back there.
  std::vector<int64_t> row_offset_at;     // [R] throughput
  std::vector<int64_t> expert_offset_at;  // [R, El] latency
  // Whether the offsets at a destination depend on the lower ranks' count records there.
  bool offsets_need_counts() const { return placement == Placement::kCompact; }
  // Compact: reads the count records of sources below this rank at `dest` (they must be
  // visible). Per-source: this rank's fixed region, from nothing but its rank.
  void compute_offsets(const Window& w, int dest);
  // Point-to-point signal from the offset role (one writer) to the token senders of this rank:
  // offsets for `dest` are computed. Release/acquire on a rank-local word; the generation
  // counts dispatch sends from 1, so a stale value never matches.
  uint64_t next_send_generation() { return ++send_generation_; }
  void signal_offsets(int dest, uint64_t generation) {
    offsets_ready_[static_cast<size_t>(dest)].store(generation, std::memory_order_release);
  }
  bool offsets_signalled(int dest, uint64_t generation) const {
    return offsets_ready_[static_cast<size_t>(dest)].load(std::memory_order_acquire) == generation;
  }

  // --- receiver side ---
  LocalArray recv_count;      // [El] int64
  LocalArray recv_range;      // int64 (begin, count): latency [El, R, 2], throughput [R, 2]
  int64_t num_recv_rows = 0;  // valid rows in all
  // After every count record of this call is visible: per-expert counts, each source's range
  // (from the placement) and total rows.
  void receive_counts(const Window& w);
  // Rows the dispatch output spans (throughput: per-source placement leaves gaps).
  int64_t tp_span() const { return placement == Placement::kPerSource ? RT() : num_recv_rows; }
  // A source whose topk, or call shape, differed from ours in this call, or -1.
  int topk_mismatch() const { return topk_mismatch_.load(std::memory_order_relaxed); }
  int shape_mismatch() const { return shape_mismatch_.load(std::memory_order_relaxed); }
  // Before receive_counts, for the receive hook: (begin, count) of source s's rows for local
  // expert e (throughput: e is ignored), read from the count records of sources
  // [first_range_source(s), s], which must be visible. A record of another call shape throws.
  std::array<int64_t, 2> range_from_counts(const Window& w, int e, int s) const;
  int first_range_source(int s) const { return placement == Placement::kPerSource ? s : 0; }
  // (begin, count) of source s's rows (throughput: e is ignored).
  const int64_t* range(int e, int s) const {
    const size_t i =
        layout == Layout::kLatency ? static_cast<size_t>(e * ranks + s) : static_cast<size_t>(s);
    return recv_range.get<int64_t>() + 2 * i;
  }

  // Writes one token's row(s) for `dest` on behalf of `source` (itself or, on a relay, a rank
  // of another host): idx/w/expert_slot are the token's K entries, slot its index among the
  // source's rows for dest, row_off/expert_off where the source's rows start at dest; done(tag)
  // completes each row.
  template <typename Done>
  void place_row(const Window& win, int dest, int source, int32_t t, RowRef row, const int32_t* idx,
                 const float* w, int K, int64_t slot, const int32_t* expert_slot, int64_t row_off,
                 const int64_t* expert_off, Done&& done) const;
  // This rank's token slot i for `dest`, read from `source`.
  template <typename Done>
  void send_rows(const Window& win, int dest, int64_t i, Done&& done) const;
  // Receiver: the tag of every expected row, in order; visit(tag, row index in the output).
  template <typename Visit>
  void for_each_expected_row(const Window& win, Visit&& visit) const;
  // Combine, expert side: member m's equal share of the valid received rows, in compact order;
  // visit(row index in the dispatch output, index in compact order).
  template <typename Visit>
  void for_each_output_row(int m, int members, Visit&& visit) const;
  // bsp combine: the owner of received row `row` and its slot in the owner's staging.
  void row_owner(const Window& win, int max_topk, int64_t row, int* owner,
                 int64_t* push_slot) const;

 private:
  std::vector<std::atomic<uint64_t>> offsets_ready_;  // [R]
  std::vector<uint8_t> masked_;                       // [R]
  uint64_t send_generation_ = 0;
  std::atomic<int> topk_mismatch_{-1};
  std::atomic<int> shape_mismatch_{-1};
  // Visits every (expert or 0, source) range in compact order: fn(e, s, begin, count, base)
  // where base is the output index of row 0 of expert e (latency) or 0.
  template <typename Fn>
  void for_each_range(Fn&& fn) const {
    const int experts = layout == Layout::kLatency ? local_experts : 1;
    for (int e = 0; e < experts; ++e)
      for (int s = 0; s < ranks; ++s) {
        const int64_t* r = range(e, s);
        fn(e, s, r[0], r[1], layout == Layout::kLatency ? e * RT() : int64_t{0});
      }
  }
};

template <typename Done>
void CallState::place_row(const Window& win, int dest, int source, int32_t t, RowRef row,
                          const int32_t* idx, const float* w, int K, int64_t slot,
                          const int32_t* expert_slot, int64_t row_off, const int64_t* expert_off,
                          Done&& done) const {
  const WindowLayout& m = win.map();
  const size_t xb = m.codec.payload_bytes, sb = m.codec.scale_bytes;
  if (layout == Layout::kThroughput) {
    const auto pos = row_off + slot;
    const auto p = static_cast<size_t>(pos);
    win.put_dispatch_row(win.at<char>(dest, m.tp_x) + p * xb,
                         win.at<char>(dest, m.tp_scale) + p * sb, row, stream_rows);
    const int64_t src[2] = {source, t};
    win.put(win.at<int64_t>(dest, m.tp_src) + 2 * pos, src, sizeof src);
    int32_t oidx[64];
    float ow[64];
    for (int j = 0; j < K; ++j) {
      const int32_t e = idx[j];
      const bool here = e >= 0 && e / local_experts == dest;
      oidx[j] = here ? e % local_experts : -1;
      ow[j] = here ? w[j] : 0.0f;
    }
    win.put(win.at<int32_t>(dest, m.tp_idx) + pos * K, oidx, 4 * static_cast<size_t>(K));
    win.put(win.at<float>(dest, m.tp_w) + pos * K, ow, 4 * static_cast<size_t>(K));
    done(win.at<Tag>(dest, m.tp_tag) + pos);
  } else {
    for (int j = 0; j < K; ++j) {
      const int32_t e = idx[j];
      if (e < 0 || e / local_experts != dest) continue;
      const int le = e % local_experts;
      const int64_t pos = le * RT() + expert_off[le] + expert_slot[j];
      const auto p = static_cast<size_t>(pos);
      win.put_dispatch_row(win.at<char>(dest, m.lat_x) + p * xb,
                           win.at<char>(dest, m.lat_scale) + p * sb, row, stream_rows);
      const int64_t src[2] = {source, t};
      win.put(win.at<int64_t>(dest, m.lat_src) + 2 * pos, src, sizeof src);
      const auto k = static_cast<int8_t>(j);
      win.put(win.at<int8_t>(dest, m.lat_k) + pos, &k, 1);
      done(win.at<Tag>(dest, m.lat_tag) + pos);
    }
  }
}

template <typename Done>
void CallState::send_rows(const Window& win, int dest, int64_t i, Done&& done) const {
  const int32_t t = routing.dest_token(dest, i);
  const size_t tK = static_cast<size_t>(t) * static_cast<size_t>(routing.topk);
  place_row(win, dest, rank, t, source.row(t), &routing.topk_idx[tK], &routing.topk_weights[tK],
            routing.topk, i, &routing.expert_slot[tK], row_offset_at[static_cast<size_t>(dest)],
            &expert_offset_at[static_cast<size_t>(dest * local_experts)], std::forward<Done>(done));
}

template <typename Visit>
void CallState::for_each_expected_row(const Window& win, Visit&& visit) const {
  const Tag* tags =
      win.at<Tag>(rank, layout == Layout::kThroughput ? win.map().tp_tag : win.map().lat_tag);
  for_each_range([&](int, int, int64_t begin, int64_t count, int64_t base) {
    for (int64_t p = base + begin; p < base + begin + count; ++p) visit(tags + p, p);
  });
}

template <typename Visit>
void CallState::for_each_output_row(int m, int members, Visit&& visit) const {
  const int64_t begin = num_recv_rows * m / members, end = num_recv_rows * (m + 1) / members;
  int64_t seen = 0;  // valid rows of the ranges before this one
  for_each_range([&](int, int, int64_t first, int64_t count, int64_t base) {
    const int64_t p0 = std::max<int64_t>(begin - seen, 0), p1 = std::min(count, end - seen);
    for (int64_t p = p0; p < p1; ++p) visit(base + first + p, seen + p);
    seen += count;
  });
}

}  // namespace ubep::ep
