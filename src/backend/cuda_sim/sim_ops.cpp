// The CUDA simulation device (DeviceType::kCudaSim): the CUDA backend's kernels, unchanged,
// compiled by the host compiler against cuda_host_sim.hpp and run on CPU threads (one
// std::thread per GPU thread), so a Buffer on this device runs the CUDA backend's code end to end
// -- KernelEngine, Sequencer, dispatch.cuh, combine.cuh -- and the Buffer-level test suites cover
// it on machines without a GPU (ctest label cuda_sim).
//
// "Device" memory is host memory, so results can be read directly. Ranks must be threads of one
// process (peers are reached by pointer; there are no IPC handles to open). Each launch runs to
// completion before it returns; peers' launches run concurrently on their own rank threads, so
// every spin-wait's partner makes progress. What it cannot show: the GPU's weaker memory model
// (C++ atomics here), warp scheduling, performance.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/combine.cuh"
#include "backend/cuda/device_ops.hpp"
#include "ubep/error.hpp"

namespace ubep::cuda_host {

namespace {

class SimOps final : public DeviceOps {
 public:
  explicit SimOps(const Device& d) : device_(d) {}

  Device device() const override { return device_; }
  bool host_readable() const override { return true; }
  // One warp per rank: every simulated thread is an OS thread, and the kernels' roles loop
  // over their work by warp (the multi-block and multi-warp paths are covered by test_cuda_sim).
  int threads_per_block() const override { return 32; }
  int blocks_per_rank(int, size_t) override { return 1; }
  long long timeout_cycles(double seconds) const override {
    return static_cast<long long>(seconds * 1e9);  // clock64() counts ns here
  }

  void* alloc_device(size_t bytes) override {
    const size_t n = (bytes + 255) / 256 * 256 + 256;
    void* p = std::aligned_alloc(256, n);
    UBEP_CHECK(p != nullptr, SystemError, "cuda-sim: cannot allocate ", bytes, " bytes");
    std::memset(p, 0, n);
    return p;
  }
  void free_device(void* p) noexcept override { std::free(p); }
  void* alloc_mapped(size_t bytes, void** device_ptr) override {
    void* p = alloc_device(bytes);
    *device_ptr = p;
    return p;
  }
  void free_mapped(void* p) noexcept override { std::free(p); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void store_word(uint32_t* word, uint32_t value) override {
    std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_release);
  }
  uint32_t load_word(const uint32_t* word) override {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word)).load(std::memory_order_acquire);
  }

  std::vector<char> export_memory(void*) override { return {}; }
  void* open_memory(const std::vector<char>&) override {
    throw InvalidArgument(
        "Buffer on " + device_.describe() +
        ": the CUDA simulation device runs ranks that are threads of one process (a peer is in "
        "another process); use ubep::run_on_threads, or a GPU");
  }
  void close_memory(void*) noexcept override {}
  void enable_peer(int) override {}

  void launch_dispatch(const cuda_hd::LaunchParams& p, int blocks, int threads,
                       size_t smem) override {
    sim::launch(&cuda_dev::dispatch_kernel<cuda_dev::IpcPeers>, p, blocks, threads, smem);
  }
  void launch_combine(const cuda_hd::LaunchParams& p, int blocks, int threads) override {
    sim::launch(&cuda_dev::combine_kernel<cuda_dev::IpcPeers>, p, blocks, threads, 0);
  }
  void synchronize() override {}
  void set_stream(void*) override {}

 private:
  Device device_;
};

}  // namespace

std::unique_ptr<DeviceOps> make_sim_ops(const Device& device) {
  return std::make_unique<SimOps>(device);
}

}  // namespace ubep::cuda_host
