#include "backend/cuda/sequencer.hpp"

#include "backend/cuda/host_logic.hpp"
#include "ubep/error.hpp"

namespace ubep::cuda_host {

Sequencer::Sequencer(const BufferConfig& cfg, int ranks, int first_rank, int local_ranks)
    : cfg_(cfg),
      ranks_(ranks),
      first_(first_rank),
      local_(local_ranks),
      map_(window_layout(cfg, ranks)),
      smap_(scratch_layout(cfg, ranks)),
      io_(static_cast<size_t>(local_ranks)),
      next_seq_(protocol::first_seq_of(cfg.initial_epoch)) {
  check_config(cfg, ranks, local_ranks);
  algorithm = cfg.algorithm;
  sync = cfg.research.sync;
}

void Sequencer::set_rank_memory(int i, char* scratch, void* y) {
  io_[static_cast<size_t>(i)].scratch = scratch;
  io_[static_cast<size_t>(i)].y = y;
}

void Sequencer::set_start_delays(const std::vector<uint32_t>& ns) {
  UBEP_CHECK_ARG(static_cast<int>(ns.size()) == local_, "start delays: ", ns.size(), " values for ",
                 local_, " ranks");
  for (size_t i = 0; i < ns.size(); ++i) io_[i].start_delay_ns = ns[i];
}

cuda_hd::LaunchParams Sequencer::dispatch(std::span<const DispatchArgs> args, uint32_t phases,
                                          const LaunchResources& res, bool ids_on_host) {
  if (phases & cuda_hd::kSend) {
    UBEP_CHECK_ARG(static_cast<int>(args.size()) == local_, "dispatch: ", args.size(),
                   " argument sets for ", local_, " ranks");
    UBEP_CHECK_ARG(!dispatch_open_ && !combine_open_,
                   "dispatch: the previous split-phase call is still outstanding");
    for (int i = 0; i < local_; ++i) {
      const DispatchArgs& a = args[static_cast<size_t>(i)];
      check_dispatch(a, cfg_, first_ + i, ids_on_host);
      UBEP_CHECK_ARG(a.layout == args[0].layout, "dispatch: ranks disagree on the layout");
      UBEP_CHECK_ARG(a.layout == Layout::kThroughput || cfg_.enable_latency_layout,
                     "dispatch: latency layout needs BufferConfig::enable_latency_layout");
    }
    seq_ = next_seq_++;
    if (++gen_ == 0) gen_ = 1;  // rank-local signals: a stale value never equals gen
    layout_ = args[0].layout;
    placement_ = cfg_.placement == Placement::kAuto ? placement_for(layout_) : cfg_.placement;
    for (int i = 0; i < local_; ++i) {
      const DispatchArgs& a = args[static_cast<size_t>(i)];
      cuda_hd::RankIO& io = io_[static_cast<size_t>(i)];
      io.x = a.x.data;
      io.topk_idx = a.topk_idx.as<const int64_t>();
      io.topk_w = a.topk_weights.as<const float>();
      io.tokens = a.x.dim(0);
      io.topk = static_cast<int>(a.topk_idx.dim(1));
      io.comb_in = nullptr;
    }
    have_dispatch_ = true;
    dispatch_open_ = !(phases & cuda_hd::kRecv);
    dispatch_done_ = !dispatch_open_;
  } else {
    UBEP_CHECK_ARG(dispatch_open_, "dispatch_recv without dispatch_send");
    dispatch_open_ = false;
    dispatch_done_ = true;
  }
  const cuda_hd::LaunchParams p = params(phases, res);
  // bsp: the dispatch kernel's send phase meets the group twice (after counts, after rows).
  if (algorithm == Algorithm::kBsp && (phases & cuda_hd::kSend)) barrier_seq_ += 2;
  return p;
}

cuda_hd::LaunchParams Sequencer::combine(std::span<const CombineArgs> args, uint32_t phases,
                                         const LaunchResources& res) {
  if (phases & cuda_hd::kCombSend) {
    UBEP_CHECK_ARG(have_dispatch_ && !dispatch_open_ && !combine_open_,
                   "combine: needs a completed dispatch and no outstanding call");
    UBEP_CHECK_ARG(static_cast<int>(args.size()) == local_, "combine: ", args.size(),
                   " argument sets for ", local_, " ranks");
    const std::vector<DispatchResult> r = results();
    for (int i = 0; i < local_; ++i) {
      const CombineArgs& a = args[static_cast<size_t>(i)];
      check_combine(a, cfg_, r[static_cast<size_t>(i)].recv_x, seq_ + 1, first_ + i);
      // Compacted rows move to other places in the combine window: they cannot come from it.
      UBEP_CHECK_ARG(!a.compacted || a.x.data != combine_buffer(i).data, "combine (rank ",
                     first_ + i, "): compacted input cannot be combine_buffer() itself");
    }
    for (int i = 0; i < local_; ++i) {
      const CombineArgs& a = args[static_cast<size_t>(i)];
      cuda_hd::RankIO& io = io_[static_cast<size_t>(i)];
      io.comb_in = a.x.data;
      io.comb_in_compacted = a.compacted;
      io.comb_in_rows = a.compacted ? a.x.dim(0) : 0;
    }
    have_dispatch_ = false;  // combine at most once per dispatch (see src/ep/ubep.cpp)
    combine_open_ = !(phases & cuda_hd::kCombRecv);
  } else {
    UBEP_CHECK_ARG(combine_open_, "combine_recv without combine_send");
    combine_open_ = false;
  }
  const cuda_hd::LaunchParams p = params(phases, res);
  if (algorithm == Algorithm::kBsp) barrier_seq_ += 1;  // every combine launch meets once
  return p;
}

cuda_hd::LaunchParams Sequencer::params(uint32_t phases, const LaunchResources& res) const {
  cuda_hd::LaunchParams p;
  p.map = map_;
  p.scratch = smap_;
  p.bases = res.bases;
  p.ranks = ranks_;
  p.first_rank = first_;
  p.local_ranks = local_;
  p.experts = cfg_.num_experts;
  p.local_experts = cfg_.num_experts / ranks_;
  p.blocks_per_rank = res.blocks_per_rank;
  p.hidden = cfg_.hidden;
  p.elem_bytes = static_cast<int>(dtype_size(cfg_.dtype));
  p.phases = phases;
  p.tag = protocol::tag_of(seq_);
  p.half = protocol::half_of(seq_);
  p.gen = gen_;
  p.barrier_seq = barrier_seq_;
  p.latency = layout_ == Layout::kLatency;
  p.per_source = placement_ == Placement::kPerSource;
  p.stop_and_wait = sync == SyncMode::kStopAndWait;
  p.bsp = algorithm == Algorithm::kBsp;
  p.timeout_cycles = res.timeout_cycles;
  p.error = res.error;
  p.host_recv_rows = res.host_recv_rows;
  for (int i = 0; i < local_; ++i) p.io[i] = io_[static_cast<size_t>(i)];
  return p;
}

std::vector<DispatchResult> Sequencer::results() const {
  std::vector<DispatchResult> out;
  for (int i = 0; i < local_; ++i) {
    const cuda_hd::RankIO& io = io_[static_cast<size_t>(i)];
    out.push_back(dispatch_views(map_, cfg_, bases_[static_cast<size_t>(first_ + i)],
                                 protocol::half_of(seq_), layout_, placement_, io.topk,
                                 smap_.at<char>(io.scratch, smap_.recv_count),
                                 smap_.at<char>(io.scratch, smap_.recv_range), seq_ + 1));
  }
  return out;
}

cuda_hd::LaunchParams Sequencer::compact(const LaunchResources& res) {
  // After combine too: the dispatch's rows stay in the window until the next dispatch.
  UBEP_CHECK_ARG(dispatch_done_ && !dispatch_open_ && !combine_open_,
                 "compact: needs a completed dispatch (after dispatch_recv)");
  UBEP_CHECK_ARG(has_compact_memory(), "compact: no output memory (internal error)");
  return params(cuda_hd::kCompact, res);
}

void Sequencer::set_compact_memory(int i, void* out) {
  io_[static_cast<size_t>(i)].compact_out = out;
}

int64_t Sequencer::compact_capacity() const {
  return layout_ == Layout::kLatency ? map_.lat_rows() : map_.tp_rows();
}

std::vector<TensorView> Sequencer::compacted() const {
  std::vector<TensorView> out;
  for (const cuda_hd::RankIO& io : io_) {
    TensorView v(io.compact_out, cfg_.dtype, {compact_capacity(), cfg_.hidden});
    v.device = cfg_.device;
    out.push_back(v);
  }
  return out;
}

TensorView Sequencer::combine_buffer(int i) const {
  return combine_view(map_, cfg_, bases_[static_cast<size_t>(first_ + i)], protocol::half_of(seq_),
                      layout_);
}

std::vector<TensorView> Sequencer::outputs() const {
  std::vector<TensorView> out;
  for (const cuda_hd::RankIO& io : io_) {
    TensorView v(io.y, cfg_.dtype, {io.tokens, cfg_.hidden});
    v.device = cfg_.device;
    out.push_back(v);
  }
  return out;
}

}  // namespace ubep::cuda_host
