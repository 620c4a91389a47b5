// A GPU through the CUDA runtime, for KernelEngine (device_ops.hpp).
//
// Streams: kernels run on a private non-blocking stream of this rank, after the caller's stream
// (set_stream; default: the legacy default stream, PyTorch's default too) has reached the launch
// (an event), so they see the caller's inputs. Not on the caller's stream itself: thread ranks
// sharing a GPU would then queue their kernels behind each other on the legacy stream, and rank
// 0's kernel would spin forever on rank 1's, queued behind it. Copies and failure words go
// through a second private non-blocking stream that waits for itself only, for the same reason:
// a blocking copy would wait for this rank's kernel, which may be spinning on a peer whose
// thread is about to publish the very word it needs.
#include <cuda_runtime.h>

#include <cstring>

#include "backend/cuda/device_ops.hpp"
#include "backend/cuda/launch.hpp"
#include "backend/cuda/host_logic.hpp"
#include "ubep/error.hpp"

namespace ubep::cuda_host {

namespace {

class CudaOps final : public DeviceOps {
 public:
  explicit CudaOps(const Device& d) : device_(d) {
    std::string why;
    if (!cuda::device_available(&why)) throw SystemError("Buffer on " + d.describe() + ": " + why);
    int n = 0;
    cuda::check_cuda(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    UBEP_CHECK_ARG(d.index >= 0 && d.index < n, "Buffer: device ", d.describe(),
                   " does not exist (this machine has ", n, " CUDA devices)");
    set();
    int coop = 0;
    cuda::check_cuda(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, d.index),
                     "cooperative launch attribute");
    UBEP_CHECK(coop != 0, SystemError, "Buffer: device ", d.describe(),
               " does not support cooperative launches");
    cuda::check_cuda(cudaDeviceGetAttribute(&khz_, cudaDevAttrClockRate, d.index), "clock rate");
    cuda::check_cuda(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "stream");
    cuda::check_cuda(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking), "stream");
    cuda::check_cuda(cudaEventCreateWithFlags(&inputs_, cudaEventDisableTiming), "event");
  }
  ~CudaOps() override {
    set();
    cudaStreamSynchronize(own_);
    cudaEventDestroy(inputs_);
    cudaStreamDestroy(own_);
    cudaStreamDestroy(side_);
  }

  Device device() const override { return device_; }
  int threads_per_block() const override { return 512; }
  int blocks_per_rank(int ranks_here, size_t smem) override {
    set();
    return cuda_host::blocks_per_rank(
        0, cuda::coresident_blocks(false, threads_per_block(), smem, device_.index), ranks_here);
  }
  long long timeout_cycles(double seconds) const override {
    return static_cast<long long>(seconds * 1e3 * (khz_ > 0 ? khz_ : 1));
  }

  void* alloc_device(size_t bytes) override {
    set();
    void* p = nullptr;
    cuda::check_cuda(cudaMalloc(&p, bytes ? bytes : 16), "device allocation");
    cuda::check_cuda(cudaMemsetAsync(p, 0, bytes ? bytes : 16, side_), "zeroing");
    cuda::check_cuda(cudaStreamSynchronize(side_), "zeroing");
    return p;
  }
  void free_device(void* p) noexcept override {
    if (!p) return;
    set();
    cudaFree(p);
  }
  void* alloc_mapped(size_t bytes, void** device_ptr) override {
    set();
    void* p = nullptr;
    cuda::check_cuda(cudaHostAlloc(&p, bytes, cudaHostAllocMapped), "mapped allocation");
    std::memset(p, 0, bytes);
    cuda::check_cuda(cudaHostGetDevicePointer(device_ptr, p, 0), "mapped pointer");
    return p;
  }
  void free_mapped(void* p) noexcept override {
    if (p) cudaFreeHost(p);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    set();
    cuda::check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, side_), "copy");
    cuda::check_cuda(cudaStreamSynchronize(side_), "copy");
  }
  // A failure word carries no payload: a reader that sees it needs no other write of this rank to
  // be visible, so a plain 4-byte copy (atomic for an aligned word) is enough; the kernels poll
  // it with ld.acquire.sys and at worst see it one poll later.
  void store_word(uint32_t* word, uint32_t value) override { copy(word, &value, sizeof value); }
  uint32_t load_word(const uint32_t* word) override {
    uint32_t v = 0;
    copy(&v, word, sizeof v);
    return v;
  }

  std::vector<char> export_memory(void* p) override {
    set();
    cudaIpcMemHandle_t h;
    cuda::check_cuda(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle");
    std::vector<char> out(sizeof h);
    std::memcpy(out.data(), &h, sizeof h);
    return out;
  }
  void* open_memory(const std::vector<char>& handle) override {
    UBEP_CHECK(handle.size() == sizeof(cudaIpcMemHandle_t), SystemError,
               "a peer's window handle has ", handle.size(), " bytes (is it on a CUDA device?)");
    set();
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    void* p = nullptr;
    cuda::check_cuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                     "cudaIpcOpenMemHandle");
    return p;
  }
  void close_memory(void* p) noexcept override {
    set();
    cudaIpcCloseMemHandle(p);
  }
  void enable_peer(int other) override {
    set();
    const cudaError_t e = cudaDeviceEnablePeerAccess(other, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      return;
    }
    cuda::check_cuda(e, "cudaDeviceEnablePeerAccess");
  }

  void launch_dispatch(const cuda_hd::LaunchParams& p, int blocks, int threads,
                       size_t smem) override {
    after_caller();
    cuda::launch_dispatch(false, p, blocks, threads, smem, own_);
  }
  void launch_combine(const cuda_hd::LaunchParams& p, int blocks, int threads) override {
    after_caller();
    cuda::launch_combine(false, p, blocks, threads, own_);
  }
  void synchronize() override {
    set();
    cuda::check_cuda(cudaStreamSynchronize(own_), "stream synchronize");
  }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

 private:
  void set() const { cudaSetDevice(device_.index); }
  void after_caller() {
    set();
    cuda::check_cuda(cudaEventRecord(inputs_, stream_), "event record");
    cuda::check_cuda(cudaStreamWaitEvent(own_, inputs_, 0), "stream wait");
  }

  Device device_;
  int khz_ = 0;
  cudaStream_t stream_ = nullptr;  // the caller's (legacy default unless set)
  cudaStream_t own_ = nullptr;     // this rank's kernels
  cudaStream_t side_ = nullptr;    // copies
  cudaEvent_t inputs_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceOps> make_cuda_ops(const Device& device) {
  return std::make_unique<CudaOps>(device);
}

}  // namespace ubep::cuda_host
