#include "backend/cuda/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "ubep/error.hpp"

namespace ubep::cuda {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw SystemError(detail::concat("CUDA: ", what, ": ", cudaGetErrorString(err)));
}

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    if (why)
      *why = err != cudaSuccess ? detail::concat("cudaGetDeviceCount: ", cudaGetErrorString(err))
                                : std::string("no CUDA device");
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return true;
}

Engine::Engine(bool virtual_ranks, int ranks, int first_rank, int local_ranks,
               const BufferConfig& cfg, const Options& opts)
    : virtual_(virtual_ranks),
      ranks_(ranks),
      first_rank_(first_rank),
      local_ranks_(local_ranks),
      cfg_(cfg),
      opts_(opts),
      seq_(cfg, ranks, first_rank, local_ranks) {
  UBEP_CHECK_ARG(opts.threads_per_block >= 32 && opts.threads_per_block <= 512 &&
                     opts.threads_per_block % 32 == 0,
                 "CUDA buffer: threads_per_block ", opts.threads_per_block,
                 " must be a multiple of 32 in [32, 512]");
  UBEP_CHECK_ARG(virtual_ || ranks <= opts.threads_per_block, "CUDA IPC buffer: ranks ", ranks,
                 " exceed threads_per_block (bsp's barrier uses a thread per rank)");
  std::string why;
  if (!device_available(&why)) throw SystemError("CUDA buffer: " + why);
  device_ = cfg.device.index;
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  int coop = 0;
  check_cuda(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device_),
             "cooperative launch attribute");
  UBEP_CHECK(coop != 0, SystemError, "CUDA buffer: device ", device_,
             " does not support cooperative launches (every rank's blocks must be co-resident)");
  threads_ = opts.threads_per_block;
  smem_ = cuda_host::dispatch_smem(threads_ / 32, cfg.max_topk, cfg.num_experts / ranks);
  bpr_ = cuda_host::blocks_per_rank(
      opts.blocks_per_rank, coresident_blocks(virtual_, threads_, smem_, device_), local_ranks_);
  int khz = 0;
  check_cuda(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device_), "clock rate");
  res_.timeout_cycles = static_cast<long long>(opts.timeout_s * 1e3 * std::max(khz, 1));
  res_.blocks_per_rank = bpr_;
  const protocol::WindowLayout& map = seq_.map();
  const cuda_hd::ScratchLayout& smap = seq_.scratch_map();

  const auto L = static_cast<size_t>(local_ranks_);
  const size_t y_bytes = static_cast<size_t>(cfg.max_tokens_per_rank) * map.row_bytes;
  // Windows start zeroed (a tag is never 0) and are never cleaned again.
  check_cuda(cudaMalloc(&own_, L * map.total), "window allocation");
  check_cuda(cudaMemset(own_, 0, L * map.total), "window zeroing");
  check_cuda(cudaMalloc(&scratch_, L * smap.total), "scratch allocation");
  check_cuda(cudaMemset(scratch_, 0, L * smap.total), "scratch zeroing");
  check_cuda(cudaMalloc(&y_, std::max<size_t>(L * y_bytes, 16)), "output allocation");
  check_cuda(cudaMalloc(&bases_dev_, static_cast<size_t>(ranks) * sizeof(char*)), "peer table");
  check_cuda(cudaHostAlloc(&error_, sizeof(cuda_hd::ErrorInfo), cudaHostAllocMapped), "error word");
  *error_ = {};
  cuda_hd::ErrorInfo* error_dev = nullptr;
  check_cuda(cudaHostGetDevicePointer(&error_dev, error_, 0), "error word mapping");
  check_cuda(cudaMalloc(&claim_, sizeof(uint32_t)), "error claim");
  check_cuda(cudaMemset(claim_, 0, sizeof(uint32_t)), "error claim zeroing");
  check_cuda(cudaHostAlloc(&recv_rows_, L * sizeof(int64_t), cudaHostAllocMapped), "row counts");
  std::fill(recv_rows_, recv_rows_ + L, int64_t{-1});
  int64_t* recv_rows_dev = nullptr;
  check_cuda(cudaHostGetDevicePointer(&recv_rows_dev, recv_rows_, 0), "row count mapping");
  for (size_t i = 0; i < L; ++i)
    seq_.set_rank_memory(static_cast<int>(i), scratch_ + i * smap.total, y_ + i * y_bytes);
  res_.bases = bases_dev_;
  res_.error = {error_dev, claim_};
  res_.host_recv_rows = recv_rows_dev;
  if (virtual_) {
    std::vector<char*> b(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r)
      b[static_cast<size_t>(r)] = own_ + static_cast<size_t>(r) * map.total;
    set_bases(b);
  }
  check_cuda(cudaDeviceSynchronize(), "buffer set-up");
}

Engine::~Engine() {
  cudaDeviceSynchronize();
  cudaFree(own_);
  cudaFree(scratch_);
  cudaFree(y_);
  cudaFree(compact_);
  cudaFree(bases_dev_);
  cudaFree(claim_);
  cudaFreeHost(error_);
  cudaFreeHost(recv_rows_);
}

void Engine::set_bases(const std::vector<char*>& bases) {
  seq_.set_bases(bases);
  check_cuda(
      cudaMemcpy(bases_dev_, bases.data(), bases.size() * sizeof(char*), cudaMemcpyHostToDevice),
      "peer table upload");
}

// The device writes the details, a system fence, then the code: a non-zero code read here means
// the details are complete (the acquire fence orders the reads after it).
void Engine::check_error() const {
  const uint32_t code = *reinterpret_cast<const volatile uint32_t*>(&error_->code);
  if (code == 0) return;
  std::atomic_thread_fence(std::memory_order_acquire);
  cuda_hd::ErrorInfo e;
  std::memcpy(&e, error_, sizeof e);
  e.code = code;
  cuda_host::throw_if_error(e, opts_.timeout_s);
}

void Engine::dispatch(std::span<const DispatchArgs> args, uint32_t phases, cudaStream_t s) {
  check_error();
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  launch_dispatch(virtual_, seq_.dispatch(args, phases, res_), local_ranks_ * bpr_, threads_, smem_,
                  s);
}

void Engine::combine(std::span<const CombineArgs> args, uint32_t phases, cudaStream_t s) {
  check_error();
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  launch_combine(virtual_, seq_.combine(args, phases, res_), local_ranks_ * bpr_, threads_, s);
}

std::vector<TensorView> Engine::compact(cudaStream_t s) {
  check_error();
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  if (!compact_) {
    // The largest compact() output of either layout (the window's comb_rows), per local rank.
    const protocol::WindowLayout& m = seq_.map();
    const size_t per_rank = static_cast<size_t>(m.comb_rows()) * m.row_bytes;
    check_cuda(
        cudaMalloc(&compact_, std::max<size_t>(per_rank * static_cast<size_t>(local_ranks_), 16)),
        "compact() output allocation");
    for (int i = 0; i < local_ranks_; ++i)
      seq_.set_compact_memory(i, compact_ + static_cast<size_t>(i) * per_rank);
  }
  launch_dispatch(virtual_, seq_.compact(res_), local_ranks_ * bpr_, threads_, smem_, s);
  return seq_.compacted();
}

std::vector<DispatchResult> Engine::results() { return seq_.results(); }
TensorView Engine::combine_buffer(int i) const { return seq_.combine_buffer(i); }
std::vector<TensorView> Engine::outputs() { return seq_.outputs(); }

int64_t Engine::num_recv_rows(int i, cudaStream_t s) {
  synchronize(s);
  return recv_rows_[i];
}

void Engine::synchronize(cudaStream_t s) {
  check_cuda(cudaStreamSynchronize(s), "stream synchronize");
  check_error();
}

}  // namespace ubep::cuda
