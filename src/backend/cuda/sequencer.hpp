// The host side of a CUDA buffer's calls, without the CUDA runtime: the state machine of split
// and one-shot calls, epochs (tags, halves), rank-local generations, bsp's barrier counts, the
// inputs of the last dispatch, the kernel parameters of every launch and the result views.
// The engine (engine.cu) launches what it returns on a stream; the CPU simulation test
// (tests/cuda/test_cuda_sim.cpp) launches it on simulated threads -- the same sequencing code.
#pragma once

#include <span>
#include <vector>

#include "backend/cuda/device_plan.hpp"
#include "ubep/buffer.hpp"

namespace ubep::cuda_host {

// What the launcher owns: the kernel-side peer table, the launch shape, the error sink.
struct LaunchResources {
  char* const* bases = nullptr;  // [ranks] in device memory (the kernels read it)
  int blocks_per_rank = 1;
  long long timeout_cycles = 0;
  cuda_hd::ErrorSink error;
  int64_t* host_recv_rows = nullptr;  // [local_ranks], host-mapped
};

class Sequencer {
 public:
  // Local ranks [first_rank, first_rank + local_ranks) of a group of `ranks`.
  Sequencer(const BufferConfig& cfg, int ranks, int first_rank, int local_ranks);

  const protocol::WindowLayout& map() const { return map_; }
  const cuda_hd::ScratchLayout& scratch_map() const { return smap_; }
  const BufferConfig& config() const { return cfg_; }
  int local_ranks() const { return local_; }
  // Per local rank: its scratch and output memory; every rank's window base (host copy of the
  // kernel's peer table, for the result views).
  void set_rank_memory(int i, char* scratch, void* y);
  void set_bases(std::vector<char*> bases) { bases_ = std::move(bases); }
  void set_start_delays(const std::vector<uint32_t>& ns);

  // Validates and records a dispatch launch (phases kSend and/or kRecv) and returns its kernel
  // parameters. Throws InvalidArgument (nothing recorded) on a bad call. `ids_on_host`: the
  // expert ids are in host-readable memory, so they are checked here too, before anything is
  // recorded. A rejected call must not take a sequence number: the dispatch before it could no
  // longer be combined, and the gap put this rank's next call in the window half of the call
  // its peers might still be reading (seen: a peer waiting out the timeout for a count record
  // already overwritten, in 2 of 4 runs of a BadInput variant on the CUDA simulation).
  cuda_hd::LaunchParams dispatch(std::span<const DispatchArgs> args, uint32_t phases,
                                 const LaunchResources& res, bool ids_on_host = false);
  // The same for a combine launch (kCombSend and/or kCombRecv).
  cuda_hd::LaunchParams combine(std::span<const CombineArgs> args, uint32_t phases,
                                const LaunchResources& res);

  // A compact() launch (kCompact) of the last dispatch: it must be complete (dispatch_recv done)
  // and not yet combined; set_compact_memory must have given every local rank its output.
  cuda_hd::LaunchParams compact(const LaunchResources& res);
  void set_compact_memory(int i, void* out);
  bool has_compact_memory() const { return io_.empty() || io_[0].compact_out != nullptr; }
  // compact()'s output views per local rank: [capacity, hidden], the first sum(recv_count) rows
  // valid (the count is on the device).
  std::vector<TensorView> compacted() const;
  int64_t compact_capacity() const;  // rows of compact()'s output per rank

  std::vector<DispatchResult> results() const;  // views of the last dispatch, per local rank
  TensorView combine_buffer(int i) const;
  std::vector<TensorView> outputs() const;  // combine outputs, per local rank

  Algorithm algorithm = Algorithm::kUbep;
  SyncMode sync = SyncMode::kFused;

 private:
  cuda_hd::LaunchParams params(uint32_t phases, const LaunchResources& res) const;

  BufferConfig cfg_;
  int ranks_, first_, local_;
  protocol::WindowLayout map_;
  cuda_hd::ScratchLayout smap_;
  std::vector<char*> bases_;
  std::vector<cuda_hd::RankIO> io_;
  uint64_t next_seq_, seq_ = 0;
  uint32_t gen_ = 0, barrier_seq_ = 1;
  bool have_dispatch_ = false, dispatch_open_ = false, combine_open_ = false;
  bool dispatch_done_ = false;  // the last dispatch completed; its rows stay until the next one
  Layout layout_ = Layout::kThroughput;
  Placement placement_ = Placement::kCompact;  // of the last dispatch, resolved
};

}  // namespace ubep::cuda_host
