// State of one Buffer and the message-level steps both algorithms are built from. The
// algorithms (bsp.cpp, ubep.cpp) differ only in how they order and synchronise these steps.
#pragma once

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "core/bf16.hpp"
#include "core/local_array.hpp"
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
  ep::RecordFormat fmt;
  ep::StagingLayout staging;
  std::unique_ptr<SharedWindow> window;
  ep::Routing routing;
  WaitPolicy wait;
  std::unique_ptr<ep::WorkerTeam> team;

  // Sequence numbers: the next dispatch, and the dispatch in flight / last completed.
  uint64_t next_seq;
  uint64_t seq = 0;
  Layout layout = Layout::kThroughput;
  enum class Phase { kIdle, kDispatchSent, kCombineSent } phase = Phase::kIdle;
  bool have_dispatch = false;

  // Receive side of the last dispatch.
  std::vector<int32_t> src_rows;         // [R]
  std::vector<int64_t> src_offset;       // [R] first output row of each source (throughput)
  std::vector<int32_t> src_expert_rows;  // [R, E_local]
  std::vector<int64_t> expert_offset;    // [E_local, R] first row of each source per expert (latency)
  int64_t num_recv_rows = 0;
  std::atomic<int> topk_mismatch{-1};
  std::atomic<uint64_t> prefix_ready{0};  // seq+1 once prefix_sum() is done (ubep's p2p signal)
  std::vector<int64_t> cursors;            // [members, R] ubep reorder progress  // a source whose topk differs from ours (detected, reported after the call)

  // Outputs (local memory, sized once).
  LocalArray recv_x, recv_topk_idx, recv_topk_weights, recv_src, recv_count;
  LocalArray lat_x, lat_src, lat_k;
  LocalArray y;
  std::vector<float> acc;  // [workers+1, hidden] fp32 accumulators for combine

  CallStats stats;

  Impl(Group& g, const BufferConfig& c);

  int half() const { return ep::half_of(seq); }
  uint32_t tag() const { return ep::tag_of(seq); }
  size_t row_bytes() const { return fmt.row_bytes; }
  int64_t lat_rows() const { return static_cast<int64_t>(ranks) * T; }  // slots per expert
  void* peer(int r) const { return window->base(r); }
  void* local() const { return window->local(); }

  // --- steps shared by the algorithms ---
  // Sender: fill the count record for `dest` (no tag) / one token record (no tag).
  ep::CountRecord fill_count(int dest);
  ep::TokenRecord fill_token(const DispatchArgs& a, int dest, int64_t i);
  // Receiver: after every count record of this call is visible.
  void prefix_sum();
  // Receiver: move one token record from `src` (slot i) into the outputs.
  void consume_token(int src, int64_t i);
  // Combine sender: the rows this rank sends back, and where each goes.
  int64_t combine_row_count() const;
  void combine_target(int64_t row, int* owner, int64_t* slot, const char** data,
                      const CombineArgs& a) const;
  // Combine receiver: reduce token t from arrived records, waiting on each with `ready`.
  template <typename Ready>
  void reduce_token(int64_t t, float* acc_row, Ready&& ready);

  DispatchResult result() const;
  TensorView y_view() const;
  void begin_dispatch(const DispatchArgs& a);
  void check_combine(const CombineArgs& a) const;
};

void write_row(char* dst, const float* acc, DType t, int64_t hidden);

template <typename Ready>
void Buffer::Impl::reduce_token(int64_t t, float* a, Ready&& ready) {
  const int64_t H = cfg.hidden;
  std::fill(a, a + H, 0.0f);
  // The weight is copied into a local so the compiler knows it cannot alias the accumulator
  // (and vectorises the loop).
  auto add = [&](const char* row, const float* wp) {
    const bool weighted = wp != nullptr;
    const float w = weighted ? *wp : 1.0f;
    if (cfg.dtype == DType::kBF16) {
      const auto* v = reinterpret_cast<const uint16_t*>(row);
      if (weighted) {
        for (int64_t h = 0; h < H; ++h) a[h] += w * bf16_to_float(v[h]);
      } else {
        for (int64_t h = 0; h < H; ++h) a[h] += bf16_to_float(v[h]);
      }
    } else {
      const auto* v = reinterpret_cast<const float*>(row);
      if (weighted) {
        for (int64_t h = 0; h < H; ++h) a[h] += w * v[h];
      } else {
        for (int64_t h = 0; h < H; ++h) a[h] += v[h];
      }
    }
  };
  if (layout == Layout::kThroughput) {
    // Sum over the ranks the token went to, in ascending rank order.
    for (int r = 0; r < ranks; ++r) {
      if (!routing.sent(t, r)) continue;
      const int64_t slot = static_cast<int64_t>(r) * T + t;
      ready(slot, r);
      add(staging.combine(local(), half(), slot).row(), nullptr);
    }
  } else {
    // Weighted sum over the selected experts, in ascending k.
    const int K = routing.topk;
    for (int j = 0; j < K; ++j) {
      const size_t tk = static_cast<size_t>(t * K + j);
      const int32_t e = routing.topk_idx[tk];
      if (e < 0) continue;
      const int64_t slot = t * routing.max_topk + j;
      ready(slot, e / local_experts);
      add(staging.combine(local(), half(), slot).row(), &routing.topk_weights[tk]);
    }
  }
  write_row(y.get() + static_cast<size_t>(t) * row_bytes(), a, cfg.dtype, H);
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
