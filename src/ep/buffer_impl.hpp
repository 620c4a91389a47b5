// State of one Buffer and the message-level steps both algorithms are built from. The
// algorithms (bsp.cpp, ubep.cpp) differ in how they order and synchronise these steps.
#pragma once

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "core/local_array.hpp"
#include "core/row_kernels.hpp"
#include "core/wait.hpp"
#include "ep/protocol.hpp"
#include "ep/routing.hpp"
#include "ep/worker_team.hpp"
#include "ubep/buffer.hpp"
#include "ubep/scheduler.hpp"

namespace ubep {

class HostRelay;

struct Buffer::Impl {
  Group& group;
  BufferConfig cfg;
  int rank, ranks, local_experts;
  int64_t T;  // max tokens per rank
  ep::WindowLayout win;
  std::unique_ptr<SharedWindow> window;
  ep::Routing routing;
  WaitPolicy wait;
  std::unique_ptr<ep::WorkerTeam> team;

  uint64_t next_seq;  // sequence number of the next dispatch
  uint64_t seq = 0;   // the dispatch in flight / last completed (combine uses it too)
  Layout layout = Layout::kThroughput;
  enum class Phase { kIdle, kDispatchSent, kCombineSent } phase = Phase::kIdle;
  bool have_dispatch = false;
  bool combined = false;  // the last dispatch was combined (at most once: see ubep.cpp)

  // Sender side: where this rank's rows start in each destination's outputs (from the count
  // records of the lower-ranked sources). Kept for combine, which reads the rows back there.
  std::vector<int64_t> row_offset_at;                // [R] throughput
  std::vector<int64_t> expert_offset_at;             // [R, El] latency
  std::vector<std::atomic<uint64_t>> offsets_ready;  // == send_generation once ready
  uint64_t send_generation = 0;  // counts dispatch sends from 1 (independent of epochs, never 0) //
                                 // [R] seq+1 once the offsets for a destination are known

  // Receiver side.
  LocalArray recv_count;  // [El] int64
  int64_t num_recv_rows = 0;
  std::atomic<int> topk_mismatch{-1};  // a source whose topk differs from ours

  std::unique_ptr<HostRelay> relay;             // cross-host relay, when the group spans hosts
  std::unique_ptr<sched::Scheduler> scheduler;  // when cfg.schedule plans the send work
  sched::Plan plan;
  std::vector<int64_t> plan_rows;  // [R] rows per destination handed to the scheduler

  LocalArray y;             // [T, row] combine output
  std::vector<float> part;  // [hidden] one host's partial (multi-host combine)
  std::vector<float> acc;   // [members, hidden] fp32 accumulators
  CallStats stats;

  Impl(Group& g, const BufferConfig& c);
  ~Impl();
  void record_network();  // copies the relay's counters into stats

  int half() const { return ep::half_of(seq); }
  uint32_t tag() const { return ep::tag_of(seq); }
  size_t row_bytes() const { return win.row_bytes; }
  int64_t RT() const { return win.tp_rows(); }
  void* peer(int r) const { return window->base(r); }
  void* local() const { return window->local(); }
  template <typename T>
  T* at(int r, size_t region) const {
    return win.at<T>(peer(r), half(), region);
  }

  // --- steps shared by the algorithms ---
  void begin_dispatch(const DispatchArgs& a);
  // Reads the count records of sources below this rank at `dest` (they must be visible).
  void compute_offsets(int dest);
  // Writes the rows of token slot i for `dest` into dest's outputs; calls done(tag) per message.
  template <typename Done>
  void send_rows(const DispatchArgs& a, int dest, int64_t i, Done&& done);
  // Writes one token's row(s) for `dest` on behalf of `source` (itself or, on a relay, a rank
  // of another host): idx/w/expert_slot are the token's K entries, slot its index among the
  // source's rows for dest, row_off/expert_off where the source's rows start at dest.
  template <typename Done>
  void place_row(int dest, int source, int32_t t, const char* row, const int32_t* idx,
                 const float* w, int K, int64_t slot, const int32_t* expert_slot, int64_t row_off,
                 const int64_t* expert_off, Done&& done);
  // Rows into a peer's dispatch output: non-temporal stores when the call moves more than
  // kStreamBytes (they skip the read-for-ownership of lines the writer never reads, like
  // DeepEP's no-allocate stores), plain stores for small calls whose rows the receiver reads
  // while they are still in cache.
  static constexpr double kStreamBytes = 4.0 * (1 << 20);
  bool stream_rows = false;  // decided per call in begin_dispatch
  void copy_row(char* dst, const char* src) const {
    if (stream_rows)
      kernels::copy_row_to_peer(dst, src, row_bytes());
    else
      std::memcpy(dst, src, row_bytes());
  }
  // Count records: write one (as `source`, for `dest`) in the buffer's sync mode; test arrival.
  void publish_count(int dest, int source, int32_t rows, int32_t topk, const int32_t* expert_rows);
  bool count_arrived(int dest, int source) const;
  // Waits for pred; on the caller's thread it keeps the cross-host relay going meanwhile.
  template <typename Pred, typename Describe>
  void wait_for(Pred&& pred, bool caller, Describe&& describe);
  bool multi_host() const { return relay != nullptr; }
  bool same_host(int r) const { return group.same_host(r, rank); }
  // Receiver: after every count record of this call is visible.
  void receive_counts();
  // Receiver: the tag of every expected row, in order; visit(tag, description-index).
  template <typename Visit>
  void for_each_expected_row(Visit&& visit) const;

  // Combine, expert side: visits member m's equal share of the received rows (index into the
  // dispatch output; in the latency layout only the recv_count[e] valid slots of each expert).
  template <typename Visit>
  void for_each_output_row(int m, int members, Visit&& visit) const;
  void row_owner(int64_t row, int* owner, int64_t* push_slot) const;
  // Owner side: reduce token t; locate(t, j) -> (row pointer) for the j-th contribution.
  template <typename Locate>
  void reduce_token(int64_t t, float* acc_row, Locate&& locate);

  // Multi-host helpers (relay.cpp): keep the relay going; a remote host's partial of token t,
  // waited for (nullptr if the token has no expert on that host).
  void relay_progress();
  const float* remote_partial(int h, int64_t t);

  DispatchResult result() const;
  TensorView combine_input_view() const;
  TensorView y_view() const;
  void check_combine(const CombineArgs& a) const;
  void set_combine_weights(const CombineArgs& a);  // after check_combine accepted them
};

template <typename Done>
void Buffer::Impl::place_row(int dest, int source, int32_t t, const char* row, const int32_t* idx,
                             const float* w, int K, int64_t slot, const int32_t* expert_slot,
                             int64_t row_off, const int64_t* expert_off, Done&& done) {
  if (layout == Layout::kThroughput) {
    const int64_t pos = row_off + slot;
    copy_row(at<char>(dest, win.tp_x) + static_cast<size_t>(pos) * row_bytes(), row);
    int64_t* src = at<int64_t>(dest, win.tp_src) + 2 * pos;
    src[0] = source;
    src[1] = t;
    int32_t* oidx = at<int32_t>(dest, win.tp_idx) + pos * K;
    float* ow = at<float>(dest, win.tp_w) + pos * K;
    for (int j = 0; j < K; ++j) {
      const int32_t e = idx[j];
      const bool here = e >= 0 && e / local_experts == dest;
      oidx[j] = here ? e % local_experts : -1;
      ow[j] = here ? w[j] : 0.0f;
    }
    done(at<ep::Tag>(dest, win.tp_tag) + pos);
  } else {
    for (int j = 0; j < K; ++j) {
      const int32_t e = idx[j];
      if (e < 0 || e / local_experts != dest) continue;
      const int le = e % local_experts;
      const int64_t pos = le * RT() + expert_off[le] + expert_slot[j];
      copy_row(at<char>(dest, win.lat_x) + static_cast<size_t>(pos) * row_bytes(), row);
      int64_t* src = at<int64_t>(dest, win.lat_src) + 2 * pos;
      src[0] = source;
      src[1] = t;
      at<int8_t>(dest, win.lat_k)[pos] = static_cast<int8_t>(j);
      done(at<ep::Tag>(dest, win.lat_tag) + pos);
    }
  }
}

template <typename Done>
void Buffer::Impl::send_rows(const DispatchArgs& a, int dest, int64_t i, Done&& done) {
  const int32_t t = routing.dest_token(dest, i);
  const size_t tK = static_cast<size_t>(t) * static_cast<size_t>(routing.topk);
  place_row(dest, rank, t,
            static_cast<const char*>(a.x.data) + static_cast<size_t>(t) * row_bytes(),
            &routing.topk_idx[tK], &routing.topk_weights[tK], routing.topk, i,
            &routing.expert_slot[tK], row_offset_at[static_cast<size_t>(dest)],
            &expert_offset_at[static_cast<size_t>(dest * local_experts)], std::forward<Done>(done));
}

template <typename Visit>
void Buffer::Impl::for_each_expected_row(Visit&& visit) const {
  if (layout == Layout::kThroughput) {
    ep::Tag* tags = at<ep::Tag>(rank, win.tp_tag);
    for (int64_t pos = 0; pos < num_recv_rows; ++pos) visit(tags + pos, pos);
  } else {
    ep::Tag* tags = at<ep::Tag>(rank, win.lat_tag);
    const auto* counts = recv_count.get<int64_t>();
    for (int e = 0; e < local_experts; ++e)
      for (int64_t p = 0; p < counts[e]; ++p) visit(tags + e * RT() + p, e * RT() + p);
  }
}

inline constexpr int kMaxFusedRows = 256;  // > max_topk (64); groups up to 256 ranks

template <typename Visit>
void Buffer::Impl::for_each_output_row(int m, int members, Visit&& visit) const {
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

template <typename Locate>
void Buffer::Impl::reduce_token(int64_t t, float* a, Locate&& locate) {
  const int64_t H = cfg.hidden;
  const int K = routing.topk;
  // This host's contributions, from 0, in ascending rank (throughput) or ascending k (latency).
  auto local_partial = [&](float* p) {
    std::fill(p, p + H, 0.0f);
    if (layout == Layout::kThroughput) {
      for (int r = 0; r < ranks; ++r)
        if (routing.sent(t, r) && same_host(r))
          kernels::accumulate_row(p, locate(t, r), cfg.dtype, H);
    } else {
      for (int j = 0; j < K; ++j) {
        const size_t tk = static_cast<size_t>(t * K + j);
        const int32_t e = routing.topk_idx[tk];
        if (e < 0 || !same_host(e / local_experts)) continue;
        kernels::accumulate_row_weighted(p, locate(t, j), cfg.dtype, H, routing.topk_weights[tk]);
      }
    }
  };
  if (!multi_host() && ranks <= kMaxFusedRows) {
    // One host: gather the rows (waiting for each), then one fused pass over them.
    const void* rows[kMaxFusedRows];
    float weights[kMaxFusedRows];
    int n = 0;
    if (layout == Layout::kThroughput) {
      for (int r = 0; r < ranks; ++r)
        if (routing.sent(t, r)) rows[n++] = locate(t, r);
    } else {
      for (int j = 0; j < K; ++j) {
        const size_t tk = static_cast<size_t>(t * K + j);
        if (routing.topk_idx[tk] < 0) continue;
        weights[n] = routing.topk_weights[tk];
        rows[n++] = locate(t, j);
      }
    }
    kernels::reduce_rows(y.get() + static_cast<size_t>(t) * row_bytes(), cfg.dtype, H, rows,
                         layout == Layout::kLatency ? weights : nullptr, n);
    return;
  }
  if (!multi_host()) {
    local_partial(a);
  } else {
    // Per-host partials added in ascending host order: the first one is taken as is.
    bool first = true;
    for (int h = 0; h < group.num_hosts(); ++h) {
      const float* p = nullptr;
      if (h == group.host_of(rank)) {
        bool any = false;
        for (int r = 0; r < ranks && !any; ++r) any = routing.sent(t, r) && same_host(r);
        if (!any) continue;
        local_partial(part.data());
        p = part.data();
      } else {
        p = remote_partial(h, t);
        if (!p) continue;
      }
      if (first)
        std::copy(p, p + H, a);
      else
        for (int64_t i = 0; i < H; ++i) a[i] += p[i];
      first = false;
    }
    if (first) std::fill(a, a + H, 0.0f);
  }
  kernels::store_row(y.get() + static_cast<size_t>(t) * row_bytes(), a, cfg.dtype, H);
}

template <typename Pred, typename Describe>
void Buffer::Impl::wait_for(Pred&& pred, bool caller, Describe&& describe) {
  if (caller && relay) {
    wait_until([&] { return pred() || (relay_progress(), pred()); }, wait, describe);
  } else {
    wait_until(pred, wait, describe);
  }
}

namespace ep {
void bsp_dispatch(Buffer::Impl& b, const DispatchArgs& a);
void bsp_combine(Buffer::Impl& b, const CombineArgs& a);
void ubep_dispatch_send(Buffer::Impl& b, const DispatchArgs& a);
void ubep_dispatch_recv(Buffer::Impl& b);
void ubep_combine_send(Buffer::Impl& b, const CombineArgs& a);
void ubep_combine_recv(Buffer::Impl& b);
}  // namespace ep

}  // namespace ubep
