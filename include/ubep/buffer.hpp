// Buffer: the communication memory of one rank, and the dispatch/combine calls on it.
//
// Semantics (docs/SEMANTICS.md): rank r owns experts [r*E/R, (r+1)*E/R). dispatch sends each token
// to the ranks of its selected experts (topk_idx, -1 = not selected); combine brings expert
// outputs back to the owner and reduces them in a fixed order, accumulating in fp32, so results
// are bit-identical across algorithms, runs and arrival orders.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ubep/group.hpp"
#include "ubep/research.hpp"
#include "ubep/stats.hpp"
#include "ubep/types.hpp"

namespace ubep {

enum class Algorithm : uint8_t {
  kBsp,   // staged, barrier-separated pipeline (the CANN EP / DeepEP-normal baseline)
  kUbep,  // decomposed, barrier-free, epoch-tagged data-as-flag messages
};
const char* algorithm_name(Algorithm a);
Algorithm parse_algorithm(const std::string& name);  // "bsp" | "ubep"

enum class Layout : uint8_t {
  kThroughput,  // DeepEP "normal": one row per (token, destination rank)
  kLatency,     // DeepEP "low latency": recv_x[local_expert, slot, hidden]
};
const char* layout_name(Layout l);
Layout parse_layout(const std::string& name);  // "throughput" | "latency"

// Where a destination puts the rows it receives (docs/SEMANTICS.md, "Placement").
enum class Placement : uint8_t {
  kAuto,       // the measured default for the call's layout (placement_for)
  kCompact,    // rows packed by source rank: a sender's offset at a destination is a prefix sum
               // of the lower ranks' counts there, so it waits for their count records
  kPerSource,  // a fixed region of max_tokens_per_rank rows per source: a sender computes every
               // offset from its own routing and never waits for a peer before writing
};
const char* placement_name(Placement p);
Placement parse_placement(const std::string& name);  // "auto" | "compact" | "per-source"
// The placement kAuto resolves to for a layout.
Placement placement_for(Layout layout);

struct BufferConfig {
  int64_t max_tokens_per_rank = 128;
  int64_t hidden = 7168;
  // The dispatch dtype: bf16, fp32 or fp8 (e4m3 codes plus per-128-channel fp32 scales,
  // ubep/fp8.hpp and docs/SEMANTICS.md "fp8 dispatch"). Combine runs in combine_dtype(): the
  // same dtype, except that an fp8 buffer combines in bf16.
  DType dtype = DType::kBF16;
  // fp8 buffers, when ubep casts bf16/fp32 inputs on send: round every scale up to a power of
  // two (ue8m0-style, like DeepEP's round_scale), so dequantizing is an exponent add.
  bool fp8_pow2_scales = false;
  int num_experts = 256;
  int max_topk = 8;
  Algorithm algorithm = Algorithm::kUbep;
  // Worker threads per rank for the ubep roles, besides the caller. -1: sized for the machine
  // (cores / ranks on this host, minus the caller).
  int num_workers = -1;
  // Allocate the combine staging for the latency layout (max_tokens * max_topk rows). Needs
  // max_tokens_per_rank < 2^24 (a latency row's record holds its token in 24 bits).
  bool enable_latency_layout = true;
  // Where received rows go; every rank must use the same (checked at construction).
  Placement placement = Placement::kAuto;
  // Where the tensors passed to this buffer live (every TensorView is checked against it).
  Device device;
  // First epoch number (tests start near the 32-bit wrap-around).
  uint64_t initial_epoch = 0;
  // The ablation knobs of the papers' techniques (ubep/research.hpp), apart from the basic
  // config: the defaults are what a user wants.
  ResearchOptions research;
  // Elastic EP (docs/ELASTIC.md): when the process of a rank on this host dies, mask it at the
  // next dispatch without waiting for Buffer::mask (the call in flight still fails).
  bool mask_dead_ranks = false;
};

// The dtype of combine's input and output for a buffer: its dtype, or bf16 for fp8 buffers.
DType combine_dtype(const BufferConfig& config);

// Inputs of one dispatch, per rank.
struct DispatchArgs {
  // [num_tokens, hidden] in the buffer's dtype. fp8 buffers take either fp8 codes with their
  // x_scales, or bf16/fp32 values (x_scales empty) that ubep casts to fp8 on send.
  TensorView x;
  TensorView topk_idx;      // [num_tokens, k] int64, global expert id or -1, no id twice per token
  TensorView topk_weights;  // [num_tokens, k] fp32
  Layout layout = Layout::kThroughput;
  // fp8 x only: [num_tokens, ceil(hidden/128)] fp32 scales (ubep/fp8.hpp). Last, so aggregate
  // initializers written before fp8 keep their meaning.
  TensorView x_scales = {};
};

// Outputs of one dispatch. Views into memory owned by the Buffer (shared memory, written in
// place by the senders): valid until the next dispatch on the same Buffer, and read-only
// (recv_count and recv_range are updated in place from one call to the next: a view written
// by the caller may show the write again in a later call).
struct DispatchResult {
  Layout layout = Layout::kThroughput;
  int64_t num_recv_rows = 0;  // throughput: rows of recv_x
  // Throughput layout: recv_x [rows, hidden], recv_topk_idx [rows, k] int32 local expert id or
  // -1, recv_topk_weights [rows, k] fp32 (0 where not local), recv_src [rows, 2] int64
  // (source rank, source token). Rows grouped by source rank, in source token order.
  // Latency layout: recv_x [local_experts, max_tokens*ranks, hidden], recv_src
  // [local_experts, max_tokens*ranks, 2]; per expert, rows by source rank then token.
  TensorView recv_x;
  // fp8 buffers: the scales of recv_x, one row per row of recv_x (same leading dimensions,
  // last dimension ceil(hidden/128), fp32); rows outside the valid ranges are not valid.
  // Empty (ndim 0) for bf16/fp32 buffers.
  TensorView recv_x_scales;
  TensorView recv_topk_idx;
  TensorView recv_topk_weights;
  TensorView recv_src;
  TensorView recv_count;  // [local_experts] int64: rows received per local expert
  // Where each source's rows are (DeepEP's packed_recv_layout_range): int64 (begin, count),
  // latency [local_experts, ranks, 2] (row index within recv_x[e]), throughput [ranks, 2]
  // (row of recv_x). Compact placement: ranges are contiguous, in rank order. Per-source:
  // begin = source * max_tokens_per_rank, and rows outside the ranges are not valid; in the
  // throughput layout recv_x then has max_tokens_per_rank * ranks rows.
  TensorView recv_range;
  Placement placement = Placement::kCompact;
  uint64_t handle = 0;  // identifies this dispatch for combine
};

// Inputs of one combine: one row per received row (throughput layout, already weighted and
// reduced over the rank's local experts) or per (local expert, slot) (latency layout; combine
// applies the weights). Same shape as the dispatch's recv_x, in combine_dtype(config) (bf16 for
// fp8 buffers).
struct CombineArgs {
  TensorView x;
  uint64_t handle = 0;
  // x holds the rows in the order Buffer::compact() produced them ([valid rows, hidden]),
  // not in the dispatch's placement.
  bool compacted = false;
  // Latency layout, optional: the weights combine applies, [num_tokens, k] fp32, replacing the
  // ones given to dispatch (DeepEP's low_latency_combine takes its weights here). Only used on
  // the token's owner, so only on one host (across hosts the relay has them from dispatch).
  TensorView topk_weights = {};
  // Optional: where y goes, [num_tokens, hidden] in combine_dtype(config), instead of Buffer
  // memory (combine then returns a view of it), so a caller that wants y in its own tensor
  // skips a copy. The cpu device only.
  TensorView out = {};
};

class Buffer {
 public:
  // Collective over the group: every rank passes the same config.
  Buffer(Group& group, BufferConfig config);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  DispatchResult dispatch(const DispatchArgs& args);
  // y [num_tokens, hidden] in combine_dtype(), for the tokens of the matching dispatch.
  // A view into Buffer memory (or args.out), valid until the next combine. The last dispatch
  // may be combined again until the next dispatch (cpu device, one host): each combine gives
  // the same bits for the same inputs. Write into combine_buffer() only before a dispatch's
  // first combine: afterwards peers may still be reading it until the next combine starts.
  TensorView combine(const CombineArgs& args);

  // Split-phase form (ubep algorithm): *_send starts the call and returns as soon as this
  // rank's messages are written; *_recv completes it. The caller may compute in between.
  // One call may be outstanding per Buffer.
  void dispatch_send(const DispatchArgs& args);
  DispatchResult dispatch_recv();
  void combine_send(const CombineArgs& args);
  TensorView combine_recv();

  // The valid rows of the last dispatch's recv_x, copied contiguously into Buffer memory (for
  // an expert GEMM that needs dense rows): [valid rows, hidden], ordered by local expert
  // (latency; expert e's rows start at recv_count[0] + ... + recv_count[e-1]) or overall
  // (throughput), then by source rank and source token. Valid until the next dispatch. Combine
  // takes outputs in this order with CombineArgs::compacted.
  TensorView compact();
  // fp8 buffers: the scales of the rows compact() copied, [valid rows, ceil(hidden/128)] fp32,
  // in the same order (compact() copies them too). Valid until the next dispatch.
  TensorView compact_scales() const;
  // While a split-phase call is outstanding: the views its *_recv will return, so they can be
  // handed out before the data arrives (DeepEP's return_recv_hook); their contents are valid
  // once *_recv has returned. pending_dispatch: after a latency-layout dispatch_send (recv_x,
  // recv_src, recv_count; throughput row counts are unknown until the data is there).
  // pending_combine: after combine_send, y.
  DispatchResult pending_dispatch() const;
  // The receive hook per piece, after dispatch_send: waits (bounded by the group's timeout)
  // until the rows `source` sends to local expert `local_expert` (latency layout; throughput:
  // local_expert 0, all of the source's rows) have arrived, and returns their (begin, count) --
  // recv_range[local_expert][source] of the coming result: rows [begin, begin + count) of
  // pending_dispatch().recv_x[local_expert] (throughput: of recv_x) are then valid. With
  // per-source placement it waits for nothing from any other rank, so an expert can start on
  // the sources that are there while a late rank is away; with compact placement the range
  // also needs the count records of the lower ranks. dispatch_recv still completes the call.
  std::array<int64_t, 2> wait_recv_range(int source, int local_expert = 0);
  TensorView pending_combine() const;

  // Zero-copy combine input for the last dispatch, shaped like its recv_x, in shared memory.
  // Experts that write their output here save combine a copy (the owners read it in place).
  // Valid until the next dispatch.
  TensorView combine_buffer() const;

  const BufferConfig& config() const;
  Group& group();
  int num_local_experts() const;
  int num_workers() const;  // worker threads per rank used by the ubep roles
  // Elastic EP (docs/ELASTIC.md; CPU buffers on one host). mask(rank): from the next dispatch
  // on, `rank` is neither sent to nor waited for; the topk entries naming its experts are
  // dropped (no rows go there, their weights contribute nothing to combine) and recv_count /
  // recv_range show nothing from it. Call it on every surviving rank, like DeepEP's
  // low_latency_update_mask_buffer; a rank that has not yet is told at its next call (a
  // PeerFailedError, then its next dispatch agrees). The survivors agree on the dispatch from
  // which the mask holds through their windows, without the masked rank and without MPI.
  void mask(int rank);
  // The ranks masked in the view agreed at the last dispatch, ascending.
  std::vector<int> masked_ranks() const;
  // A rank whose own view masks it (it was masked while alive) or a replacement process comes
  // back: its next dispatch is agreed with every live peer, which unmask it from that dispatch on.
  void rejoin();

  void set_algorithm(Algorithm a);
  void set_sync_mode(SyncMode m);
  const CallStats& last_stats() const;
  size_t shared_bytes() const;  // shared memory this rank contributes

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ubep
