// The tile-level overlap executor (see include/ubep/moe.hpp for what it computes).
//
// Every row that crosses into a window and every tag goes through a backend::DataPath
// (backend::make_data_path: put_row, publish = release store, arrived/load = acquire load),
// whose role team (run_roles) runs the compute, communication and reduce members. Epochs come
// from protocol::CallSequence, the Window's own: one sequence number per run(), its parity
// picks the half, tag_of(seq) its tag, and the sequence starts at first_seq_of(initial_epoch)
// so the 64-bit counter never wraps (fuzz finding F7; at the wrap tag_of(2^64-1) == tag_of(0),
// and the per-tile ready tags below, which are not double-buffered, would then take the
// previous call's tags for this call's: ExpertLayerEpochs.* fails without the guard).
//
// Concurrency argument (who writes what, who reads it, and what orders the two):
//
//  1. Tile outputs, inside one rank. A compute worker writes a tile's rows of `out_` with plain
//     stores, then publish()es the tile's ready tag (release) with the call's epoch tag, then
//     bumps `published` (release) and notifies. (The compute member streams no rows, so the
//     data path stores that tag at once, never holding it back past the counter.) A
//     communication worker reads the rows only after arrived() (acquire) saw that tag on that
//     tile, so the rows happen-before its reads. Tags are never cleared: a tile's stale value
//     is the tag of an earlier call, which differs from the current one (CallSequence:
//     consecutive calls differ, and so do any two within 2^32-1 calls), and tile indices are
//     rebuilt per call before run_roles starts the members (its contract: the caller's writes
//     before the call, every member's writes before its return), so every worker sees the new
//     plan. Lost wake-ups are impossible: a communication worker reads `published` *before* it
//     scans the tags and sleeps only if the counter still has that value; a tile published
//     after the scan bumped the counter after its tag.
//  2. Records in an owner's shared window (data-as-flag, src/protocol/protocol.hpp). A shipper
//     put_row()s a record's row (plain stores) and then publishes the record's tag (release);
//     the owner reads the row after arrived() (acquire) saw the current tag. Each (token, k)
//     slot has exactly one writer per call: the rank owning expert topk_idx[t][k], and within it
//     the one worker that ships the tile holding that row.
//  3. Reuse across calls. Records are double-buffered by call parity. A shipper writing half
//     h = seq&1 of owner O in call seq could only clobber O's call seq-2, so before its first
//     write to O in a call it waits (load, acquire) until O's `released` word, which O
//     publishes (release) after its reduction of call n has read every record, says call
//     seq-2 is done. The word counts calls modulo 2^32 and is compared with wrapping
//     arithmetic (ranks are never 2^31 calls apart). That is a point-to-point wait on one
//     peer, not a barrier, and it almost never waits: O finished seq-2 long ago unless it is a
//     full call behind. Everything else (plan, in_/out_ buffers, staging rows, ready tags) is
//     private to the rank and only touched inside run_roles, whose return orders one run's
//     writes before the next.
#include <tuple>

#include "moe/expert_layer_impl.hpp"

namespace ubep::moe {

const char* schedule_name(Schedule s) { return s == Schedule::kSerial ? "serial" : "overlapped"; }
Schedule parse_schedule(const std::string& n) {
  if (n == "serial") return Schedule::kSerial;
  if (n == "overlapped") return Schedule::kOverlapped;
  throw InvalidArgument("unknown schedule '" + n + "' (expected serial or overlapped)");
}

ExpertLayer::ExpertLayer(Group& group, ExpertLayerConfig config)
    : impl_(std::make_unique<Impl>(group, config)) {}
ExpertLayer::~ExpertLayer() = default;

const ExpertLayerConfig& ExpertLayer::config() const { return impl_->cfg; }
const LayerStats& ExpertLayer::last_stats() const { return impl_->stats; }
int ExpertLayer::num_local_experts() const { return impl_->local_experts; }
size_t ExpertLayer::shared_bytes() const { return impl_->window->bytes(); }
void ExpertLayer::set_ship_delay_hook(std::function<void(int, int64_t)> hook) {
  impl_->ship_hook = std::move(hook);
}
void ExpertLayer::set_compute_delay_hook(std::function<void(int)> hook) {
  impl_->compute_hook = std::move(hook);
}

namespace {

// Validates a run()'s inputs before anything touches shared memory, so bad input leaves the
// group usable.
void check_run_args(const ExpertLayer::Impl& m, const DispatchResult& d, const TensorView& topk_idx,
                    const TensorView& topk_weights, const TileFn& tile) {
  UBEP_CHECK_ARG(d.layout == Layout::kThroughput,
                 "ExpertLayer::run: needs a throughput-layout dispatch, got ",
                 layout_name(d.layout));
  UBEP_CHECK_ARG(d.recv_x.dtype == m.cfg.dtype, "ExpertLayer::run: recv_x dtype ",
                 dtype_name(d.recv_x.dtype), " differs from the layer's ", dtype_name(m.cfg.dtype));
  UBEP_CHECK_ARG(d.num_recv_rows == 0 || (d.recv_x.ndim == 2 && d.recv_x.dim(1) == m.H),
                 "ExpertLayer::run: recv_x must be [rows, ", m.H, "], got ", d.recv_x.describe());
  UBEP_CHECK_ARG(d.num_recv_rows <= static_cast<int64_t>(m.ranks) * m.T,
                 "ExpertLayer::run: ", d.num_recv_rows,
                 " dispatched rows exceed ranks * max_tokens_per_rank = ", m.ranks * m.T);
  UBEP_CHECK_ARG(d.num_recv_rows == 0 ||
                     (d.recv_topk_idx.dtype == DType::kInt32 && d.recv_topk_idx.ndim == 2 &&
                      d.recv_topk_idx.dim(1) <= m.cfg.max_topk),
                 "ExpertLayer::run: recv_topk_idx must be int32 [rows, k <= ", m.cfg.max_topk,
                 "], got ", d.recv_topk_idx.describe());
  UBEP_CHECK_ARG(topk_idx.dtype == DType::kInt64 && topk_idx.ndim == 2,
                 "ExpertLayer::run: topk_idx must be int64 "
                 "[tokens, k], got ",
                 topk_idx.describe());
  const int64_t tokens = topk_idx.dim(0);
  const int K = static_cast<int>(topk_idx.dim(1));
  UBEP_CHECK_ARG(tokens <= m.T, "ExpertLayer::run: ", tokens, " tokens exceed max_tokens_per_rank ",
                 m.T);
  UBEP_CHECK_ARG(K >= 1 && K <= m.cfg.max_topk, "ExpertLayer::run: topk ", K,
                 " outside [1, max_topk=", m.cfg.max_topk, "]");
  UBEP_CHECK_ARG(topk_weights.dtype == DType::kFP32 && topk_weights.ndim == 2 &&
                     topk_weights.dim(0) == tokens && topk_weights.dim(1) == K,
                 "ExpertLayer::run: topk_weights must be fp32 [", tokens, ", ", K, "], got ",
                 topk_weights.describe());
  // Every pointer the call reads, before any is read.
  const bool rows = d.num_recv_rows > 0;
  for (const auto& [name, view, needed] :
       {std::tuple{"recv_x", &d.recv_x, rows}, std::tuple{"recv_src", &d.recv_src, rows},
        std::tuple{"recv_topk_idx", &d.recv_topk_idx, rows},
        std::tuple{"recv_range", &d.recv_range, d.placement == Placement::kPerSource},
        std::tuple{"topk_idx", &topk_idx, tokens * K > 0},
        std::tuple{"topk_weights", &topk_weights, tokens * K > 0}})
    UBEP_CHECK_ARG(!needed || view->data != nullptr, "ExpertLayer::run: ", name, " has no data");
  const auto* idx = topk_idx.as<const int64_t>();
  for (int64_t i = 0; i < tokens * K; ++i)
    UBEP_CHECK_ARG(idx[i] >= -1 && idx[i] < m.cfg.num_experts, "ExpertLayer::run: expert id ",
                   idx[i], " at token ", i / K, ", k ", i % K, " is outside [-1, ",
                   m.cfg.num_experts, ")");
  UBEP_CHECK_ARG(static_cast<bool>(tile), "ExpertLayer::run: empty tile function");
}

// The compute and communication members of one call, overlapped or one phase after the other;
// then their times into m.stats.
void run_compute_and_ship(ExpertLayer::Impl& m, Schedule schedule, Clock::time_point start) {
  const int C = m.cfg.compute_workers, M = m.cfg.comm_workers, all = C + M;
  if (schedule == Schedule::kOverlapped) {
    m.dp->run_roles([&](int i) {
      if (i < C)
        m.compute_role(i, true);
      else
        m.comm_role(i, C, M, true);
    });
    double fin = 0;
    for (int i = 0; i < C; ++i) fin = std::max(fin, m.mstats[static_cast<size_t>(i)].finish);
    m.stats.compute_phase_us = fin;
  } else {
    // Compute phase on the compute workers only (the communication workers wait, as a serial
    // "GEMM, then all-to-all" program would), then every member ships.
    m.dp->run_roles([&](int i) {
      if (i < C) m.compute_role(i, false);
    });
    m.stats.compute_phase_us = us_since(start);
    const auto s0 = Clock::now();
    m.dp->run_roles([&](int i) { m.comm_role(i, 0, all, false); });
    m.stats.ship_phase_us = us_since(s0);
  }
  for (auto& s : m.mstats) {
    m.stats.compute_us += s.compute;
    m.stats.gather_us += s.gather;
    m.stats.copy_us += s.copy;
    m.stats.comm_idle_us += s.idle;
    m.stats.segments += s.segments;
    s.idle = 0;
  }
}

}  // namespace

TensorView ExpertLayer::run(const DispatchResult& d, const TensorView& topk_idx,
                            const TensorView& topk_weights, const TileFn& tile, Schedule schedule) {
  Impl& m = *impl_;
  const auto start = Clock::now();
  check_run_args(m, d, topk_idx, topk_weights, tile);
  const int64_t tokens = topk_idx.dim(0);
  const int K = static_cast<int>(topk_idx.dim(1));
  const auto* idx = topk_idx.as<const int64_t>();

  // The call's epoch, as the Window takes it (protocol::CallSequence, F7's guard included):
  // only after validation, so a rejected call leaves the sequence where it was.
  m.epochs.begin_call();
  m.plan(d);
  m.recv_x = static_cast<const char*>(d.recv_x.data);
  m.current_tile_fn = &tile;
  m.next_tile.store(0, std::memory_order_relaxed);
  m.abort.store(false, std::memory_order_relaxed);
  for (auto& s : m.mstats) s = MemberStats{};
  run_compute_and_ship(m, schedule, start);

  const auto r0 = Clock::now();
  const auto* w = topk_weights.as<const float>();
  const int all = m.cfg.compute_workers + m.cfg.comm_workers;
  m.dp->run_roles([&](int i) { m.reduce(tokens, K, idx, w, i, all); });
  // Every member's reads of this call's records happened before run() returned: let senders
  // reuse this half two calls from now.
  m.dp->publish(m.released(m.rank), static_cast<uint32_t>(m.calls + 1));
  m.stats.reduce_us = us_since(r0);
  for (auto& s : m.mstats) m.stats.reduce_wait_us += s.idle;
  ++m.calls;
  m.stats.total_us = us_since(start);
  return TensorView(m.y.get(), m.cfg.dtype, {tokens, m.H});
}

void ExpertLayer::last_outputs_latency(void* out, int64_t slots) const {
  const Impl& m = *impl_;
  char* o = static_cast<char*>(out);
  std::memset(o, 0, static_cast<size_t>(m.local_experts * slots * m.H) * m.es);
  for (int e = 0; e < m.local_experts; ++e) {
    const auto& rows = m.expert_rows[static_cast<size_t>(e)];
    UBEP_CHECK_ARG(static_cast<int64_t>(rows.size()) <= slots, "last_outputs_latency: expert ", e,
                   " has ", rows.size(), " rows, more than ", slots, " slots");
    for (size_t j = 0; j < rows.size(); ++j) {
      const float* v = m.out_.get<float>() + rows[j] * m.H;
      char* dst = o + static_cast<size_t>((e * slots + static_cast<int64_t>(j)) * m.H) * m.es;
      if (m.cfg.dtype == DType::kBF16) {
        auto* b = reinterpret_cast<uint16_t*>(dst);
        for (int64_t h = 0; h < m.H; ++h) b[h] = float_to_bf16(v[h]);
      } else {
        std::memcpy(dst, v, static_cast<size_t>(m.H) * 4);
      }
    }
  }
}

}  // namespace ubep::moe
