// ep::HostEngine: Buffer's calls as host roles over a backend::DataPath (the CPU backend).
#include "ep/host_engine.hpp"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "core/log.hpp"
#include "ep/algo_context.hpp"
#include "bootstrap/death_watch.hpp"
#include "ep/config_agreement.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

namespace {
std::unique_ptr<HostRelay> make_relay(Group& g, const BufferConfig& cfg, Window& win,
                                      CallState& call) {
  if (g.num_hosts() == 1) return nullptr;
  UBEP_CHECK_ARG(g.remote() != nullptr, "Buffer: the group spans ", g.num_hosts(),
                 " hosts but has no transport between them");
  return std::make_unique<HostRelay>(g, cfg, win, call);
}
}  // namespace

HostEngine::HostEngine(Group& g, const BufferConfig& c,
                       std::unique_ptr<backend::DataPath> data_path)
    : grp(g),
      cfg(c),  // agreed across the group by Buffer (agree_on_config)
      cdtype(combine_dtype(cfg)),
      rank(g.rank()),
      ranks(g.size()),
      local_experts(cfg.num_experts / g.size()),
      T(cfg.max_tokens_per_rank),
      dp(std::move(data_path)),
      win(g,
          protocol::WindowLayout(protocol::row_codec(cfg.dtype, cfg.hidden),
                                 static_cast<size_t>(cfg.hidden) * dtype_size(cdtype), g.size(),
                                 cfg.num_experts / g.size(), cfg.max_topk, cfg.max_tokens_per_rank,
                                 cfg.enable_latency_layout),
          *dp, cfg.initial_epoch),
      call(g.rank(), cfg, g.size()),
      ledger(
          g.rank(), g.size(),
          [this](int r) { return win.peer(r) && !call.masked(r) ? win.failure_of(r) : 0u; },
          [this](uint32_t word) { win.publish_failure(rank, word); }),
      members(g, win),
      watch(win, members, g.rank()),
      relay(make_relay(g, cfg, win, call)),
      waiter(g, watch, relay.get()),
      reducer(g, cfg, *dp, win, call, waiter, relay.get()) {
  win.set_sync(cfg.research.sync);
  // Virtual until touched (MAP_NORESERVE): costs nothing unless compact() is used.
  const auto most_rows = static_cast<size_t>(win.map().comb_rows());
  compacted = LocalArray(most_rows * codec().payload_bytes);
  if (codec().scale_bytes) {
    compacted_scales = LocalArray(most_rows * codec().scale_bytes);
    cast_x = LocalArray(static_cast<size_t>(T) * codec().payload_bytes);
    cast_scales = LocalArray(static_cast<size_t>(T) * codec().scale_bytes);
  }
  stats.stage_us.reserve(16);
  // A host-mate's process that dies publishes nothing, so this rank writes its failure word on
  // its behalf, into its own window (the dead rank wrote its slot last; nobody else writes it):
  // every wait of this buffer polls that word, so a call waiting on the dead rank ends within
  // a poll of the death (the watch thread's store, the waiter's acquire load).
  if (bootstrap::DeathWatch* deaths = g.death_watch())
    death_subscription =
        deaths->subscribe([this](int r) {
          // A rank that departed cleanly (its Buffer's destructor published a break after its
          // last call) keeps that word: peers still finishing that call have its part.
          if (!protocol::is_broken(win.failure_of(r))) win.set_failure_of(r, protocol::kDeadWord);
        });
  if (bootstrap::DeathWatch* deaths = g.death_watch())  // dead before this buffer was made
    for (int r = 0; r < ranks; ++r)
      if (r != rank && deaths->dead(r) && !protocol::is_broken(win.failure_of(r)))
        win.set_failure_of(r, protocol::kDeadWord);
  const AlgoContext ctx{grp, cfg, *dp, win, call, waiter, reducer, relay.get(), stats};
  bsp = make_bsp(ctx);
  ubep = make_ubep(ctx);
  log::info("rank ", rank, ": buffer with ", win.bytes(), " shared bytes, ", cfg.num_workers,
            " workers, algorithm ", algorithm_name(cfg.algorithm));
}

DispatchResult HostEngine::result() const {
  DispatchResult r;
  const Layout layout = call.layout;
  const int64_t num_recv_rows = call.num_recv_rows;
  const protocol::WindowLayout& m = win.map();
  r.layout = layout;
  r.handle = dispatch_seq;
  const int64_t K = call.routing.topk;
  const auto scales = static_cast<int64_t>(codec().scale_bytes / sizeof(float));
  r.recv_count = TensorView(call.recv_count.get(), DType::kInt64, {local_experts});
  r.placement = call.placement;
  if (layout == Layout::kThroughput) {
    const int64_t span = call.tp_span();
    r.num_recv_rows = num_recv_rows;
    r.recv_x = TensorView(win.at<char>(rank, m.tp_x), cfg.dtype, {span, cfg.hidden});
    if (scales)
      r.recv_x_scales = TensorView(win.at<char>(rank, m.tp_scale), DType::kFP32, {span, scales});
    r.recv_topk_idx = TensorView(win.at<char>(rank, m.tp_idx), DType::kInt32, {span, K});
    r.recv_topk_weights = TensorView(win.at<char>(rank, m.tp_w), DType::kFP32, {span, K});
    r.recv_src = TensorView(win.at<char>(rank, m.tp_src), DType::kInt64, {span, 2});
    r.recv_range = TensorView(call.recv_range.get(), DType::kInt64, {ranks, 2});
  } else {
    r.recv_range = TensorView(call.recv_range.get(), DType::kInt64, {local_experts, ranks, 2});
    r.recv_x =
        TensorView(win.at<char>(rank, m.lat_x), cfg.dtype, {local_experts, RT(), cfg.hidden});
    if (scales)
      r.recv_x_scales =
          TensorView(win.at<char>(rank, m.lat_scale), DType::kFP32, {local_experts, RT(), scales});
    r.recv_src = TensorView(win.at<char>(rank, m.lat_src), DType::kInt64, {local_experts, RT(), 2});
  }
  return r;
}

TensorView HostEngine::combine_input_view() const {
  char* base = win.at<char>(rank, win.map().comb_x);
  if (call.layout == Layout::kThroughput)
    return TensorView(base, cdtype, {call.tp_span(), cfg.hidden});
  return TensorView(base, cdtype, {local_experts, RT(), cfg.hidden});
}

TensorView HostEngine::y_view() const {
  return TensorView(reducer.y(), cdtype, {call.routing.num_tokens, cfg.hidden});
}

void HostEngine::begin_dispatch(const DispatchArgs& a) {
  UBEP_CHECK_ARG(phase == Phase::kIdle,
                 "dispatch: a split-phase call is still outstanding on this buffer");
  UBEP_CHECK_ARG(a.layout == Layout::kThroughput || cfg.enable_latency_layout,
                 "dispatch: latency layout requested but the buffer was created with "
                 "enable_latency_layout=false");
  call.begin(a, cfg, codec().row_bytes());  // validates: throws before anything is sent
  set_dispatch_source(a);
  dispatch_seq = win.begin_call();
  have_dispatch = true;
  compacted_rows = -1;
  combined = false;
  weights_kept = false;
}

void HostEngine::check_combine(const CombineArgs& a) const {
  UBEP_CHECK_ARG(phase == Phase::kIdle,
                 "combine: a split-phase call is still outstanding on this buffer");
  UBEP_CHECK_ARG(have_dispatch, "combine: no dispatch on this buffer yet");
  UBEP_CHECK_ARG(!combined || !multi_host(), "combine: dispatch ", dispatch_seq,
                 " was already combined; a repeated combine of one dispatch needs the group on "
                 "one host, this one spans ", grp.num_hosts());
  UBEP_CHECK_ARG(a.handle == dispatch_seq, "combine: handle ", a.handle,
                 " does not belong to the last dispatch on this buffer (", dispatch_seq, ")");
  UBEP_CHECK_ARG(a.x.dtype == cdtype, "combine: x dtype ", dtype_name(a.x.dtype),
                 " does not match the buffer's combine dtype ", dtype_name(cdtype),
                 cfg.dtype == DType::kFP8E4M3 ? " (fp8 buffers combine in bf16)" : "");
  if (a.compacted || call.layout == Layout::kThroughput) {
    const int64_t rows = a.compacted ? call.num_recv_rows : call.tp_span();
    UBEP_CHECK_ARG(a.x.ndim == 2 && a.x.dim(0) == rows && a.x.dim(1) == cfg.hidden,
                   "combine: x must be [", rows, ", ", cfg.hidden, "] (",
                   a.compacted ? "the rows in compact() order"
                   : call.placement == Placement::kPerSource
                       ? "shaped like recv_x: per-source placement"
                       : "one row per received row",
                   "), got ", a.x.describe());
  } else {
    UBEP_CHECK_ARG(a.x.ndim == 3 && a.x.dim(0) == local_experts && a.x.dim(1) == RT() &&
                       a.x.dim(2) == cfg.hidden,
                   "combine: x must be [", local_experts, ", ", RT(), ", ", cfg.hidden,
                   "] (latency layout), got ", a.x.describe());
  }
  UBEP_CHECK_ARG(a.x.data != nullptr || a.x.numel() == 0, "combine: x has no data");
  if (a.out.ndim != 0)
    UBEP_CHECK_ARG(a.out.ndim == 2 && a.out.dtype == cdtype &&
                       a.out.dim(0) == call.routing.num_tokens && a.out.dim(1) == cfg.hidden &&
                       a.out.device == cfg.device && (a.out.data || a.out.numel() == 0),
                   "combine: out must be ", dtype_name(cdtype), " [", call.routing.num_tokens,
                   ", ", cfg.hidden, "] on ", cfg.device.describe(), ", got ", a.out.describe());
  UBEP_CHECK_ARG(a.x.device == cfg.device, "combine: x is on ", a.x.device.describe(),
                 ", the buffer on ", cfg.device.describe());
  if (a.topk_weights.ndim != 0) {
    const TensorView& w = a.topk_weights;
    const ep::Routing& routing = call.routing;
    UBEP_CHECK_ARG(call.layout == Layout::kLatency,
                   "combine: topk_weights can only replace the dispatch's in the latency layout");
    UBEP_CHECK_ARG(!multi_host(), "combine: topk_weights cannot be replaced across hosts");
    UBEP_CHECK_ARG(w.device.type == DeviceType::kCpu,
                   "combine: topk_weights must be in host memory, got ", w.device.describe());
    UBEP_CHECK_ARG(w.ndim == 2 && w.dtype == DType::kFP32 && w.dim(0) == routing.num_tokens &&
                       w.dim(1) == routing.topk && (w.data != nullptr || w.numel() == 0),
                   "combine: topk_weights must be fp32 [", routing.num_tokens, ", ", routing.topk,
                   "] like the dispatch's topk_idx, got ", w.describe());
  }
}

void HostEngine::set_combine_weights(const CombineArgs& a) {
  reducer.set_out(a.out.ndim != 0 ? static_cast<char*>(a.out.data) : nullptr);
  std::vector<float>& w = call.routing.topk_weights;
  if (a.topk_weights.ndim == 0) {
    if (weights_kept) std::copy(dispatch_weights.begin(), dispatch_weights.end(), w.begin());
    return;
  }
  if (!weights_kept) {
    dispatch_weights.assign(w.begin(), w.end());
    weights_kept = true;
  }
  if (a.topk_weights.numel() > 0)  // no tokens: data may be null
    std::memcpy(w.data(), a.topk_weights.data, a.topk_weights.bytes());
}

// ---------------------------------------------------------------------------------------------

HostEngine::~HostEngine() {
  if (death_subscription >= 0) grp.death_watch()->unsubscribe(death_subscription);
  // Departure (CallLedger::depart says which call the word names). The peers' windows stay
  // valid for this store: thread windows are shared by the group, process windows stay mapped
  // by every rank until its own Buffer goes.
  ledger.depart(phase == Phase::kIdle);
}

namespace {
void report_topk_mismatch(HostEngine& b) {
  // A mismatched dispatch completed on every rank but its output means nothing: no combine.
  if (b.call.shape_mismatch() >= 0 || b.call.topk_mismatch() >= 0) b.have_dispatch = false;
  const int shape = b.call.shape_mismatch();
  UBEP_CHECK_ARG(shape < 0, "dispatch: rank ", shape,
                 " made a different call (layout or placement) than rank ", b.rank, " (",
                 layout_name(b.call.layout), ", ", placement_name(b.call.placement), ")");
  const int other = b.call.topk_mismatch();
  UBEP_CHECK_ARG(other < 0, "dispatch: rank ", other, " used a different topk than rank ", b.rank,
                 " (", b.call.routing.topk, ")");
}

// Barriers the call made, and bytes it moved between hosts, into last_stats().
class CallScope {
 public:
  explicit CallScope(HostEngine& b) : b_(b), barriers0_(barriers()) {}
  ~CallScope() {
    b_.stats.barriers = barriers() - barriers0_;
    b_.stats.network_bytes = b_.relay ? b_.relay->network_bytes() : 0;
    b_.stats.network_rows = b_.relay ? b_.relay->network_rows() : 0;
  }

 private:
  // Only bsp makes barriers through the window; ubep makes none.
  uint64_t barriers() const {
    return b_.grp.barrier_count() + b_.bsp->window_barriers() + b_.repeat_barriers;
  }

  HostEngine& b_;
  uint64_t barriers0_;
};
}  // namespace

void HostEngine::start_call(const char* what, bool dispatch) {
  ledger.check_usable(what);
  settle_membership(what, dispatch);
  ledger.start(what);
  watch.set_call(ledger.calls());
}

void HostEngine::join_call(const char* what) {
  try {
    ledger.join(what);
  } catch (...) {
    phase = Phase::kIdle;
    throw;
  }
}

void HostEngine::reject_call() { ledger.reject(); }

void HostEngine::break_call(const char* what, const std::exception& cause) {
  phase = Phase::kIdle;
  // A death that ended this call goes to the other hosts now: their ranks may be waiting in
  // this call for what only this host would have sent (DeathNotices).
  if (multi_host()) grp.pump_deaths();
  // The call failed because a rank died or left for an agreement: not a fault of this buffer.
  // Abandon the call (peers waiting for this rank's part learn it from the new round) and
  // agree at the next dispatch instead of breaking (docs/ELASTIC.md).
  if (!multi_host() && (watch.ended_by_group_change() || lost_a_rank() ||
                        members.peer_ahead(ledger.calls()) >= 0)) {
    members.abandon(ledger.calls(), win.seq(), cfg.mask_dead_ranks);
    have_dispatch = false;
    return;
  }
  log::debug("rank ", rank, ": ", what, " breaks the buffer: ", cause.what());
  ledger.fail(what, cause);
}

namespace {
// Runs one phase of a started call: an error there leaves the ranks out of step, so it breaks
// the buffer (and tells the peers) before it reaches the caller.
template <typename Fn>
auto phase_of(HostEngine& b, const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const ep::MismatchedCallError&) {
    throw;  // the ranks are in step (a peer made a different call): the buffer stays usable
  } catch (const std::exception& e) {
    b.break_call(what, e);
    throw;
  }
}
// Checks the inputs of a call that was started: a rejection is local (nothing was sent), the
// buffer stays usable, and peers already waiting in this call learn of it at once. Then joins
// the call (a broken peer fails it).
template <typename Fn>
void inputs_of(HostEngine& b, const char* what, Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument&) {
    b.reject_call();
    throw;
  }
  b.join_call(what);
}
}  // namespace

DispatchResult HostEngine::dispatch(const DispatchArgs& args) {
  HostEngine& b = *this;
  b.start_call("dispatch", true);
  {
    CallScope scope(b);
    inputs_of(b, "dispatch", [&] { b.begin_dispatch(args); });
    phase_of(b, "dispatch", [&] {
      ep::Algorithm& algo = b.algorithm();
      algo.dispatch_send(args);
      algo.dispatch_recv();
    });
  }
  report_topk_mismatch(b);
  return b.result();
}

TensorView HostEngine::combine(const CombineArgs& args) {
  HostEngine& b = *this;
  b.start_call("combine", false);
  CallScope scope(b);
  inputs_of(b, "combine", [&] { b.check_combine(args); });
  b.set_combine_weights(args);
  const bool repeat = std::exchange(b.combined, true);
  phase_of(b, "combine", [&] {
    if (repeat) b.begin_repeat_combine();
    ep::Algorithm& algo = b.algorithm();
    algo.combine_send(args);
    algo.combine_recv();
  });
  return b.y_view();
}

void HostEngine::dispatch_send(const DispatchArgs& args) {
  HostEngine& b = *this;
  UBEP_CHECK_ARG(b.algorithm().split_phase(),
                 "dispatch_send: split-phase calls need the ubep "
                 "algorithm, this buffer runs ",
                 algorithm_name(b.cfg.algorithm));
  b.start_call("dispatch_send", true);
  CallScope scope(b);
  inputs_of(b, "dispatch_send", [&] { b.begin_dispatch(args); });
  phase_of(b, "dispatch_send", [&] { b.algorithm().dispatch_send(args); });
  b.phase = Phase::kDispatchSent;
}

DispatchResult HostEngine::dispatch_recv() {
  HostEngine& b = *this;
  b.ledger.check_usable("dispatch_recv");
  UBEP_CHECK_ARG(b.phase == Phase::kDispatchSent, "dispatch_recv: no dispatch_send outstanding");
  b.phase = Phase::kIdle;
  {
    CallScope scope(b);
    phase_of(b, "dispatch_recv", [&] { b.algorithm().dispatch_recv(); });
  }
  report_topk_mismatch(b);
  return b.result();
}

void HostEngine::combine_send(const CombineArgs& args) {
  HostEngine& b = *this;
  UBEP_CHECK_ARG(b.algorithm().split_phase(),
                 "combine_send: split-phase calls need the ubep "
                 "algorithm, this buffer runs ",
                 algorithm_name(b.cfg.algorithm));
  b.start_call("combine_send", false);
  CallScope scope(b);
  inputs_of(b, "combine_send", [&] { b.check_combine(args); });
  b.set_combine_weights(args);
  const bool repeat = std::exchange(b.combined, true);
  phase_of(b, "combine_send", [&] {
    if (repeat) b.begin_repeat_combine();
    b.algorithm().combine_send(args);
  });
  b.phase = Phase::kCombineSent;
}

TensorView HostEngine::combine_recv() {
  HostEngine& b = *this;
  b.ledger.check_usable("combine_recv");
  UBEP_CHECK_ARG(b.phase == Phase::kCombineSent, "combine_recv: no combine_send outstanding");
  b.phase = Phase::kIdle;
  CallScope scope(b);
  phase_of(b, "combine_recv", [&] { b.algorithm().combine_recv(); });
  return b.y_view();
}

std::array<int64_t, 2> HostEngine::wait_recv_range(int source, int local_expert) {
  HostEngine& b = *this;
  b.ledger.check_usable("wait_recv_range");
  UBEP_CHECK_ARG(b.phase == Phase::kDispatchSent, "wait_recv_range: no dispatch_send outstanding");
  protocol::check_recv_piece(source, local_expert, b.call.layout, b.ranks, b.local_experts);
  return phase_of(b, "wait_recv_range",
                  [&] { return b.algorithm().wait_recv_range(source, local_expert); });
}

DispatchResult HostEngine::pending_dispatch() const {
  const HostEngine& b = *this;
  UBEP_CHECK_ARG(b.phase == Phase::kDispatchSent && b.call.layout == Layout::kLatency,
                 "pending_dispatch: no latency-layout dispatch_send outstanding");
  return b.result();
}

TensorView HostEngine::pending_combine() const {
  UBEP_CHECK_ARG(phase == Phase::kCombineSent, "pending_combine: no combine_send outstanding");
  return y_view();
}

void HostEngine::set_algorithm(ubep::Algorithm a) {
  UBEP_CHECK_ARG(phase == Phase::kIdle, "set_algorithm: a split-phase call is outstanding");
  cfg.algorithm = a;
}
void HostEngine::set_sync_mode(SyncMode m) {
  UBEP_CHECK_ARG(phase == Phase::kIdle, "set_sync_mode: a split-phase call is outstanding");
  cfg.research.sync = m;
  win.set_sync(m);
}
TensorView HostEngine::compact() {
  UBEP_CHECK_ARG(have_dispatch, "compact: no dispatch on this buffer yet");
  UBEP_CHECK_ARG(phase == Phase::kIdle, "compact: a split-phase call is outstanding");
  return compact_rows();
}
TensorView HostEngine::combine_buffer() const {
  UBEP_CHECK_ARG(have_dispatch, "combine_buffer: no dispatch on this buffer yet");
  return combine_input_view();
}

}  // namespace ubep::ep
