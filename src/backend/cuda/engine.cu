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
      map_(cuda_host::window_layout(cfg, ranks)),
      smap_(cuda_host::scratch_layout(cfg, ranks)),
      next_seq_(cfg.initial_epoch),
      io_(static_cast<size_t>(local_ranks)),
      topk_(static_cast<size_t>(local_ranks), 0) {
  cuda_host::check_config(cfg, ranks, local_ranks);
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
  timeout_cycles_ = static_cast<long long>(opts.timeout_s * 1e3 * std::max(khz, 1));

  const auto L = static_cast<size_t>(local_ranks_);
  const size_t y_bytes = static_cast<size_t>(cfg.max_tokens_per_rank) * map_.row_bytes;
  // Windows start zeroed (a tag is never 0) and are never cleaned again.
  check_cuda(cudaMalloc(&own_, L * map_.total), "window allocation");
  check_cuda(cudaMemset(own_, 0, L * map_.total), "window zeroing");
  check_cuda(cudaMalloc(&scratch_, L * smap_.total), "scratch allocation");
  check_cuda(cudaMemset(scratch_, 0, L * smap_.total), "scratch zeroing");
  check_cuda(cudaMalloc(&y_, std::max<size_t>(L * y_bytes, 16)), "output allocation");
  check_cuda(cudaMalloc(&bases_dev_, static_cast<size_t>(ranks) * sizeof(char*)), "peer table");
  check_cuda(cudaHostAlloc(&error_, sizeof(cuda_hd::ErrorInfo), cudaHostAllocMapped), "error word");
  *error_ = {};
  check_cuda(cudaHostGetDevicePointer(&error_dev_, error_, 0), "error word mapping");
  check_cuda(cudaMalloc(&claim_, sizeof(uint32_t)), "error claim");
  check_cuda(cudaMemset(claim_, 0, sizeof(uint32_t)), "error claim zeroing");
  check_cuda(cudaHostAlloc(&recv_rows_, L * sizeof(int64_t), cudaHostAllocMapped), "row counts");
  std::fill(recv_rows_, recv_rows_ + L, int64_t{-1});
  check_cuda(cudaHostGetDevicePointer(&recv_rows_dev_, recv_rows_, 0), "row count mapping");
  for (size_t i = 0; i < L; ++i) {
    io_[i].scratch = scratch_ + i * smap_.total;
    io_[i].y = y_ + i * y_bytes;
  }
  if (virtual_) {
    std::vector<char*> b(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r)
      b[static_cast<size_t>(r)] = own_ + static_cast<size_t>(r) * map_.total;
    set_bases(b);
  }
  check_cuda(cudaDeviceSynchronize(), "buffer set-up");
}

Engine::~Engine() {
  cudaDeviceSynchronize();
  cudaFree(own_);
  cudaFree(scratch_);
  cudaFree(y_);
  cudaFree(bases_dev_);
  cudaFree(claim_);
  cudaFreeHost(error_);
  cudaFreeHost(recv_rows_);
}

void Engine::set_bases(const std::vector<char*>& bases) {
  bases_ = bases;
  check_cuda(
      cudaMemcpy(bases_dev_, bases.data(), bases.size() * sizeof(char*), cudaMemcpyHostToDevice),
      "peer table upload");
}

cuda_hd::LaunchParams Engine::params(uint32_t phases) const {
  cuda_hd::LaunchParams p;
  p.map = map_;
  p.scratch = smap_;
  p.bases = bases_dev_;
  p.ranks = ranks_;
  p.first_rank = first_rank_;
  p.local_ranks = local_ranks_;
  p.experts = cfg_.num_experts;
  p.local_experts = cfg_.num_experts / ranks_;
  p.blocks_per_rank = bpr_;
  p.hidden = cfg_.hidden;
  p.elem_bytes = static_cast<int>(dtype_size(cfg_.dtype));
  p.phases = phases;
  p.tag = ep::tag_of(seq_);
  p.half = ep::half_of(seq_);
  p.gen = gen_;
  p.barrier_seq = barrier_seq_;
  p.latency = layout_ == Layout::kLatency;
  p.stop_and_wait = sync == SyncMode::kStopAndWait;
  p.bsp = algorithm == Algorithm::kBsp;
  p.timeout_cycles = timeout_cycles_;
  p.error = {error_dev_, claim_};
  p.host_recv_rows = recv_rows_dev_;
  for (int i = 0; i < local_ranks_; ++i) p.io[i] = io_[static_cast<size_t>(i)];
  return p;
}

void Engine::set_start_delays(const std::vector<uint32_t>& ns) {
  UBEP_CHECK_ARG(static_cast<int>(ns.size()) == local_ranks_, "start delays: ", ns.size(),
                 " values for ", local_ranks_, " ranks");
  for (size_t i = 0; i < ns.size(); ++i) io_[i].start_delay_ns = ns[i];
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
  if (phases & cuda_hd::kSend) {
    UBEP_CHECK_ARG(static_cast<int>(args.size()) == local_ranks_, "dispatch: ", args.size(),
                   " argument sets for ", local_ranks_, " ranks");
    UBEP_CHECK_ARG(!dispatch_open_ && !combine_open_,
                   "dispatch: the previous split-phase call is still outstanding");
    for (int i = 0; i < local_ranks_; ++i) {
      const DispatchArgs& a = args[static_cast<size_t>(i)];
      cuda_host::check_dispatch(a, cfg_, first_rank_ + i);
      UBEP_CHECK_ARG(a.layout == args[0].layout, "dispatch: ranks disagree on the layout");
      UBEP_CHECK_ARG(a.layout == Layout::kThroughput || cfg_.enable_latency_layout,
                     "dispatch: latency layout needs BufferConfig::enable_latency_layout");
    }
    seq_ = next_seq_++;
    if (++gen_ == 0) gen_ = 1;  // rank-local signals: a stale value never equals gen
    layout_ = args[0].layout;
    for (int i = 0; i < local_ranks_; ++i) {
      const DispatchArgs& a = args[static_cast<size_t>(i)];
      cuda_hd::RankIO& io = io_[static_cast<size_t>(i)];
      io.x = a.x.data;
      io.topk_idx = a.topk_idx.as<const int64_t>();
      io.topk_w = a.topk_weights.as<const float>();
      io.tokens = a.x.dim(0);
      io.topk = static_cast<int>(a.topk_idx.dim(1));
      io.comb_in = nullptr;
      topk_[static_cast<size_t>(i)] = io.topk;
    }
    handle_ = seq_ + 1;
    have_dispatch_ = true;
    dispatch_open_ = !(phases & cuda_hd::kRecv);
  } else {
    UBEP_CHECK_ARG(dispatch_open_, "dispatch_recv without dispatch_send");
    dispatch_open_ = false;
  }
  const cuda_hd::LaunchParams p = params(phases);
  if (algorithm == Algorithm::kBsp && (phases & cuda_hd::kSend)) barrier_seq_ += 2;
  launch_dispatch(virtual_, p, local_ranks_ * bpr_, threads_, smem_, s);
}

std::vector<DispatchResult> Engine::results() {
  std::vector<DispatchResult> out;
  for (int i = 0; i < local_ranks_; ++i)
    out.push_back(cuda_host::dispatch_views(
        map_, cfg_, bases_[static_cast<size_t>(first_rank_ + i)], ep::half_of(seq_), layout_,
        topk_[static_cast<size_t>(i)],
        smap_.at<char>(io_[static_cast<size_t>(i)].scratch, smap_.recv_count), handle_));
  return out;
}

TensorView Engine::combine_buffer(int i) const {
  return cuda_host::combine_view(map_, cfg_, bases_[static_cast<size_t>(first_rank_ + i)],
                                 ep::half_of(seq_), layout_);
}

void Engine::combine(std::span<const CombineArgs> args, uint32_t phases, cudaStream_t s) {
  check_error();
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  if (phases & cuda_hd::kCombSend) {
    UBEP_CHECK_ARG(have_dispatch_ && !dispatch_open_ && !combine_open_,
                   "combine: needs a completed dispatch and no outstanding call");
    UBEP_CHECK_ARG(static_cast<int>(args.size()) == local_ranks_, "combine: ", args.size(),
                   " argument sets for ", local_ranks_, " ranks");
    const std::vector<DispatchResult> res = results();
    for (int i = 0; i < local_ranks_; ++i) {
      const CombineArgs& a = args[static_cast<size_t>(i)];
      cuda_host::check_combine(a, cfg_, res[static_cast<size_t>(i)].recv_x, handle_,
                               first_rank_ + i);
      io_[static_cast<size_t>(i)].comb_in = a.x.data;
    }
    have_dispatch_ = false;  // combine at most once per dispatch (see src/ep/ubep.cpp)
    combine_open_ = !(phases & cuda_hd::kCombRecv);
  } else {
    UBEP_CHECK_ARG(combine_open_, "combine_recv without combine_send");
    combine_open_ = false;
  }
  const cuda_hd::LaunchParams p = params(phases);
  if (algorithm == Algorithm::kBsp) barrier_seq_ += 1;
  launch_combine(virtual_, p, local_ranks_ * bpr_, threads_, s);
}

std::vector<TensorView> Engine::outputs() {
  std::vector<TensorView> out;
  for (int i = 0; i < local_ranks_; ++i) {
    const cuda_hd::RankIO& io = io_[static_cast<size_t>(i)];
    TensorView v(io.y, cfg_.dtype, {io.tokens, cfg_.hidden});
    v.device = cfg_.device;
    out.push_back(v);
  }
  return out;
}

int64_t Engine::num_recv_rows(int i, cudaStream_t s) {
  synchronize(s);
  return recv_rows_[i];
}

void Engine::synchronize(cudaStream_t s) {
  check_cuda(cudaStreamSynchronize(s), "stream synchronize");
  check_error();
}

}  // namespace ubep::cuda
