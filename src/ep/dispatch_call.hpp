// One dispatch (and the combines of it) on one rank, as the engine hands it to an algorithm:
//   input     routed by the engine from the caller's arguments (route()): the routing, this
//             rank's rows, the call's shape. Read-only for the algorithms and the relay.
//   products  what the algorithm records while it runs the call, through the methods below:
//             where this rank's rows start at every destination (sender side, kept for combine)
//             and what arrived (receiver side, returned as Arrivals).
// Also the placement arithmetic of rows in the window, which both algorithms and the relay share.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/local_array.hpp"
#include "ep/routing.hpp"
#include "ep/store_tuner.hpp"
#include "ep/window.hpp"
#include "protocol/config_checks.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

// A peer made a different call (layout or placement) in this call, found by the receive hook:
// an InvalidArgument that leaves the buffer usable (HostEngine's phases let it through without
// breaking the buffer; dispatch_recv then ends the call with the same error on every rank).
class MismatchedCallError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// What a dispatch's receive produced: views of the call's receiver-side records, valid until
// the next route().
struct Arrivals {
  const int64_t* recv_count;  // [El] rows per local expert
  const int64_t* recv_range;  // (begin, count): latency [El, R, 2], throughput [R, 2]
  int64_t num_recv_rows;      // valid rows in all
  int shape_mismatch;         // a source that made a different call (layout, placement), or -1
  int topk_mismatch;          // a source whose topk differed, or -1
};

class DispatchCall {
 public:
  DispatchCall(int rank, const BufferConfig& cfg, int ranks);
  // The widest topk a Buffer serves (its config check): the size of place_row's and
  // send_tokens' per-token arrays.
  static constexpr int kMaxTopk = protocol::ConfigLimits{}.max_topk;

  // --- the input, set by the engine for each dispatch ---
  // Validates the arguments and builds the routing (throws before anything is written), then
  // takes this rank's dispatch rows by token from rows_of()
  // (the caller's x and x_scales, or their fp8 cast: made only once the arguments are valid).
  template <typename RowsOf>
  void route(const DispatchArgs& a, const BufferConfig& cfg, RowsOf&& rows_of) {
    build_routing(a, cfg);
    rows_ = rows_of();
  }
  // A combine with its own topk_weights (latency layout) weighs with them; one without uses the
  // dispatch's again, as the first combine would have.
  void use_combine_weights(const float* weights);

  const Routing& routing() const { return routing_; }
  const RowArrays& rows() const { return rows_; }
  Layout layout() const { return layout_; }
  Placement placement() const { return placement_; }  // resolved (never kAuto)
  // The count record's call-shape word for this call (protocol.hpp).
  int32_t shape() const {
    return call_shape(static_cast<int>(layout_), static_cast<int>(placement_));
  }
  const int rank, ranks, local_experts;
  const int64_t max_tokens;  // per rank
  // The ranks masked in this buffer's agreed view (docs/ELASTIC.md), set between calls by the
  // engine: never sent to, never waited for, their count records read as zero; the routing
  // drops the topk entries of their experts (those weights contribute nothing to combine).
  bool masked(int r) const { return masked_[static_cast<size_t>(r)] != 0; }
  void set_masked(const std::vector<uint8_t>& m) { masked_ = m; }
  // Rows of one local expert's region in the latency layout: a slot per (source, token).
  int64_t expert_slots() const { return static_cast<int64_t>(ranks) * max_tokens; }
  // Rows into a peer's dispatch output go with non-temporal stores at every size: they skip the
  // read-for-ownership of lines the writer never reads (like DeepEP's no-allocate stores).
  // Plain stores below 4 MiB, meant to leave small calls' rows in cache for their receiver,
  // lost on the project's AMD EPYC VM (2026-12-03, 2 MPI ranks, old and new binary alternated,
  // docs/PERFORMANCE.md): tiny dispatch 11.4-13.9 us against 9.0-25.0 us (medians of 6 runs 12.9
  // against 23.4), 16 tokens (1.8 MB a rank) 306 against 425 us (medians of 4), while the
  // expert's first read of the rows after the call moved by less: 16.9 against 19.2 us (tiny),
  // 420 against 401 us (16 tokens). Combine outputs keep a threshold
  // (reducer.hpp: there the caller reads y right away, and streaming it did not pay).
  static constexpr double kStreamBytes = 4.0 * (1 << 20);  // combine outputs only
  // A combine's expert outputs staged into this rank's window (x not its combine buffer) take
  // plain stores, for the owners that read them right away, until they are far larger than a
  // cache holds: then the read-for-ownership of every line is a third of the traffic. 4096
  // tokens (117 MB a rank; 2 process ranks, Zen 3 VM, DeepEP's combine, 3 alternated rounds):
  // 35.5, 31.7, 31.6 -> 24.9, 28.2, 28.7 ms (docs/PERFORMANCE.md, thirtieth session).
  static constexpr size_t kStreamStagedBytes = size_t{16} << 20;
  // A rank's rows to itself are the exception while they fit in a core's cache: their lines
  // were last read by this rank's own expert, so a plain store finds them in its own cache (no
  // fetch from another core), and the expert's read after the call finds its rows there
  // instead of in memory. Zen 1 VM, 2 MPI ranks, alternated (docs/PERFORMANCE.md, eleventh
  // session): 1 token (56 KiB to itself) dispatch 12.3 -> 10.5 us; 4 tokens (224 KiB) 44 -> 34
  // us and the expert's read 80 -> 64 us; 16 tokens (900 KiB) 236 -> 305 us, a loss, hence the
  // bound (half the smallest L2 the project runs on, Zen 1's 512 KiB). And a small call's rows to
  // peers take the stores this rank measured faster (StoreTuner: which one wins depends on the
  // machine's state, not on a size).
  static constexpr size_t kPlainSelfBytes = 256 << 10;
  // Whether a row from `source` into `dest`'s window of `bytes` (payload and scales) streams.
  bool streams_row(int dest, int source, size_t bytes) const {
    if (dest == rank && source == rank)
      return static_cast<size_t>(rows_to_self_) * bytes > kPlainSelfBytes;
    return stream_to_peers_;
  }
  // Around the send of this rank's rows: choose_stores() before, with the window's row codec;
  // sent() after, with the send stage's own work (us), which the tuner learns from.
  void choose_stores(const RowCodec& codec) {
    stream_to_peers_ = store_tuner_.stream(static_cast<size_t>(rows_to_peers_) * codec.row_bytes());
    by_token_ = static_cast<size_t>(routing_.num_tokens) * codec.row_bytes() > kTokenOrderBytes;
  }
  // Whether this call's senders go token by token (send_tokens) or destination by destination
  // (send_rows over each destination's slots). By token once this rank's rows outgrow a core's
  // cache: then destination by destination reads x from memory once per destination (prefill,
  // 30-60 MB: 1.47x -> 1.22x the bound for fp8, 1.07x -> 0.83x for bf16, docs/PERFORMANCE.md,
  // issue 31). Below it, by destination: a decode call's x (1.8 MB) stays in cache, token order
  // measured the same there (pair ratios 0.99 / 1.03), and by destination the first
  // destinations' rows are complete early for their receive hooks (wait_recv_range), where by
  // token every destination's last row comes at the end of the send.
  static constexpr size_t kTokenOrderBytes = size_t{4} << 20;
  // How far ahead of a throughput row its sender fetches the metadata lines it writes later.
  static constexpr int64_t kMetadataAhead = 16;
  bool sends_by_token() const { return by_token_; }
  void sent(double own_us) { store_tuner_.record(own_us); }

  // --- sender side: where this rank's rows start at each destination (from the count records
  // of the lower-ranked sources). Kept for combine, which reads the rows back there.
  int64_t row_offset_at(int dest) const { return row_offset_at_[static_cast<size_t>(dest)]; }
  int64_t expert_offset_at(int dest, int local_expert) const {
    return expert_offset_at_[static_cast<size_t>(dest * local_experts + local_expert)];
  }
  // Whether the offsets at a destination depend on the lower ranks' count records there.
  bool offsets_need_counts() const { return placement_ == Placement::kCompact; }
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
  // After every count record of this call is visible: per-expert counts, each source's range
  // (from the placement) and total rows.
  void receive_counts(const Window& w);
  Arrivals arrivals() const {
    return {recv_count_.get<int64_t>(), recv_range_.get<int64_t>(), num_recv_rows_,
            shape_mismatch(), topk_mismatch()};
  }
  int64_t num_recv_rows() const { return num_recv_rows_; }
  // Rows the dispatch output spans (throughput: per-source placement leaves gaps).
  int64_t throughput_span() const {
    return placement_ == Placement::kPerSource ? expert_slots() : num_recv_rows_;
  }
  // A source whose topk, or call shape, differed from ours in this call, or -1.
  int topk_mismatch() const { return topk_mismatch_.load(std::memory_order_relaxed); }
  int shape_mismatch() const { return shape_mismatch_.load(std::memory_order_relaxed); }
  // Before receive_counts, for the receive hook: (begin, count) of source s's rows for local
  // expert e (throughput: e is ignored), read from the count records of sources
  // [first_range_source(s), s], which must be visible. A record of another call shape throws.
  std::array<int64_t, 2> range_from_counts(const Window& w, int e, int s) const;
  int first_range_source(int s) const { return placement_ == Placement::kPerSource ? s : 0; }
  // (begin, count) of source s's rows (throughput: e is ignored).
  const int64_t* range(int e, int s) const {
    const size_t i =
        layout_ == Layout::kLatency ? static_cast<size_t>(e * ranks + s) : static_cast<size_t>(s);
    return recv_range_.get<int64_t>() + 2 * i;
  }

  // Writes one token's row(s) for `dest` on behalf of `source` (itself or, on a relay, a rank
  // of another host): idx/w/expert_slot are the token's K entries, entry_rank their experts'
  // ranks (the routing's; nullptr: looked up here), slot its index among the source's rows for
  // dest, row_off/expert_off where the source's rows start at dest; done(tag) completes each row.
  template <typename Done>
  void place_row(const Window& win, int dest, int source, int32_t t, RowRef row, const int32_t* idx,
                 const int32_t* entry_rank, const float* w, int K, int64_t slot,
                 const int32_t* expert_slot, int64_t row_off, const int64_t* expert_off,
                 Done&& done) const;
  // This rank's token slot i for `dest`, read from `source`.
  template <typename Done>
  void send_rows(const Window& win, int dest, int64_t i, Done&& done) const;
  // This rank's token t, its row(s) for `dest` at slot `slot` there (send_rows, send_tokens).
  template <typename Done>
  void place_token(const Window& win, int dest, int32_t t, int64_t slot, Done&& done) const;
  // This rank's rows of tokens [begin, end), token by token (sends_by_token): each token's rows
  // to every destination it goes to and reach(dest) accepts (rotated to start after this rank,
  // so senders spread over receivers), before the next token, so its x row is read once, from
  // cache after the first destination. Each destination still gets its rows in slot order.
  template <typename Reach, typename Done>
  void send_tokens(const Window& win, int64_t begin, int64_t end, Reach&& reach, Done&& done) const;
  // Receiver: the tag of every expected row, in order; visit(tag, row index in the output,
  // source rank).
  template <typename Visit>
  void for_each_expected_row(const Window& win, Visit&& visit) const;
  // Where received row `row`'s tag is: in its LatencyRecord, or in the throughput tag array.
  struct RowTags {
    const Tag* tp = nullptr;
    const LatencyRecord* lat = nullptr;
    const Tag* at(int64_t row) const { return lat ? &lat[row].tag : tp + row; }
  };
  RowTags row_tags(const Window& win) const;
  // Latency layout, owner side: recv_src's (source, token) of received row `row` from
  // `source`, noted once its tag was acquired (or a barrier ordered every row's stores before
  // this) from the sender's record. Owner-only writes to this rank's own window, by the one
  // thread that receives (ubep's receive hook and dispatch_recv, bsp after its last barrier):
  // the sender's token_k store precedes its tag's release, so the read sees this call's word.
  // Senders never write lat_src. Throughput rows carry theirs (tp_src): src is null there.
  struct SourceNotes {
    const LatencyRecord* recs = nullptr;
    int64_t* src = nullptr;
    void note(int64_t row, int source) const {
      src[2 * row] = source;
      src[2 * row + 1] = recs[row].token();
    }
  };
  SourceNotes source_notes(const Window& win) const;
  // Every received row's note (bsp: all of them are here after its last barrier).
  void record_sources(const Window& win) const;
  // Combine, expert side: member m's equal share of the valid received rows, in compact order;
  // visit(row index in the dispatch output, index in compact order).
  template <typename Visit>
  void for_each_output_row(int m, int members, Visit&& visit) const;
  // bsp combine: the owner of received row `row` and its slot in the owner's staging.
  void row_owner(const Window& win, int max_topk, int64_t row, int* owner,
                 int64_t* push_slot) const;

 private:
  void build_routing(const DispatchArgs& a, const BufferConfig& cfg);
  // A throughput row's K entries as `dest` receives them: the local expert id and weight of
  // each entry at dest, -1 and 0 for the others.
  static inline void entries_at_dest(int K, int dest, int32_t first_expert, const int32_t* idx,
                                     const int32_t* entry_rank, const float* w, int32_t* out_idx,
                                     float* out_w) {
    for (int j = 0; j < K; ++j) {
      const int32_t here = -static_cast<int32_t>(entry_rank[j] == dest);  // 0 or ~0
      out_idx[j] = ((idx[j] - first_expert) & here) | ~here;
      uint32_t bits;
      std::memcpy(&bits, &w[j], sizeof bits);
      bits &= static_cast<uint32_t>(here);
      std::memcpy(&out_w[j], &bits, sizeof bits);
    }
  }
  // receive_counts' two passes: every (expert, source) range, or (latency layout, between calls
  // of one placement) only those of experts that received rows now or in the last call; false
  // when a source made another call (the dense pass then names it).
  void receive_all_counts(const Window& w);
  bool receive_expert_counts(const Window& w);

  Routing routing_;
  RowArrays rows_;
  std::vector<float> dispatch_weights_;  // the dispatch's, while a combine uses its own
  bool weights_replaced_ = false;
  Layout layout_ = Layout::kThroughput;
  Placement placement_ = Placement::kCompact;
  std::vector<int64_t> row_offset_at_;     // [R] throughput
  std::vector<int64_t> expert_offset_at_;  // [R, El] latency: compact sets the experts sent to
  LocalArray recv_count_;                  // [El] int64
  LocalArray recv_range_;  // int64 (begin, count): latency [El, R, 2], throughput [R, 2]
  int64_t num_recv_rows_ = 0;
  bool sparse_ranges_ = false;  // receive_counts' invariant holds (dispatch_call.cpp)
  Placement ranges_placement_ = Placement::kCompact;  // the placement it holds for
  std::vector<const int32_t*> sources_;               // [R] scratch: count records' expert rows
  std::vector<int32_t> reached_;                      // [El] scratch: experts to rewrite
  std::vector<int32_t> last_reached_;  // experts with rows in the last latency call (ascending)
  // last_reached_ lists exactly this call's experts with rows (set by receive_counts, cleared
  // by the next routing): for_each_range walks it instead of every local expert.
  bool reached_listed_ = false;
  // [R] the destination's expert_offset_at_ entries hold the per-source offsets (rank x
  // max_tokens) everywhere, so compute_offsets need not write them again (they depend on
  // nothing but the rank); compact placement's offsets overwrite some and clear it.
  std::vector<uint8_t> per_source_offsets_;
  std::vector<std::atomic<uint64_t>> offsets_ready_;  // [R]
  std::vector<uint8_t> masked_;                       // [R]
  uint64_t send_generation_ = 0;
  int64_t rows_to_self_ = 0;   // this call's rows from this rank into its own window
  int64_t rows_to_peers_ = 0;  // and into other ranks' windows
  // Written by the calling thread in choose_stores() before run_roles() starts the senders, read
  // by them during it: the team's start orders the write before their reads, as it does for the
  // routing, and nothing writes it again until the team has joined.
  bool stream_to_peers_ = true;
  bool by_token_ = false;  // the senders' order (sends_by_token): written and read as above
  StoreTuner store_tuner_;
  std::atomic<int> topk_mismatch_{-1};
  std::atomic<int> shape_mismatch_{-1};
  // Visits every non-empty (expert or 0, source) range in compact order: fn(e, s, begin,
  // count, base) where base is the output index of row 0 of expert e (latency) or 0. Experts
  // that received nothing are skipped whole: a small call (one token: 8 rows over 128 local
  // experts x 2 sources) would otherwise walk hundreds of empty ranges per phase. Where
  // receive_counts listed the experts that received rows (reached_listed_), only those are
  // visited: a phase then costs O(rows), not O(local experts).
  template <typename Fn>
  void for_each_range(Fn&& fn) const {
    const bool latency = layout_ == Layout::kLatency;
    auto visit_expert = [&](int e) {
      for (int s = 0; s < ranks; ++s) {
        const int64_t* r = range(e, s);
        if (r[1] > 0) fn(e, s, r[0], r[1], latency ? e * expert_slots() : int64_t{0});
      }
    };
    if (latency && reached_listed_) {
      for (int32_t e : last_reached_) visit_expert(e);
      return;
    }
    const int64_t* counts = recv_count_.get<int64_t>();
    for (int e = 0; e < (latency ? local_experts : 1); ++e)
      if (!latency || counts[e] != 0) visit_expert(e);
  }
};

template <typename Done>
void DispatchCall::place_row(const Window& win, int dest, int source, int32_t t, RowRef row,
                             const int32_t* idx, const int32_t* entry_rank, const float* w, int K,
                             int64_t slot, const int32_t* expert_slot, int64_t row_off,
                             const int64_t* expert_off, Done&& done) const {
  const WindowLayout& m = win.map();
  const size_t xb = m.codec.payload_bytes, sb = m.codec.scale_bytes;
  int32_t looked_up[kMaxTopk];
  if (!entry_rank) {  // a relayed token's entries (the routing's are this rank's tokens only)
    for (int j = 0; j < K; ++j)
      looked_up[j] = idx[j] < 0 ? -1 : routing_.expert_rank[static_cast<size_t>(idx[j])];
    entry_rank = looked_up;
  }
  // An entry at dest names one of dest's experts: its local index is its id less this.
  const int32_t first_expert = dest * local_experts;
  if (layout_ == Layout::kThroughput) {
    const auto pos = row_off + slot;
    const auto p = static_cast<size_t>(pos);
    backend::RowMessage msg = win.dispatch_message(win.at<char>(dest, m.tp_x) + p * xb,
                                                   win.at<char>(dest, m.tp_scale) + p * sb, row,
                                                   streams_row(dest, source, xb + sb));
    const int64_t src[2] = {source, t};
    msg.add(win.at<int64_t>(dest, m.tp_src) + 2 * pos, src, sizeof src);
    // The metadata lines of the row kMetadataAhead slots on at dest (a sender's rows to a
    // destination take consecutive slots), fetched for writing now: they were last read by the
    // receiver, and a plain store that misses holds up the stores after it, the row copies'
    // included. Prefill, 4 alternated pairs: dispatch 1.6% faster bf16, 0.4% fp8
    // (docs/PERFORMANCE.md, issue 31, 22nd session).
    if (const int64_t a = pos + kMetadataAhead; a < m.tp_rows()) {
      msg.writes_soon(win.at<int64_t>(dest, m.tp_src) + 2 * a);
      msg.writes_soon(win.at<int32_t>(dest, m.tp_idx) + a * K);
      msg.writes_soon(win.at<float>(dest, m.tp_w) + a * K);
      msg.writes_soon(win.at<Tag>(dest, m.tp_tag) + a);
    }
    // The row's entries at `dest`, without a branch per entry (whether an entry is there is
    // random with random routing) and without a lookup per entry (a gather: the loop then does
    // not vectorize): its local expert and weight where it is, -1 and 0 where not.
    int32_t oidx[kMaxTopk];
    float ow[kMaxTopk];
    entries_at_dest(K, dest, first_expert, idx, entry_rank, w, oidx, ow);
    msg.add(win.at<int32_t>(dest, m.tp_idx) + pos * K, oidx, 4 * static_cast<size_t>(K));
    msg.add(win.at<float>(dest, m.tp_w) + pos * K, ow, 4 * static_cast<size_t>(K));
    win.put_message(msg);
    done(win.at<Tag>(dest, m.tp_tag) + pos);
  } else {
    for (int j = 0; j < K; ++j) {
      if (entry_rank[j] != dest) continue;
      const int le = idx[j] - first_expert;
      const int64_t pos = le * expert_slots() + expert_off[le] + expert_slot[j];
      const auto p = static_cast<size_t>(pos);
      backend::RowMessage msg = win.dispatch_message(win.at<char>(dest, m.lat_x) + p * xb,
                                                     win.at<char>(dest, m.lat_scale) + p * sb, row,
                                                     streams_row(dest, source, xb + sb));
      LatencyRecord* rec = win.at<LatencyRecord>(dest, m.lat_rec) + pos;
      const uint32_t token_k = LatencyRecord::pack(t, j);
      msg.add(&rec->token_k, &token_k, sizeof token_k);
      win.put_message(msg);
      done(&rec->tag);
    }
  }
}

template <typename Done>
void DispatchCall::send_rows(const Window& win, int dest, int64_t i, Done&& done) const {
  place_token(win, dest, routing_.dest_token(dest, i), i, std::forward<Done>(done));
}

template <typename Done>
void DispatchCall::place_token(const Window& win, int dest, int32_t t, int64_t slot,
                               Done&& done) const {
  const size_t tK = static_cast<size_t>(t) * static_cast<size_t>(routing_.topk);
  place_row(win, dest, rank, t, rows_.row(t), &routing_.topk_idx[tK], &routing_.entry_rank[tK],
            &routing_.topk_weights[tK], routing_.topk, slot, &routing_.expert_slot[tK],
            row_offset_at_[static_cast<size_t>(dest)],
            &expert_offset_at_[static_cast<size_t>(dest * local_experts)],
            std::forward<Done>(done));
}

template <typename Reach, typename Done>
void DispatchCall::send_tokens(const Window& win, int64_t begin, int64_t end, Reach&& reach,
                               Done&& done) const {
  // A token's destinations by distance after this rank: its row of sent_to (which the routing
  // fills from the same entries) read in rotated order. Sorting its K entries' ranks instead
  // took a data-dependent branch or more per entry, which random routing takes or not at
  // random, on a path that every row of a prefill pays (this way: prefill dispatch 8% faster
  // fp8, 5% bf16, 2 ranks; docs/PERFORMANCE.md, issue 31, 21st session). The scan is O(R) a
  // token: one more pass like the two the routing build already makes over every rank per
  // token, so with many ranks it adds to a cost the call already has (unmeasured beyond 3).
  for (int64_t t = begin; t < end; ++t) {
    const uint8_t* sent = &routing_.sent_to[static_cast<size_t>(t * ranks)];
    for (int k = 1; k <= ranks; ++k) {
      const int dest = rank + k < ranks ? rank + k : rank + k - ranks;
      if (sent[dest] && reach(dest))
        place_token(win, dest, static_cast<int32_t>(t), routing_.slot_at(t, dest), done);
    }
  }
}

template <typename Visit>
void DispatchCall::for_each_expected_row(const Window& win, Visit&& visit) const {
  const RowTags tags = row_tags(win);
  for_each_range([&](int, int s, int64_t begin, int64_t count, int64_t base) {
    for (int64_t p = base + begin; p < base + begin + count; ++p) visit(tags.at(p), p, s);
  });
}

template <typename Visit>
void DispatchCall::for_each_output_row(int m, int members, Visit&& visit) const {
  const int64_t begin = num_recv_rows_ * m / members, end = num_recv_rows_ * (m + 1) / members;
  int64_t seen = 0;  // valid rows of the ranges before this one
  for_each_range([&](int, int, int64_t first, int64_t count, int64_t base) {
    const int64_t p0 = std::max<int64_t>(begin - seen, 0), p1 = std::min(count, end - seen);
    for (int64_t p = p0; p < p1; ++p) visit(base + first + p, seen + p);
    seen += count;
  });
}

}  // namespace ubep::ep
