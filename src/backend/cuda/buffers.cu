// The public host API (include/ubep/cuda.hpp) over the Engine: VirtualBuffer (virtual ranks)
// and IpcBuffer (CUDA IPC windows exchanged through the Bootstrap).
#include <cstring>

#include "backend/cuda/engine.hpp"
#include "ubep/error.hpp"

namespace ubep::cuda {

namespace {
cudaStream_t st(Stream s) { return reinterpret_cast<cudaStream_t>(s); }
}  // namespace

// ---- VirtualBuffer --------------------------------------------------------------------------

VirtualBuffer::VirtualBuffer(int ranks, BufferConfig config, Options options)
    : e_(std::make_unique<Engine>(true, ranks, 0, ranks, config, options)) {}
VirtualBuffer::~VirtualBuffer() = default;
int VirtualBuffer::ranks() const { return e_->ranks(); }
const BufferConfig& VirtualBuffer::config() const { return e_->config(); }
void VirtualBuffer::set_algorithm(Algorithm a) { e_->set_algorithm(a); }
void VirtualBuffer::set_sync_mode(SyncMode m) { e_->set_sync_mode(m); }
int VirtualBuffer::blocks_per_rank() const { return e_->blocks_per_rank(); }
void VirtualBuffer::set_start_delays(const std::vector<uint32_t>& ns) { e_->set_start_delays(ns); }

void VirtualBuffer::dispatch_send(std::span<const DispatchArgs> a, Stream s) {
  e_->dispatch(a, cuda_hd::kSend, st(s));
}
std::vector<DispatchResult> VirtualBuffer::dispatch_recv(Stream s) {
  e_->dispatch({}, cuda_hd::kRecv, st(s));
  return e_->results();
}
std::vector<DispatchResult> VirtualBuffer::dispatch(std::span<const DispatchArgs> a, Stream s) {
  e_->dispatch(a, cuda_hd::kSend | cuda_hd::kRecv, st(s));
  return e_->results();
}
void VirtualBuffer::combine_send(std::span<const CombineArgs> a, Stream s) {
  e_->combine(a, cuda_hd::kCombSend, st(s));
}
std::vector<TensorView> VirtualBuffer::combine_recv(Stream s) {
  e_->combine({}, cuda_hd::kCombRecv, st(s));
  return e_->outputs();
}
std::vector<TensorView> VirtualBuffer::combine(std::span<const CombineArgs> a, Stream s) {
  e_->combine(a, cuda_hd::kCombSend | cuda_hd::kCombRecv, st(s));
  return e_->outputs();
}
TensorView VirtualBuffer::combine_buffer(int rank) const { return e_->combine_buffer(rank); }
std::vector<TensorView> VirtualBuffer::compact(Stream s) { return e_->compact(st(s)); }
int64_t VirtualBuffer::num_recv_rows(int rank, Stream s) { return e_->num_recv_rows(rank, st(s)); }
void VirtualBuffer::synchronize(Stream s) { e_->synchronize(st(s)); }

// ---- IpcBuffer ------------------------------------------------------------------------------
// Set-up (collective): allocate this rank's window (Engine), export it with
// cudaIpcGetMemHandle, allgather the handles through the bootstrap, open every peer's
// (cudaIpcOpenMemHandle; a process cannot open its own handle, so its own base is the local
// pointer), then a barrier so nobody writes into a window before its owner zeroed it.
// Tear-down: a barrier first, so no peer still reads or writes this window when it is freed.

namespace {
struct IpcMappings {
  std::vector<char*> opened;
  ~IpcMappings() {
    for (char* p : opened)
      if (p) cudaIpcCloseMemHandle(p);
  }
};
}  // namespace

IpcBuffer::IpcBuffer(std::shared_ptr<Bootstrap> bootstrap, BufferConfig config, Options options)
    : bootstrap_(std::move(bootstrap)) {
  const int R = bootstrap_->size(), me = bootstrap_->rank();
  e_ = std::make_unique<Engine>(false, R, me, 1, config, options);
  cudaIpcMemHandle_t mine;
  check_cuda(cudaIpcGetMemHandle(&mine, e_->own_windows()), "cudaIpcGetMemHandle");
  std::vector<cudaIpcMemHandle_t> all(static_cast<size_t>(R));
  bootstrap_->allgather(&mine, all.data(), sizeof mine);
  auto maps = std::make_shared<IpcMappings>();
  std::vector<char*> bases(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    if (r == me) {
      bases[static_cast<size_t>(r)] = e_->own_windows();
      continue;
    }
    void* p = nullptr;
    check_cuda(
        cudaIpcOpenMemHandle(&p, all[static_cast<size_t>(r)], cudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle");
    bases[static_cast<size_t>(r)] = static_cast<char*>(p);
    maps->opened.push_back(static_cast<char*>(p));
  }
  e_->set_bases(bases);
  mappings_ = maps;
  bootstrap_->barrier();
}

IpcBuffer::~IpcBuffer() {
  try {
    if (e_) cudaDeviceSynchronize();
    bootstrap_->barrier();
  } catch (...) {
  }
  mappings_.reset();
  e_.reset();
}

int IpcBuffer::rank() const { return bootstrap_->rank(); }
int IpcBuffer::ranks() const { return e_->ranks(); }
const BufferConfig& IpcBuffer::config() const { return e_->config(); }
void IpcBuffer::set_algorithm(Algorithm a) { e_->set_algorithm(a); }
void IpcBuffer::set_sync_mode(SyncMode m) { e_->set_sync_mode(m); }
void IpcBuffer::dispatch_send(const DispatchArgs& a, Stream s) {
  e_->dispatch({&a, 1}, cuda_hd::kSend, st(s));
}
DispatchResult IpcBuffer::dispatch_recv(Stream s) {
  e_->dispatch({}, cuda_hd::kRecv, st(s));
  return e_->results()[0];
}
DispatchResult IpcBuffer::dispatch(const DispatchArgs& a, Stream s) {
  e_->dispatch({&a, 1}, cuda_hd::kSend | cuda_hd::kRecv, st(s));
  return e_->results()[0];
}
void IpcBuffer::combine_send(const CombineArgs& a, Stream s) {
  e_->combine({&a, 1}, cuda_hd::kCombSend, st(s));
}
TensorView IpcBuffer::combine_recv(Stream s) {
  e_->combine({}, cuda_hd::kCombRecv, st(s));
  return e_->outputs()[0];
}
TensorView IpcBuffer::combine(const CombineArgs& a, Stream s) {
  e_->combine({&a, 1}, cuda_hd::kCombSend | cuda_hd::kCombRecv, st(s));
  return e_->outputs()[0];
}
TensorView IpcBuffer::combine_buffer() const { return e_->combine_buffer(0); }
TensorView IpcBuffer::compact(Stream s) { return e_->compact(st(s))[0]; }
int64_t IpcBuffer::num_recv_rows(Stream s) { return e_->num_recv_rows(0, st(s)); }
void IpcBuffer::synchronize(Stream s) { e_->synchronize(st(s)); }

}  // namespace ubep::cuda
