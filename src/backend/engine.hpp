// What runs a Buffer's calls: the one interface behind ubep::Buffer (include/ubep/buffer.hpp),
// whatever the device. Two families implement it:
//
//   host-driven  ep::HostEngine: the bsp and ubep algorithms (src/ep) as host roles over a
//                backend::DataPath (src/backend/cpu: shared memory, worker threads).
//   kernels      cuda_host::KernelEngine (src/backend/cuda): the CUDA backend's kernels, whose
//                warps are the roles, over a DeviceOps -- a GPU (cuda/cuda_ops.cu) or the CUDA
//                simulation device (cuda_sim/), which runs the same kernel code on CPU threads.
//
// backend/factory/factory.hpp picks the family and the backend from BufferConfig::device. The
// contract of every call is Buffer's (docs/SEMANTICS.md); Buffer itself only forwards.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ubep/buffer.hpp"

namespace ubep::backend {

class Engine {
 public:
  virtual ~Engine() = default;

  virtual DispatchResult dispatch(const DispatchArgs& args) = 0;
  virtual TensorView combine(const CombineArgs& args) = 0;
  virtual void dispatch_send(const DispatchArgs& args) = 0;
  virtual DispatchResult dispatch_recv() = 0;
  virtual void combine_send(const CombineArgs& args) = 0;
  virtual TensorView combine_recv() = 0;
  virtual std::array<int64_t, 2> wait_recv_range(int source, int local_expert) = 0;
  virtual DispatchResult pending_dispatch() const = 0;
  virtual TensorView pending_combine() const = 0;
  virtual TensorView compact() = 0;
  virtual TensorView compact_scales() const = 0;
  virtual TensorView combine_buffer() const = 0;

  virtual const BufferConfig& config() const = 0;
  virtual Group& group() = 0;
  virtual int num_workers() const = 0;
  // Elastic EP (docs/ELASTIC.md): engines without it refuse, naming the device.
  virtual void mask(int rank);
  virtual std::vector<int> masked_ranks() const { return {}; }
  virtual void rejoin();

  virtual void set_algorithm(Algorithm a) = 0;
  virtual void set_sync_mode(SyncMode m) = 0;
  virtual const CallStats& last_stats() const = 0;
  virtual size_t shared_bytes() const = 0;
};

}  // namespace ubep::backend
