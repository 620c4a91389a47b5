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

namespace ubep {

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

  // Sender side: where this rank's rows start in each destination's outputs (from the count
  // records of the lower-ranked sources). Kept for combine, which reads the rows back there.
  std::vector<int64_t> row_offset_at;     // [R] throughput
  std::vector<int64_t> expert_offset_at;  // [R, El] latency
  std::vector<std::atomic<uint64_t>> offsets_ready;  // [R] seq+1 once the offsets for a destination are known

  // Receiver side.
  LocalArray recv_count;  // [El] int64
  int64_t num_recv_rows = 0;
  std::atomic<int> topk_mismatch{-1};     // a source whose topk differs from ours

  LocalArray y;            // [T, row] combine output
  std::vector<float> acc;  // [members, hidden] fp32 accumulators
  CallStats stats;

  Impl(Group& g, const BufferConfig& c);

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
  ep::CountRecord fill_count(int dest);  // body only; the caller completes it
  // Reads the count records of sources below this rank at `dest` (they must be visible).
  void compute_offsets(int dest);
  // Writes the rows of token slot i for `dest` into dest's outputs; calls done(tag) per message.
  template <typename Done>
  void send_rows(const DispatchArgs& a, int dest, int64_t i, Done&& done);
  // Receiver: after every count record of this call is visible.
  void receive_counts();
  // Receiver: the tag of every expected row, in order; visit(tag, description-index).
  template <typename Visit>
  void for_each_expected_row(Visit&& visit) const;

  // Combine: expert side rows (row index into the dispatch output), and their owner/slot.
  int64_t output_rows() const { return layout == Layout::kThroughput ? num_recv_rows : win.lat_rows(); }
  bool row_valid(int64_t row) const;
  void row_owner(int64_t row, int* owner, int64_t* push_slot) const;
  // Owner side: reduce token t; locate(t, j) -> (row pointer) for the j-th contribution.
  template <typename Locate>
  void reduce_token(int64_t t, float* acc_row, Locate&& locate);

  DispatchResult result() const;
  TensorView combine_input_view() const;
  TensorView y_view() const;
  void check_combine(const CombineArgs& a) const;
};

template <typename Done>
void Buffer::Impl::send_rows(const DispatchArgs& a, int dest, int64_t i, Done&& done) {
  const int32_t t = routing.dest_token(dest, i);
  const char* row = static_cast<const char*>(a.x.data) + static_cast<size_t>(t) * row_bytes();
  const int K = routing.topk;
  const size_t tK = static_cast<size_t>(t) * static_cast<size_t>(K);
  if (layout == Layout::kThroughput) {
    const int64_t pos = row_offset_at[static_cast<size_t>(dest)] + i;
    std::memcpy(at<char>(dest, win.tp_x) + static_cast<size_t>(pos) * row_bytes(), row, row_bytes());
    int64_t* src = at<int64_t>(dest, win.tp_src) + 2 * pos;
    src[0] = rank;
    src[1] = t;
    int32_t* idx = at<int32_t>(dest, win.tp_idx) + pos * K;
    float* w = at<float>(dest, win.tp_w) + pos * K;
    for (int j = 0; j < K; ++j) {
      const int32_t e = routing.topk_idx[tK + static_cast<size_t>(j)];
      const bool here = e >= 0 && e / local_experts == dest;
      idx[j] = here ? e % local_experts : -1;
      w[j] = here ? routing.topk_weights[tK + static_cast<size_t>(j)] : 0.0f;
    }
    done(at<ep::Tag>(dest, win.tp_tag) + pos);
  } else {
    for (int j = 0; j < K; ++j) {
      const int32_t e = routing.topk_idx[tK + static_cast<size_t>(j)];
      if (e < 0 || e / local_experts != dest) continue;
      const int le = e % local_experts;
      const int64_t pos = le * RT() + expert_offset_at[static_cast<size_t>(dest * local_experts + le)] +
                          routing.expert_slot[tK + static_cast<size_t>(j)];
      std::memcpy(at<char>(dest, win.lat_x) + static_cast<size_t>(pos) * row_bytes(), row, row_bytes());
      int64_t* src = at<int64_t>(dest, win.lat_src) + 2 * pos;
      src[0] = rank;
      src[1] = t;
      at<int8_t>(dest, win.lat_k)[pos] = static_cast<int8_t>(j);
      done(at<ep::Tag>(dest, win.lat_tag) + pos);
    }
  }
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

template <typename Locate>
void Buffer::Impl::reduce_token(int64_t t, float* a, Locate&& locate) {
  const int64_t H = cfg.hidden;
  std::fill(a, a + H, 0.0f);
  if (layout == Layout::kThroughput) {
    // Sum over the ranks the token went to, in ascending rank order.
    for (int r = 0; r < ranks; ++r)
      if (routing.sent(t, r)) kernels::accumulate_row(a, locate(t, r), cfg.dtype, H);
  } else {
    // Weighted sum over the selected experts, in ascending k.
    const int K = routing.topk;
    for (int j = 0; j < K; ++j) {
      const size_t tk = static_cast<size_t>(t * K + j);
      if (routing.topk_idx[tk] < 0) continue;
      kernels::accumulate_row_weighted(a, locate(t, j), cfg.dtype, H, routing.topk_weights[tk]);
    }
  }
  kernels::store_row(y.get() + static_cast<size_t>(t) * row_bytes(), a, cfg.dtype, H);
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
