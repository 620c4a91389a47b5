// The CUDA backend's engine, shared by VirtualBuffer (R ranks in this process, one launch) and
// IpcBuffer (this process's rank, peers mapped through CUDA IPC): windows and scratch in device
// memory, the call state machine (epochs, generations), kernel launches and error reporting.
#pragma once

#include <cuda_runtime.h>

#include <span>
#include <vector>

#include "backend/cuda/device_plan.hpp"
#include "backend/cuda/host_logic.hpp"
#include "backend/cuda/sequencer.hpp"
#include "ubep/cuda.hpp"

namespace ubep::cuda {

// Launchers (dispatch.cu, combine.cu): cooperative launches of the kernels for a peer policy.
void launch_dispatch(bool virtual_ranks, const cuda_hd::LaunchParams& p, int grid, int block,
                     size_t smem, cudaStream_t s);
void launch_combine(bool virtual_ranks, const cuda_hd::LaunchParams& p, int grid, int block,
                    cudaStream_t s);
// Blocks of `block` threads (dispatch's smem) that fit co-resident for both kernels.
int coresident_blocks(bool virtual_ranks, int block, size_t smem, int device);

void check_cuda(cudaError_t err, const char* what);

class Engine {
 public:
  // windows: [ranks] base pointers valid in this process (own windows and mapped peers);
  // local ranks are [first_rank, first_rank + local_ranks).
  Engine(bool virtual_ranks, int ranks, int first_rank, int local_ranks, const BufferConfig& cfg,
         const Options& opts);
  ~Engine();

  // Memory of this process's own windows: one allocation, local_ranks windows of window_bytes.
  size_t window_bytes() const { return seq_.map().total; }
  char* own_windows() const { return own_; }
  void set_bases(const std::vector<char*>& bases);  // after IPC mapping (or own windows)

  void dispatch(std::span<const DispatchArgs> args, uint32_t phases, cudaStream_t s);
  std::vector<DispatchResult> results();
  void combine(std::span<const CombineArgs> args, uint32_t phases, cudaStream_t s);
  std::vector<TensorView> outputs();
  TensorView combine_buffer(int local_rank) const;
  // Enqueues the copy of every local rank's valid rows into dense memory (allocated on first
  // use) and returns the views.
  std::vector<TensorView> compact(cudaStream_t s);

  int64_t num_recv_rows(int local_rank, cudaStream_t s);
  void synchronize(cudaStream_t s);
  void check_error() const;  // non-blocking: throws what a finished kernel reported

  const BufferConfig& config() const { return cfg_; }
  int ranks() const { return ranks_; }
  int blocks_per_rank() const { return bpr_; }
  void set_start_delays(const std::vector<uint32_t>& ns) { seq_.set_start_delays(ns); }
  void set_algorithm(Algorithm a) { seq_.algorithm = a; }
  void set_sync_mode(SyncMode m) { seq_.sync = m; }

 private:
  bool virtual_;
  int ranks_, first_rank_, local_ranks_;
  BufferConfig cfg_;
  Options opts_;
  cuda_host::Sequencer seq_;  // call state and kernel parameters (host only, tested on CPU)
  cuda_host::LaunchResources res_;
  int device_ = 0, bpr_ = 1, threads_ = 512;
  size_t smem_ = 0;
  char* own_ = nullptr;      // local_ranks windows
  char* scratch_ = nullptr;  // local_ranks scratch areas
  char* y_ = nullptr;        // local_ranks combine outputs [T, row]
  char* compact_ = nullptr;  // local_ranks compact() outputs [comb_rows, row], lazily
  char** bases_dev_ = nullptr;
  cuda_hd::ErrorInfo* error_ = nullptr;  // host-mapped
  int64_t* recv_rows_ = nullptr;         // host-mapped [local_ranks]
  uint32_t* claim_ = nullptr;            // device memory (ErrorSink::claim)
};

}  // namespace ubep::cuda
