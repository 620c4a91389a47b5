// The CUDA backend behind ubep::Buffer: one rank's windows in device memory, peers' windows
// mapped at set-up through the Group (a pointer for ranks of this process, a CUDA IPC handle for
// other processes), and every call run by the dispatch and combine kernels (the roles of the
// ubep and bsp algorithms as warps, docs/CUDA.md) over a DeviceOps: a GPU, or the CUDA
// simulation device that runs the same kernels on CPU threads.
//
// Calls follow Buffer's contract. One-shot calls and the *_recv halves wait for the kernels
// (the result's num_recv_rows and any kernel error are then known); *_send only enqueues. Every
// rank launches its own kernels (IpcPeers): ranks of one process sharing a GPU split its
// co-resident blocks, so every spin-wait's partner is running.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device_ops.hpp"
#include "backend/cuda/sequencer.hpp"
#include "backend/engine.hpp"
#include "protocol/call_machine.hpp"

namespace ubep::cuda_host {

class KernelEngine final : public backend::Engine {
 public:
  KernelEngine(Group& group, const BufferConfig& cfg, std::unique_ptr<DeviceOps> ops);
  ~KernelEngine() override;
  KernelEngine(const KernelEngine&) = delete;
  KernelEngine& operator=(const KernelEngine&) = delete;

  DispatchResult dispatch(const DispatchArgs& args) override;
  TensorView combine(const CombineArgs& args) override;
  void dispatch_send(const DispatchArgs& args) override;
  DispatchResult dispatch_recv() override;
  void combine_send(const CombineArgs& args) override;
  TensorView combine_recv() override;
  std::array<int64_t, 2> wait_recv_range(int source, int local_expert) override;
  DispatchResult pending_dispatch() const override;
  TensorView pending_combine() const override;
  TensorView compact() override;
  TensorView compact_scales() const override;
  TensorView combine_buffer() const override;

  const BufferConfig& config() const override { return cfg_; }
  Group& group() override { return group_; }
  int num_workers() const override { return 0; }  // the roles are warps, not host threads
  void set_algorithm(Algorithm a) override;
  void set_sync_mode(SyncMode m) override;
  const CallStats& last_stats() const override { return stats_; }
  size_t shared_bytes() const override { return seq_.map().total; }

  int blocks_per_rank() const { return bpr_; }

 private:
  void map_peers();
  void publish_failure(uint32_t word);
  [[noreturn]] void break_call(const char* what, const std::exception& cause);
  void check_idle(const char* what) const;
  // Waits for the launches so far; a kernel error breaks the buffer (bad expert ids do not:
  // the kernels routed them nowhere and every rank completed the call consistently).
  void finish(const char* what);
  void launch_dispatch(const DispatchArgs* args, uint32_t phases, const char* what);
  void launch_combine(const CombineArgs* args, uint32_t phases, const char* what);
  cuda_hd::LaunchParams combine_params(const CombineArgs& args, uint32_t phases, const char* what);
  void arm(cuda_hd::LaunchParams& p) const;
  DispatchResult result() const;
  int64_t sum_recv_count() const;
  uint32_t failure_of(int peer) const;
  uint64_t calls() const { return machine_.calls(); }

  Group& group_;
  BufferConfig cfg_;
  // Shared with the release of this rank's device window, which may outlive the engine
  // (local_windows.hpp).
  std::shared_ptr<DeviceOps> ops_;
  Sequencer seq_;
  LaunchResources res_;
  int rank_, ranks_, threads_ = 0, bpr_ = 0;
  size_t smem_ = 0;
  double timeout_s_ = 0;
  char* window_ = nullptr;
  char* scratch_ = nullptr;
  char* y_ = nullptr;
  char* compact_ = nullptr;
  char** bases_dev_ = nullptr;
  uint32_t* claim_ = nullptr;
  cuda_hd::ErrorInfo* error_ = nullptr;  // host side of the mapped error word
  int64_t* recv_rows_ = nullptr;         // host side of the mapped row count
  std::vector<char*> bases_;
  std::vector<void*> opened_;  // peers' windows opened through IPC handles
  // Device windows: this rank's, and a reference to each peer's of this process, so no window
  // is freed while a rank of this process may still read or write it (local_windows.hpp).
  struct Allocations {  // this rank's other device memory, released with its window
    std::vector<void*> device, mapped;
  };
  std::shared_ptr<Allocations> allocs_ = std::make_shared<Allocations>();
  std::shared_ptr<char> own_window_;
  std::vector<std::shared_ptr<char>> local_peers_;
  bool remote_peers_ = false;  // a peer in another process: tear-down meets at a barrier
  // Windows in host memory (the simulation device) come from the Group, like the CPU backend's:
  // every local peer is mapped by it, and they live as long as the group, so no rank can free
  // memory a peer still reads.
  std::unique_ptr<SharedWindow> shared_;

  Layout layout_ = Layout::kThroughput;
  int64_t num_recv_rows_ = -1;
  int64_t tokens_ = 0;  // of the last dispatch
  int topk_ = 0;
  // Phases, calls, broken, failure words: the host backend's state machine.
  protocol::CallMachine machine_;
  CallStats stats_;
};

}  // namespace ubep::cuda_host
