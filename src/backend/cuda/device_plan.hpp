// The CUDA backend's per-rank state and the placement arithmetic its kernels use, as plain
// UBEP_HD code: compiled into the kernels and into the CPU-side tests (tests/cuda), which check
// it against the CPU backend's DispatchCall and the independent reference.
//
// Per rank, besides its window (protocol::WindowLayout, shared with peers), the backend keeps a
// private scratch area in device memory: the routing of the last dispatch (what the CPU keeps in
// ep::Routing / DispatchCall) and the rank-local signals between its blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "protocol/protocol.hpp"

namespace ubep::cuda_hd {

inline constexpr int kMaxVirtualRanks = 16;  // ranks driven by one launch (kernel parameters)
inline constexpr int kMaxBlocksPerRank = 64;
inline constexpr int kMaxContributions = 64;  // max(ranks, max_topk) a combine warp gathers

// Offsets of one rank's scratch arrays (bytes from the scratch base).
struct ScratchLayout {
  int ranks = 0, local_experts = 0, max_topk = 0;
  int64_t max_tokens = 0;
  size_t idx = 0, w = 0, expert_slot = 0, dest_slot = 0, dest_tokens = 0, dest_rows = 0;
  size_t dest_expert_rows = 0, row_offset_at = 0, expert_offset_at = 0, recv_count = 0;
  size_t recv_range = 0, info = 0, routing_done = 0, offsets_ready = 0, total = 0;

  ScratchLayout() = default;
  ScratchLayout(int r, int el, int k, int64_t t)
      : ranks(r), local_experts(el), max_topk(k), max_tokens(t) {
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t at = off;
      off = protocol::round_up(off + bytes, 128);
      return at;
    };
    const auto T = static_cast<size_t>(t), R = static_cast<size_t>(r), K = static_cast<size_t>(k),
               El = static_cast<size_t>(el);
    idx = take(T * K * 4);                // int32 global expert ids (-1: none)
    w = take(T * K * 4);                  // fp32 weights
    expert_slot = take(T * K * 4);        // int32 slot among this rank's rows for that expert
    dest_slot = take(T * R * 4);          // int32 slot among this rank's rows for that rank
    dest_tokens = take(R * T * 4);        // int32 token of each (rank, slot)
    dest_rows = take(R * 4);              // int32
    dest_expert_rows = take(R * El * 4);  // int32
    row_offset_at = take(R * 8);          // int64: where this rank's rows start at rank d
    expert_offset_at = take(R * El * 8);  // int64
    recv_count = take(El * 8);            // int64: rows received per local expert
    recv_range = take(range_entries(r, el) * 16);  // int64 (begin, count) per (expert, source)
    info = take(4 * 8);                            // int64: num_tokens, topk, num_recv_rows, spare
    routing_done = take(kMaxBlocksPerRank * 4);    // uint32 generation per block
    offsets_ready = take(R * 4);                   // uint32 generation per destination
    total = off;
  }
  template <typename T>
  UBEP_HD T* at(void* base, size_t region) const {
    return reinterpret_cast<T*>(static_cast<char*>(base) + region);
  }
  // Entries of recv_range: [El, R] for the latency layout, [R] for the throughput layout (the
  // region holds the larger).
  UBEP_HD static size_t range_entries(int r, int el) {
    return static_cast<size_t>(r) * static_cast<size_t>(el > 1 ? el : 1);
  }
};

// ---- Placement (docs/SEMANTICS.md "Placement"; the CPU's ep::DispatchCall) ----------------------
// Where source `source`'s rows start at a destination, per local expert (latency) or overall
// (throughput). Per-source placement: its fixed region of max_tokens rows, known from its own
// rank alone -- the sender never waits for a peer. Compact: after the rows every lower-ranked
// source sent there (`lower_rows`, the sum of their count records), which the sender must read.
UBEP_HD inline int64_t source_offset(bool per_source, int source, int64_t max_tokens,
                                     int64_t lower_rows) {
  return per_source ? static_cast<int64_t>(source) * max_tokens : lower_rows;
}
// The count record's call-shape word (protocol::call_shape with the values of ubep::Layout and
// ubep::Placement; host_logic.cpp asserts they match): receivers refuse a source that made a
// different call instead of reading its rows at the wrong place.
UBEP_HD inline int32_t call_shape_of(bool latency, bool per_source) {
  return protocol::call_shape(latency ? 1 : 0, per_source ? 2 : 1);
}
// Index of (local expert le, source s) in recv_range (throughput: le is ignored).
UBEP_HD inline int64_t range_index(bool latency, int ranks, int le, int s) {
  return latency ? static_cast<int64_t>(le) * ranks + s : s;
}

// Where row `slot` of `source` lands at its destination in the throughput layout, and where
// the copy for local expert `le` lands in the latency layout (DispatchCall::place_row).
UBEP_HD inline int64_t tp_position(int64_t row_offset, int64_t slot) { return row_offset + slot; }
UBEP_HD inline int64_t lat_position(int64_t rt_rows, int le, int64_t expert_offset,
                                    int64_t expert_slot) {
  return static_cast<int64_t>(le) * rt_rows + expert_offset + expert_slot;
}

// Global expert id as the kernels use it: ids outside [-1, experts) are reported as invalid and
// routed nowhere, so a bad id can never make a kernel write out of bounds.
UBEP_HD inline int32_t sanitize_expert(int64_t e, int experts) {
  return (e >= 0 && e < experts) ? static_cast<int32_t>(e) : -1;
}
// Expert k of token t as the kernels route it: sanitized, and -1 where the same id already
// appeared at a lower k of the token (the CPU rejects repeats; the device cannot throw before
// sending, so it routes a repeat nowhere and reports it). Every role uses this one function, so
// the count records, the rows and the combine agree on what was sent.
UBEP_HD inline int32_t expert_at(const int64_t* idx, int64_t t, int j, int K, int experts) {
  const int64_t e = idx[t * K + j];
  if (e < 0 || e >= experts) return -1;
  for (int j2 = 0; j2 < j; ++j2)
    if (idx[t * K + j2] == e) return -1;
  return static_cast<int32_t>(e);
}

// The error word a bounded spin (or an input check) writes to host-mapped memory. The first
// writer wins (atomic CAS on `code`); the host turns it into ubep::TimeoutError or
// ubep::InvalidArgument naming the waiter, the peer and the message.
enum ErrorCode : uint32_t {
  kOk = 0,
  kTimeout = 1,
  kBadExpert = 2,
  kTopkMismatch = 3,
  kShapeMismatch = 4,   // a source's count record names another layout or placement
  kCompactedShort = 5,  // compacted combine input has fewer rows than were received
  kPeerFailed = 6,      // a peer's failure word ends this call (it rejected it, or broke)
};
enum WaitWhat : int32_t {
  kWaitCount = 1,        // a count record of `peer` at `rank` (index: destination)
  kWaitDispatchRow = 2,  // a dispatch row at `rank` (index: row position)
  kWaitCombineRow = 3,   // a combine row at `peer` for token `index` of `rank`
  kWaitBarrier = 4,      // bsp's group barrier, flag of `peer`
  kWaitLocal = 5,        // a rank-local signal between blocks (routing, offsets)
};
struct ErrorInfo {
  uint32_t code;
  int32_t rank, peer, what;
  int64_t index;
  uint32_t tag, pad;
};

// Where kernels report: the first reporter claims `claim` (device memory: atomics there are
// reliable on every platform, unlike atomics on host-mapped memory over PCIe), then writes `info`
// (host-mapped) with plain stores and a system fence. Everyone else polls `claim` to give up.
struct ErrorSink {
  ErrorInfo* info = nullptr;  // host-mapped
  uint32_t* claim = nullptr;  // device memory: 0, or the code of the first report
  // Failure words (protocol.hpp) in this rank's window, [ranks], written by peers that rejected
  // or broke a call; a wait on peer s also polls word s, so a peer's failure ends the wait at
  // once instead of at the timeout. nullptr: not polled (virtual ranks in one launch).
  const uint32_t* fail_words = nullptr;
  uint64_t call = 0;  // the Buffer call the launch belongs to
};

// What one launch does (bitmask): the dispatch phases and the combine phases.
enum Phase : uint32_t {
  kSend = 1,      // dispatch: routing, count records, offsets, rows
  kRecv = 2,      // dispatch: counts, prefix sum, wait for every row
  kCombSend = 4,  // combine: rows into the combine window, tags
  kCombRecv = 8,  // combine: owners pull and reduce
  kCompact = 16,  // dispatch kernel, alone: copy the valid received rows densely (compact())
};

// Inputs and outputs of one rank in one call.
struct RankIO {
  const void* x = nullptr;  // dispatch: [tokens, hidden]
  const int64_t* topk_idx = nullptr;
  const float* topk_w = nullptr;
  int64_t tokens = 0;
  int topk = 0;
  const void* comb_in = nullptr;  // combine input (nullptr or == comb window: zero-copy)
  void* y = nullptr;              // combine output [tokens, hidden]
  // combine_in holds the rows in compact() order, with room for comb_in_rows of them.
  bool comb_in_compacted = false;
  int64_t comb_in_rows = 0;
  void* compact_out = nullptr;  // compact(): [valid rows, hidden], capacity of the window
  char* scratch = nullptr;      // this rank's scratch (ScratchLayout)
  uint32_t start_delay_ns = 0;  // test hook: the rank starts this late (random skew)
};

// Kernel parameters of one launch (passed by value: no host staging, so back-to-back calls
// never wait for the host).
struct LaunchParams {
  protocol::WindowLayout map;
  ScratchLayout scratch;
  char* const* bases = nullptr;  // [ranks] every rank's window, in this process's address space
  int ranks = 0, first_rank = 0, local_ranks = 0, experts = 0, local_experts = 0;
  int blocks_per_rank = 0;
  int64_t hidden = 0;
  int elem_bytes = 0;  // 2: bf16, 4: fp32
  uint32_t phases = 0;
  uint32_t tag = 0;          // tag_of(seq)
  int half = 0;              // half_of(seq)
  uint32_t gen = 0;          // rank-local signal generation (one per dispatch launch, never 0)
  uint32_t barrier_seq = 0;  // bsp across processes: value of the first group barrier
  uint64_t call = 0;         // the Buffer's call number (failure words name calls)
  bool latency = false;
  bool per_source = false;  // placement of this dispatch (resolved: never auto)
  bool stop_and_wait = false;
  bool bsp = false;
  long long timeout_cycles = 0;
  ErrorSink error;
  int64_t* host_recv_rows = nullptr;  // host-mapped [local_ranks]: num_recv_rows
  RankIO io[kMaxVirtualRanks];
};

}  // namespace ubep::cuda_hd
