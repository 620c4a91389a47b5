// The state of one dispatch/combine pair on one rank: its routing, where this rank's rows go at
// every destination (sender side), what arrived (receiver side), and the placement of rows in
// the window -- the arithmetic both algorithms and the relay share.
#pragma once

#include <algorithm>
#include <atomic>
#include <vector>

#include "core/local_array.hpp"
#include "ep/routing.hpp"
#include "ep/window.hpp"

namespace ubep::ep {

class CallState {
 public:
  CallState(int rank, const BufferConfig& cfg, int ranks, bool latency_enabled);

  // Validates the inputs and builds the routing (throws before anything is written), then
  // decides the per-call store policy.
  void begin(const DispatchArgs& a, const BufferConfig& cfg, size_t row_bytes);

  Routing routing;
  Layout layout = Layout::kThroughput;
  int rank, ranks, local_experts;
  int64_t T;  // max tokens per rank
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
  // Reads the count records of sources below this rank at `dest` (they must be visible).
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
  LocalArray recv_count;  // [El] int64
  int64_t num_recv_rows = 0;
  // After every count record of this call is visible: per-expert counts and total rows.
  void receive_counts(const Window& w);
  // A source whose topk differed from ours in this call, or -1.
  int topk_mismatch() const { return topk_mismatch_.load(std::memory_order_relaxed); }

  // Writes one token's row(s) for `dest` on behalf of `source` (itself or, on a relay, a rank
  // of another host): idx/w/expert_slot are the token's K entries, slot its index among the
  // source's rows for dest, row_off/expert_off where the source's rows start at dest; done(tag)
  // completes each row.
  template <typename Done>
  void place_row(const Window& win, int dest, int source, int32_t t, const char* row,
                 const int32_t* idx, const float* w, int K, int64_t slot,
                 const int32_t* expert_slot, int64_t row_off, const int64_t* expert_off,
                 Done&& done) const;
  // This rank's token slot i for `dest`, read from x.
  template <typename Done>
  void send_rows(const Window& win, const void* x, int dest, int64_t i, Done&& done) const;
  // Receiver: the tag of every expected row, in order; visit(tag, description-index).
  template <typename Visit>
  void for_each_expected_row(const Window& win, Visit&& visit) const;
  // Combine, expert side: member m's equal share of the received rows (index into the
  // dispatch output; in the latency layout only the recv_count[e] valid slots of each expert).
  template <typename Visit>
  void for_each_output_row(int m, int members, Visit&& visit) const;
  // bsp combine: the owner of received row `row` and its slot in the owner's staging.
  void row_owner(const Window& win, int max_topk, int64_t row, int* owner,
                 int64_t* push_slot) const;

 private:
  std::vector<std::atomic<uint64_t>> offsets_ready_;  // [R]
  uint64_t send_generation_ = 0;
  std::atomic<int> topk_mismatch_{-1};
};

template <typename Done>
void CallState::place_row(const Window& win, int dest, int source, int32_t t, const char* row,
                          const int32_t* idx, const float* w, int K, int64_t slot,
                          const int32_t* expert_slot, int64_t row_off, const int64_t* expert_off,
                          Done&& done) const {
  const WindowLayout& m = win.map();
  const size_t rb = win.row_bytes();
  if (layout == Layout::kThroughput) {
    const int64_t pos = row_off + slot;
    win.put_row(win.at<char>(dest, m.tp_x) + static_cast<size_t>(pos) * rb, row, stream_rows);
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
      win.put_row(win.at<char>(dest, m.lat_x) + static_cast<size_t>(pos) * rb, row, stream_rows);
      const int64_t src[2] = {source, t};
      win.put(win.at<int64_t>(dest, m.lat_src) + 2 * pos, src, sizeof src);
      const auto k = static_cast<int8_t>(j);
      win.put(win.at<int8_t>(dest, m.lat_k) + pos, &k, 1);
      done(win.at<Tag>(dest, m.lat_tag) + pos);
    }
  }
}

template <typename Done>
void CallState::send_rows(const Window& win, const void* x, int dest, int64_t i,
                          Done&& done) const {
  const int32_t t = routing.dest_token(dest, i);
  const size_t tK = static_cast<size_t>(t) * static_cast<size_t>(routing.topk);
  place_row(win, dest, rank, t,
            static_cast<const char*>(x) + static_cast<size_t>(t) * win.row_bytes(),
            &routing.topk_idx[tK], &routing.topk_weights[tK], routing.topk, i,
            &routing.expert_slot[tK], row_offset_at[static_cast<size_t>(dest)],
            &expert_offset_at[static_cast<size_t>(dest * local_experts)], std::forward<Done>(done));
}

template <typename Visit>
void CallState::for_each_expected_row(const Window& win, Visit&& visit) const {
  if (layout == Layout::kThroughput) {
    const Tag* tags = win.at<Tag>(rank, win.map().tp_tag);
    for (int64_t pos = 0; pos < num_recv_rows; ++pos) visit(tags + pos, pos);
  } else {
    const Tag* tags = win.at<Tag>(rank, win.map().lat_tag);
    const auto* counts = recv_count.get<int64_t>();
    for (int e = 0; e < local_experts; ++e)
      for (int64_t p = 0; p < counts[e]; ++p) visit(tags + e * RT() + p, e * RT() + p);
  }
}

template <typename Visit>
void CallState::for_each_output_row(int m, int members, Visit&& visit) const {
  if (layout == Layout::kThroughput) {
    for (int64_t row = num_recv_rows * m / members; row < num_recv_rows * (m + 1) / members; ++row)
      visit(row);
    return;
  }
  const auto* counts = recv_count.get<int64_t>();
  int64_t total = 0;
  for (int e = 0; e < local_experts; ++e) total += counts[e];
  const int64_t begin = total * m / members, end = total * (m + 1) / members;
  int64_t seen = 0;  // valid rows of the experts before e
  for (int e = 0; e < local_experts && seen < end; seen += counts[e], ++e) {
    const int64_t p0 = std::max<int64_t>(begin - seen, 0), p1 = std::min(counts[e], end - seen);
    for (int64_t p = p0; p < p1; ++p) visit(e * RT() + p);
  }
}

}  // namespace ubep::ep
