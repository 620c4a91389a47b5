// What the CUDA backend's host side (KernelEngine) needs from a device: memory, the exchange of
// window addresses between ranks, kernel launches and their completion. Two implementations:
//   cuda_ops.cu     a GPU through the CUDA runtime (built where nvcc is, UBEP_WITH_CUDA)
//   cuda_sim/       the CUDA simulation device: host memory, and the same kernel code
//                   (dispatch.cuh, combine.cuh) run on CPU threads (always built)
// so every line of KernelEngine and of the kernels runs in the CPU test suite too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device_plan.hpp"
#include "ubep/types.hpp"

namespace ubep::cuda_host {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  virtual Device device() const = 0;
  // Whether the host can read this device's memory directly (the simulation device): the engine
  // then checks expert ids before launching, as the host backend does, instead of leaving them to
  // the kernels (which route a bad id nowhere and report it after the call).
  virtual bool host_readable() const { return false; }
  // Threads per block and blocks this rank may use, when `ranks_here` ranks of this process
  // share the device and every rank's blocks must be resident at once (spin-waits on peers).
  virtual int threads_per_block() const = 0;
  virtual int blocks_per_rank(int ranks_here, size_t dispatch_smem) = 0;
  // The kernels' bounded spins count clock64 cycles (ns in the simulation).
  virtual long long timeout_cycles(double seconds) const = 0;

  // Zeroed device memory (freed with free_device) and host memory the device reads and writes
  // (host pointer returned, device pointer in *device_ptr; freed with free_mapped).
  virtual void* alloc_device(size_t bytes) = 0;
  virtual void free_device(void* p) noexcept = 0;
  virtual void* alloc_mapped(size_t bytes, void** device_ptr) = 0;
  virtual void free_mapped(void* p) noexcept = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // any direction, blocking
  // A 32-bit word in device memory (a failure word, in this rank's or a peer's window) stored
  // with release order, or loaded with acquire order, from the host.
  virtual void store_word(uint32_t* word, uint32_t value) = 0;
  virtual uint32_t load_word(const uint32_t* word) = 0;

  // Window exchange. `export_memory` gives bytes a rank in another process hands to
  // open_memory (CUDA IPC handles). A peer in this process is reached by its pointer; on another
  // device of this process, after enable_peer.
  virtual std::vector<char> export_memory(void* p) = 0;
  virtual void* open_memory(const std::vector<char>& handle) = 0;
  virtual void close_memory(void* p) noexcept = 0;
  virtual void enable_peer(int device_index) = 0;

  // Enqueues a launch on this rank's stream (the simulation runs it to completion).
  virtual void launch_dispatch(const cuda_hd::LaunchParams& p, int blocks, int threads,
                               size_t smem) = 0;
  virtual void launch_combine(const cuda_hd::LaunchParams& p, int blocks, int threads) = 0;
  // Waits for everything enqueued (SystemError on a CUDA failure).
  virtual void synchronize() = 0;
  // The stream later launches go to (cudaStream_t; nullptr: the default stream).
  virtual void set_stream(void* stream) = 0;
};

// The simulation device (src/backend/cuda_sim) and a GPU (src/backend/cuda/cuda_ops.cu; throws
// SystemError naming the reason when the build has no CUDA or the machine no GPU).
std::unique_ptr<DeviceOps> make_sim_ops(const Device& device);
std::unique_ptr<DeviceOps> make_cuda_ops(const Device& device);

}  // namespace ubep::cuda_host
