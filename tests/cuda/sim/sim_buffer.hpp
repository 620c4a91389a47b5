// SimBuffer: the CUDA engine (src/backend/cuda/engine.cu) without the CUDA runtime, for
// test_cuda_sim.cpp: the engine's own Sequencer builds every launch, memory is host memory, and
// the kernels (dispatch.cuh / combine.cuh, compiled against cuda_host_sim.hpp) run on simulated
// threads -- virtual ranks in one launch, IPC ranks as concurrent launches.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "backend/cuda/combine.cuh"
#include "backend/cuda/host_logic.hpp"
#include "backend/cuda/sequencer.hpp"
#include "cuda/gpu_support.hpp"

namespace ubep {

// The engine (src/backend/cuda/engine.cu) without the CUDA runtime: the same Sequencer builds
// every launch's parameters (virtual ranks: one for all ranks; IPC: one per "process"), the
// memory is host memory, and the launches run on simulated threads.
class SimBuffer {
 public:
  SimBuffer(int R, const BufferConfig& cfg, bool ipc, int bpr = 2, int threads = 64)
      : R_(R),
        cfg_(cfg),
        ipc_(ipc),
        bpr_(bpr),
        threads_(threads),
        map_(cuda_host::window_layout(cfg, R)),
        smap_(cuda_host::scratch_layout(cfg, R)),
        windows_(static_cast<size_t>(R) * map_.total),
        scratch_(static_cast<size_t>(R) * smap_.total),
        y_(static_cast<size_t>(R * cfg.max_tokens_per_rank) * map_.row_bytes),
        recv_rows_(static_cast<size_t>(R), -1),
        errors_(static_cast<size_t>(R)),
        claims_(static_cast<size_t>(R), 0u) {
    for (int r = 0; r < R; ++r)
      bases_.push_back(static_cast<char*>(windows_.p) + static_cast<size_t>(r) * map_.total);
    const int procs = ipc ? R : 1, local = ipc ? 1 : R;
    for (int q = 0; q < procs; ++q) {
      seqs_.push_back(std::make_unique<cuda_host::Sequencer>(cfg, R, q, local));
      for (int i = 0; i < local; ++i) {
        const size_t r = static_cast<size_t>(q + i);
        seqs_.back()->set_rank_memory(
            i, static_cast<char*>(scratch_.p) + r * smap_.total,
            static_cast<char*>(y_.p) +
                r * static_cast<size_t>(cfg.max_tokens_per_rank) * map_.row_bytes);
      }
      seqs_.back()->set_bases(bases_);
    }
  }
  long long timeout_ns = 20'000'000'000LL;  // clock64 counts ns in the simulation
  void set_algorithm(Algorithm a) {
    for (auto& q : seqs_) q->algorithm = a;
  }
  void set_sync(SyncMode m) {
    for (auto& q : seqs_) q->sync = m;
  }
  void set_start_delay(int r, uint32_t ns) {
    delays_.resize(static_cast<size_t>(R_));
    delays_[static_cast<size_t>(r)] = ns;
  }

  void dispatch(std::span<const DispatchArgs> args, uint32_t phases) {
    run(args, {}, phases, true);
  }
  // compact() as the engine does it: output memory on first use, a dispatch-kernel launch.
  std::vector<TensorView> compact() {
    if (!compact_) {
      compact_ = std::make_unique<gpu_test::DevMem>(static_cast<size_t>(R_ * map_.comb_rows()) *
                                                    map_.row_bytes);
      for (size_t q = 0; q < seqs_.size(); ++q)
        for (int i = 0; i < seqs_[q]->local_ranks(); ++i)
          seqs_[q]->set_compact_memory(
              i, static_cast<char*>(compact_->p) + (q + static_cast<size_t>(i)) *
                                                       static_cast<size_t>(map_.comb_rows()) *
                                                       map_.row_bytes);
    }
    run({}, {}, cuda_hd::kCompact, true);
    return gather(&cuda_host::Sequencer::compacted);
  }
  void combine(std::span<const CombineArgs> args, uint32_t phases) { run({}, args, phases, false); }
  template <typename T>
  std::vector<T> gather(std::vector<T> (cuda_host::Sequencer::*fn)() const) const {
    std::vector<T> out;
    for (const auto& q : seqs_)
      for (auto& v : ((*q).*fn)()) out.push_back(v);
    return out;
  }
  std::vector<DispatchResult> results() const { return gather(&cuda_host::Sequencer::results); }
  std::vector<TensorView> outputs() const { return gather(&cuda_host::Sequencer::outputs); }
  TensorView combine_buffer(int r) const {
    return ipc_ ? seqs_[static_cast<size_t>(r)]->combine_buffer(0) : seqs_[0]->combine_buffer(r);
  }
  TensorView output(int r) const { return outputs()[static_cast<size_t>(r)]; }
  // IPC: called on process q's thread as soon as its launch has returned.
  std::function<void(size_t)> after_launch;
  // The tag word of the count record from `src` in rank `at`'s window (half h).
  const uint32_t* count_tag(int at, int src, int h) const {
    return map_.count(bases_[static_cast<size_t>(at)], h, src).tag();
  }
  int64_t num_recv_rows(int r) const { return recv_rows_[static_cast<size_t>(r)]; }
  void check_error() const {
    for (const auto& e : errors_)
      cuda_host::throw_if_error(e, static_cast<double>(timeout_ns) * 1e-9);
  }

 private:
  void run(std::span<const DispatchArgs> dargs, std::span<const CombineArgs> cargs, uint32_t phases,
           bool dispatch) {
    const size_t smem =
        cuda_host::dispatch_smem(threads_ / 32, cfg_.max_topk, cfg_.num_experts / R_);
    std::vector<cuda_hd::LaunchParams> ps;
    for (size_t q = 0; q < seqs_.size(); ++q) {
      if (!delays_.empty()) {
        std::vector<uint32_t> d(delays_.begin() + static_cast<long>(ipc_ ? q : 0),
                                delays_.begin() + static_cast<long>(ipc_ ? q + 1 : delays_.size()));
        seqs_[q]->set_start_delays(d);
      }
      cuda_host::LaunchResources res;
      res.bases = bases_.data();
      res.blocks_per_rank = bpr_;
      res.timeout_cycles = timeout_ns;
      res.error = {&errors_[q], &claims_[q]};
      res.host_recv_rows = recv_rows_.data() + q;
      const size_t n = ipc_ ? 1 : static_cast<size_t>(R_);
      if (phases == cuda_hd::kCompact)
        ps.push_back(seqs_[q]->compact(res));
      else
        ps.push_back(dispatch
                         ? seqs_[q]->dispatch(
                               dargs.empty() ? dargs : dargs.subspan(ipc_ ? q : 0, n), phases, res)
                         : seqs_[q]->combine(cargs.empty() ? cargs : cargs.subspan(ipc_ ? q : 0, n),
                                             phases, res));
    }
    auto go = [&](const cuda_hd::LaunchParams& p, int grid) {
      if (ipc_) {
        if (dispatch)
          sim::launch(&cuda_dev::dispatch_kernel<cuda_dev::IpcPeers>, p, grid, threads_, smem);
        else
          sim::launch(&cuda_dev::combine_kernel<cuda_dev::IpcPeers>, p, grid, threads_, 0);
      } else if (dispatch) {
        sim::launch(&cuda_dev::dispatch_kernel<cuda_dev::VirtualPeers>, p, grid, threads_, smem);
      } else {
        sim::launch(&cuda_dev::combine_kernel<cuda_dev::VirtualPeers>, p, grid, threads_, 0);
      }
    };
    if (!ipc_) {
      go(ps[0], R_ * bpr_);
    } else {  // one "process" per rank, concurrently
      std::vector<std::thread> procs;
      for (size_t q = 0; q < ps.size(); ++q)
        procs.emplace_back([&, q] {
          go(ps[q], bpr_);
          if (after_launch) after_launch(q);
        });
      for (auto& t : procs) t.join();
    }
  }

  int R_;
  BufferConfig cfg_;
  bool ipc_;
  int bpr_, threads_;
  protocol::WindowLayout map_;
  cuda_hd::ScratchLayout smap_;
  gpu_test::DevMem windows_, scratch_, y_;
  std::vector<char*> bases_;
  std::vector<int64_t> recv_rows_;
  std::vector<cuda_hd::ErrorInfo> errors_;
  std::vector<uint32_t> claims_;
  std::vector<uint32_t> delays_;
  std::vector<std::unique_ptr<cuda_host::Sequencer>> seqs_;
  std::unique_ptr<gpu_test::DevMem> compact_;
};

}  // namespace ubep
