// Multi-rank drivers of the CUDA backend's kernels (docs/CUDA.md), for the kernels' own tests and
// bench. Users run ubep::Buffer with BufferConfig::device = {DeviceType::kCuda, N}: the same
// kernels behind the one Buffer API. Here: Dispatch and combine with TensorViews on device
// memory (TensorView::device = {DeviceType::kCuda, index}, matching BufferConfig::device) on a
// CUDA stream. Every call only enqueues work: *_send returns at once, *_recv enqueues the wait,
// and nothing synchronises with the host unless asked (num_recv_rows, synchronize).
//
// Errors inside kernels (a peer that never arrives, a bad expert id, ranks disagreeing on topk)
// are written to host-mapped memory by the first thread that meets them; the next call or
// synchronize() throws ubep::TimeoutError / ubep::InvalidArgument naming the rank, the peer and
// the message.
//
// Built when UBEP_WITH_CUDA is ON (link ubep::cuda). Requires a GPU of compute capability 8.0+.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ubep/bootstrap.hpp"
#include "ubep/buffer.hpp"

struct CUstream_st;

namespace ubep::cuda {

using Stream = CUstream_st*;  // cudaStream_t

// True when a CUDA device is usable; otherwise false and *why says why (driver, no device).
bool device_available(std::string* why = nullptr);

struct Options {
  int blocks_per_rank = 0;      // 0: as many as fit co-resident (cooperative launch), max 64
  int threads_per_block = 512;  // multiple of 32, at most 512
  double timeout_s = 20.0;      // bounded spins inside kernels
};

class Engine;  // shared implementation (src/backend/cuda/engine.hpp)

// R ranks in one process on one GPU ("virtual ranks"): every rank's blocks run in one
// cooperative launch, peers are plain device pointers. For testing and benchmarking the
// algorithms on one GPU; each call takes one argument per rank.
class VirtualBuffer {
 public:
  VirtualBuffer(int ranks, BufferConfig config, Options options = {});
  ~VirtualBuffer();
  VirtualBuffer(const VirtualBuffer&) = delete;
  VirtualBuffer& operator=(const VirtualBuffer&) = delete;

  int ranks() const;
  const BufferConfig& config() const;
  void set_algorithm(Algorithm a);
  void set_sync_mode(SyncMode m);

  // Split phase (ubep): send enqueues routing, count records and rows; recv enqueues the wait.
  void dispatch_send(std::span<const DispatchArgs> per_rank, Stream stream);
  // Views into the windows, valid until the next dispatch. recv_count and recv_range are device
  // memory. Rows go where BufferConfig::placement says (docs/SEMANTICS.md "Placement"; auto:
  // per-source for the latency layout, compact for throughput), and recv_range gives each
  // source's (begin, count). The throughput layout's recv_x is shaped by capacity
  // [ranks*max_tokens, hidden] in both placements: compact rows are the first recv_count-sum
  // (on the device, or num_recv_rows() on the host, synchronising).
  std::vector<DispatchResult> dispatch_recv(Stream stream);
  std::vector<DispatchResult> dispatch(std::span<const DispatchArgs> per_rank, Stream stream);
  void combine_send(std::span<const CombineArgs> per_rank, Stream stream);
  std::vector<TensorView> combine_recv(Stream stream);  // y per rank, device memory
  std::vector<TensorView> combine(std::span<const CombineArgs> per_rank, Stream stream);
  // Zero-copy combine input of `rank` for the last dispatch (device memory, in its window).
  TensorView combine_buffer(int rank) const;
  // Enqueues Buffer::compact(): every rank's valid received rows copied densely (by local
  // expert in the latency layout, then source rank, then token), for expert GEMMs that need
  // contiguous rows. Between dispatch_recv and combine; valid until the next compact(). Shaped by
  // capacity [rows the window holds, hidden]: the first recv_count-sum rows are valid. Combine
  // takes outputs in this order with CombineArgs::compacted (at least that many rows).
  std::vector<TensorView> compact(Stream stream);

  int64_t num_recv_rows(int rank, Stream stream);  // synchronises with the stream
  void synchronize(Stream stream);                 // waits, then throws any kernel error
  int blocks_per_rank() const;
  // Test hook: rank r's blocks start each later call `ns[r]` nanoseconds late (0: none).
  void set_start_delays(const std::vector<uint32_t>& ns);

 private:
  std::unique_ptr<Engine> e_;
};

// One rank per process, ranks of one host (CUDA IPC): every rank allocates its window on its
// device, the cudaIpcMemHandles travel through the bootstrap (collective), every rank maps its
// peers' windows. The same calls as VirtualBuffer with one argument.
class IpcBuffer {
 public:
  IpcBuffer(std::shared_ptr<Bootstrap> bootstrap, BufferConfig config, Options options = {});
  ~IpcBuffer();
  IpcBuffer(const IpcBuffer&) = delete;
  IpcBuffer& operator=(const IpcBuffer&) = delete;

  int rank() const;
  int ranks() const;
  const BufferConfig& config() const;
  void set_algorithm(Algorithm a);
  void set_sync_mode(SyncMode m);
  void dispatch_send(const DispatchArgs& args, Stream stream);
  DispatchResult dispatch_recv(Stream stream);
  DispatchResult dispatch(const DispatchArgs& args, Stream stream);
  void combine_send(const CombineArgs& args, Stream stream);
  TensorView combine_recv(Stream stream);
  TensorView combine(const CombineArgs& args, Stream stream);
  TensorView combine_buffer() const;
  TensorView compact(Stream stream);
  int64_t num_recv_rows(Stream stream);
  void synchronize(Stream stream);

 private:
  std::shared_ptr<Bootstrap> bootstrap_;
  std::unique_ptr<Engine> e_;
  std::shared_ptr<void> mappings_;  // peers' windows opened through CUDA IPC
};

}  // namespace ubep::cuda
