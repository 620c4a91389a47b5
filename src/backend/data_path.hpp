// The data path a host-driven algorithm runs on: the one seam between the algorithms (bsp,
// ubep, the relay; src/ep) and the memory they move data through. Contract: docs/BACKENDS.md.
//
// Algorithms address peers' windows (SharedWindow::base), compute every offset from the
// protocol (src/protocol/protocol.hpp), and ask the data path to do every access that crosses to
// peer memory or needs ordering: put a row, publish a tag, test a tag, fence, reduce rows in
// the fixed order, and run the role groups concurrently. They never memcpy into, or use atomics
// on, peer memory themselves.
//
// This per-row interface is for backends whose roles are host threads (docs/BACKENDS.md). The
// CUDA backend's roles are warps inside its kernels, so it has no DataPath: it implements
// backend::Engine itself (cuda_host::KernelEngine, src/backend/cuda/kernel_engine.hpp), running
// the same algorithms over the same protocol (src/protocol) and the same CallMachine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "protocol/protocol.hpp"
#include "ubep/types.hpp"

namespace ubep::backend {

// A dispatch row to one destination, the senders' unit of work: its payload, its scales (fp8;
// scale_bytes 0: none) and up to kMaxPieces small pieces of metadata (the row's source, expert
// ids, weights...). A prefill sends thousands of rows a call, and a call per part cost each row
// several indirect calls (DataPath::put_message).
struct RowMessage {
  static constexpr int kMaxPieces = 3;
  struct Piece {
    void* dst;
    const void* src;  // read during put_message only (it may point at the caller's stack)
    size_t bytes;
  };
  char* payload_dst = nullptr;
  const void* payload = nullptr;
  size_t payload_bytes = 0;
  char* scale_dst = nullptr;
  const void* scales = nullptr;
  size_t scale_bytes = 0;
  bool stream = false;  // as put_row's: the call is large, skip caching the destination
  int num_pieces = 0;
  Piece pieces[kMaxPieces];
  void add(void* dst, const void* src, size_t bytes) { pieces[num_pieces++] = {dst, src, bytes}; }
  // Lines this thread writes soon (a later row's metadata): a hint with no effect on results. A
  // backend may start fetching them for writing, so that those stores do not wait for them.
  static constexpr int kMaxSoon = 4;
  int num_soon = 0;
  const void* soon[kMaxSoon];
  void writes_soon(const void* p) { soon[num_soon++] = p; }
};

class DataPath {
 public:
  virtual ~DataPath() = default;

  // --- where role work runs ---
  // Members of the role team; member 0 is the calling thread.
  virtual int members() const = 0;
  // Runs fn(m) for every member m concurrently and returns when all are done; the writes of
  // every member happen-before the return. Rethrows the first member's exception.
  template <typename Fn>
  void run_roles(Fn&& fn) {
    run_erased(static_cast<void*>(&fn),
               [](void* obj, int m) { (*static_cast<std::remove_reference_t<Fn>*>(obj))(m); });
  }

  // --- moving bytes ---
  // A token row into a peer's window. `stream`: the call is large, skip caching the
  // destination (non-temporal stores). The row is ordered before any later publish() of this
  // thread (which fences first if needed: one fence can cover a batch of rows).
  virtual void put_row(void* dst, const void* src, size_t bytes, bool stream) const = 0;
  // Small metadata (or a local staging copy) with ordinary stores.
  virtual void put(void* dst, const void* src, size_t bytes) const = 0;
  // A dispatch row: the payload and scales as put_row's rows (streamed or not by m.stream), the
  // pieces as put's metadata, all ordered before any later publish() of this thread. One call a
  // row; this default composes it from the calls above.
  virtual void put_message(const RowMessage& m) const {
    put_row(m.payload_dst, m.payload, m.payload_bytes, m.stream);
    if (m.scale_bytes) put_row(m.scale_dst, m.scales, m.scale_bytes, m.stream);
    for (int i = 0; i < m.num_pieces; ++i) put(m.pieces[i].dst, m.pieces[i].src, m.pieces[i].bytes);
  }

  // --- completion (data-as-flag) ---
  // Release store of an epoch tag: every put before it, by this thread, is visible to a reader
  // whose arrived() returns true. stop_and_wait: a full fence first (the sync ablation).
  // Inside run_roles, after streamed rows, the store may be held back to share one fence with
  // the next tags; every held tag is stored before this thread's next arrived(), load(),
  // fence(), stop-and-wait publish, or the end of its role function (docs/BACKENDS.md).
  virtual void publish(protocol::Tag* tag, uint32_t value, bool stop_and_wait = false) const = 0;
  // Acquire load: true once `value` is there; the message's data is then visible.
  virtual bool arrived(const protocol::Tag* tag, uint32_t value) const = 0;
  // Acquire load of a tag word (for words with more than one meaningful value).
  virtual uint32_t load(const protocol::Tag* tag) const = 0;
  // Full fence: every earlier store of this thread is visible before every later one.
  virtual void fence() const = 0;

  // --- the fixed-order reduction (bit-identical across algorithms and backends) ---
  // out = round(((0 + w0*r0) + w1*r1) + ...) in fp32; weights == nullptr: unweighted; n >= 0.
  // stream: the output is large, skip caching it; it is visible to other threads once the
  // role function returns (inside run_roles) or when reduce_rows returns (outside).
  // next_rows[0..next_n): the rows this thread reduces next, a hint with no effect on results
  // (nullptr, 0: none); a backend may start fetching them as this reduction ends. sequential:
  // each row continues in memory where the same place's row of this thread's previous reduction
  // ended (the throughput layout), so the hardware's own prefetchers already follow them.
  virtual void reduce_rows(void* out, DType dtype, int64_t hidden, const void* const* rows,
                           const float* weights, int n, bool stream, const void* const* next_rows,
                           int next_n, bool sequential) const = 0;
  virtual void accumulate_row(float* acc, const void* row, DType dtype, int64_t hidden,
                              const float* weight) const = 0;
  virtual void store_row(void* dst, const float* acc, DType dtype, int64_t hidden) const = 0;

 protected:
  virtual void run_erased(void* obj, void (*fn)(void*, int)) = 0;
};

}  // namespace ubep::backend
