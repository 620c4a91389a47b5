#include <algorithm>
#include <thread>

#include "core/log.hpp"
#include "ep/buffer_impl.hpp"
#include "ep/relay.hpp"
#include "ubep/error.hpp"

namespace ubep {

const char* algorithm_name(Algorithm a) { return a == Algorithm::kBsp ? "bsp" : "ubep"; }
Algorithm parse_algorithm(const std::string& n) {
  if (n == "bsp") return Algorithm::kBsp;
  if (n == "ubep") return Algorithm::kUbep;
  throw InvalidArgument("unknown algorithm '" + n + "' (expected bsp or ubep)");
}
const char* layout_name(Layout l) { return l == Layout::kThroughput ? "throughput" : "latency"; }
Layout parse_layout(const std::string& n) {
  if (n == "throughput") return Layout::kThroughput;
  if (n == "latency") return Layout::kLatency;
  throw InvalidArgument("unknown layout '" + n + "' (expected throughput or latency)");
}
const char* sync_mode_name(SyncMode m) { return m == SyncMode::kFused ? "fused" : "stop-and-wait"; }
SyncMode parse_sync_mode(const std::string& n) {
  if (n == "fused") return SyncMode::kFused;
  if (n == "stop-and-wait") return SyncMode::kStopAndWait;
  throw InvalidArgument("unknown sync mode '" + n + "' (expected fused or stop-and-wait)");
}

const char* send_schedule_name(SendSchedule s) {
  switch (s) {
    case SendSchedule::kEqualSlices:
      return "equal";
    case SendSchedule::kNaive:
      return "naive";
    case SendSchedule::kColumnMajor:
      return "column_major";
    case SendSchedule::kBalanced:
      return "balanced";
  }
  return "?";
}
SendSchedule parse_send_schedule(const std::string& n) {
  if (n == "equal") return SendSchedule::kEqualSlices;
  if (n == "naive") return SendSchedule::kNaive;
  if (n == "column_major") return SendSchedule::kColumnMajor;
  if (n == "balanced") return SendSchedule::kBalanced;
  throw InvalidArgument("unknown send schedule '" + n +
                        "' (expected equal, naive, column_major or balanced)");
}

namespace {

BufferConfig checked(const Group& g, BufferConfig c) {
  UBEP_CHECK_ARG(c.max_tokens_per_rank >= 1, "max_tokens_per_rank must be >= 1, got ",
                 c.max_tokens_per_rank);
  UBEP_CHECK_ARG(c.max_tokens_per_rank < (int64_t{1} << 30),
                 "max_tokens_per_rank too large: ", c.max_tokens_per_rank);
  UBEP_CHECK_ARG(c.hidden >= 1, "hidden must be >= 1, got ", c.hidden);
  UBEP_CHECK_ARG(c.dtype == DType::kBF16 || c.dtype == DType::kFP32,
                 "buffer dtype must be bf16 or fp32, got ", dtype_name(c.dtype));
  UBEP_CHECK_ARG(c.num_experts >= 1 && c.num_experts % g.size() == 0, "Buffer: num_experts ",
                 c.num_experts, " must be a positive multiple of the group size ", g.size());
  UBEP_CHECK_ARG(c.max_topk >= 1 && c.max_topk <= 64, "max_topk must be in [1, 64], got ",
                 c.max_topk);
  if (c.num_workers < 0) {
    // Cores per rank on this host, minus the caller (which is a team member itself).
    int local = 0;
    for (int r = 0; r < g.size(); ++r) local += g.same_host(r, g.rank());
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    c.num_workers = std::max(0, cores / std::max(1, local) - 1);
  }
  return c;
}

// Every rank must build the same window map and speak the same protocol: compare the fields
// that shape them across the group (collective), and name the first that differs.
void check_same_config(Group& g, const BufferConfig& c) {
  const int64_t mine[] = {c.max_tokens_per_rank,
                          c.hidden,
                          static_cast<int64_t>(c.dtype),
                          c.num_experts,
                          c.max_topk,
                          c.enable_latency_layout,
                          static_cast<int64_t>(c.initial_epoch),
                          static_cast<int64_t>(c.sync),
                          static_cast<int64_t>(c.algorithm)};
  static const char* names[] = {"max_tokens_per_rank", "hidden",   "dtype",
                                "num_experts",         "max_topk", "enable_latency_layout",
                                "initial_epoch",       "sync",     "algorithm"};
  constexpr size_t n = sizeof mine / sizeof mine[0];
  std::vector<int64_t> all(n * static_cast<size_t>(g.size()));
  g.allgather(mine, all.data(), sizeof mine);
  for (int r = 0; r < g.size(); ++r)
    for (size_t f = 0; f < n; ++f)
      UBEP_CHECK_ARG(all[static_cast<size_t>(r) * n + f] == all[f], "Buffer: ranks disagree on ",
                     names[f], ": rank 0 has ", all[f], ", rank ", r, " has ",
                     all[static_cast<size_t>(r) * n + f]);
}

}  // namespace

Buffer::Impl::Impl(Group& g, const BufferConfig& c)
    : group(g),
      cfg(checked(g, c)),
      rank(g.rank()),
      ranks(g.size()),
      local_experts(cfg.num_experts / g.size()),
      T(cfg.max_tokens_per_rank),
      win(static_cast<size_t>(cfg.hidden) * dtype_size(cfg.dtype), g.size(),
          cfg.num_experts / g.size(), cfg.max_topk, cfg.max_tokens_per_rank,
          cfg.enable_latency_layout),
      routing(g.size(), cfg.num_experts, cfg.max_tokens_per_rank, cfg.max_topk),
      wait{std::chrono::duration_cast<std::chrono::nanoseconds>(g.options().timeout)},
      next_seq(cfg.initial_epoch) {
  check_same_config(g, cfg);
  window = g.allocate_window(win.total);
  team = std::make_unique<ep::WorkerTeam>(cfg.num_workers);
  row_offset_at.resize(static_cast<size_t>(ranks));
  expert_offset_at.resize(static_cast<size_t>(ranks) * static_cast<size_t>(local_experts));
  offsets_ready = std::vector<std::atomic<uint64_t>>(static_cast<size_t>(ranks));
  recv_count = LocalArray(static_cast<size_t>(local_experts) * 8);
  y = LocalArray(static_cast<size_t>(T) * row_bytes());
  part.resize(static_cast<size_t>(cfg.hidden));
  if (cfg.schedule != SendSchedule::kEqualSlices) {
    sched::Topology topo =
        cfg.topology.empty() ? sched::discover(g) : sched::parse_topology(cfg.topology, ranks);
    UBEP_CHECK_ARG(topo.ranks() == ranks, "topology '", cfg.topology, "' has ", topo.ranks(),
                   " ranks, the group ", ranks);
    const sched::Policy policy = cfg.schedule == SendSchedule::kNaive ? sched::Policy::kNaive
                                 : cfg.schedule == SendSchedule::kColumnMajor
                                     ? sched::Policy::kColumnMajor
                                     : sched::Policy::kBalanced;
    scheduler = std::make_unique<sched::Scheduler>(std::move(topo),
                                                   sched::SchedulerOptions{team->size(), policy});
    plan_rows.resize(static_cast<size_t>(ranks));
  }
  if (g.num_hosts() > 1) {
    UBEP_CHECK_ARG(g.remote() != nullptr, "Buffer: the group spans ", g.num_hosts(),
                   " hosts but has no transport between them");
    relay = std::make_unique<HostRelay>(*this);
  }
  acc.resize(static_cast<size_t>(team->size()) * static_cast<size_t>(cfg.hidden));
  stats.stage_us.reserve(16);
  log::info("rank ", rank, ": buffer with ", win.total, " shared bytes, ", cfg.num_workers,
            " workers, algorithm ", algorithm_name(cfg.algorithm));
}

void Buffer::Impl::publish_count(int dest, int source, int32_t rows, int32_t topk,
                                 const int32_t* expert_rows) {
  ep::CountRecord rec = win.count(peer(dest), half(), source);
  *rec.rows() = rows;
  *rec.topk() = topk;
  std::memcpy(rec.expert_rows(), expert_rows, static_cast<size_t>(local_experts) * 4);
  if (cfg.sync == SyncMode::kFused) {
    ep::publish(rec.tag(), tag());
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // stop-and-wait: fence, then the flag
    ep::publish(win.count_flag(peer(dest), half(), source), tag());
  }
}

bool Buffer::Impl::count_arrived(int dest, int source) const {
  ep::CountRecord rec = win.count(peer(dest), half(), source);
  return ep::arrived(
      cfg.sync == SyncMode::kFused ? rec.tag() : win.count_flag(peer(dest), half(), source), tag());
}

void Buffer::Impl::compute_offsets(int dest) {
  int64_t rows = 0;
  int64_t* eo = &expert_offset_at[static_cast<size_t>(dest * local_experts)];
  std::fill(eo, eo + local_experts, 0);
  for (int s = 0; s < rank; ++s) {
    ep::CountRecord rec = win.count(peer(dest), half(), s);
    rows += *rec.rows();
    if (layout == Layout::kLatency)
      for (int e = 0; e < local_experts; ++e) eo[e] += rec.expert_rows()[e];
  }
  row_offset_at[static_cast<size_t>(dest)] = rows;
}

void Buffer::Impl::receive_counts() {
  int64_t rows = 0;
  auto* counts = recv_count.get<int64_t>();
  std::fill(counts, counts + local_experts, 0);
  for (int s = 0; s < ranks; ++s) {
    ep::CountRecord rec = win.count(local(), half(), s);
    if (*rec.topk() != routing.topk) topk_mismatch.store(s, std::memory_order_relaxed);
    rows += *rec.rows();
    for (int e = 0; e < local_experts; ++e) counts[e] += rec.expert_rows()[e];
  }
  num_recv_rows = rows;
}

void Buffer::Impl::row_owner(int64_t row, int* owner, int64_t* push_slot) const {
  if (layout == Layout::kThroughput) {
    const int64_t* s = at<int64_t>(rank, win.tp_src) + 2 * row;
    *owner = static_cast<int>(s[0]);
    *push_slot = static_cast<int64_t>(rank) * T + s[1];
  } else {
    const int64_t* s = at<int64_t>(rank, win.lat_src) + 2 * row;
    *owner = static_cast<int>(s[0]);
    *push_slot = s[1] * cfg.max_topk + at<int8_t>(rank, win.lat_k)[row];
  }
}

DispatchResult Buffer::Impl::result() const {
  DispatchResult r;
  r.layout = layout;
  r.handle = seq;
  const int64_t K = routing.topk;
  r.recv_count = TensorView(recv_count.get(), DType::kInt64, {local_experts});
  if (layout == Layout::kThroughput) {
    r.num_recv_rows = num_recv_rows;
    r.recv_x = TensorView(at<char>(rank, win.tp_x), cfg.dtype, {num_recv_rows, cfg.hidden});
    r.recv_topk_idx = TensorView(at<char>(rank, win.tp_idx), DType::kInt32, {num_recv_rows, K});
    r.recv_topk_weights = TensorView(at<char>(rank, win.tp_w), DType::kFP32, {num_recv_rows, K});
    r.recv_src = TensorView(at<char>(rank, win.tp_src), DType::kInt64, {num_recv_rows, 2});
  } else {
    r.recv_x = TensorView(at<char>(rank, win.lat_x), cfg.dtype, {local_experts, RT(), cfg.hidden});
    r.recv_src = TensorView(at<char>(rank, win.lat_src), DType::kInt64, {local_experts, RT(), 2});
  }
  return r;
}

TensorView Buffer::Impl::combine_input_view() const {
  char* base = at<char>(rank, win.comb_x);
  if (layout == Layout::kThroughput)
    return TensorView(base, cfg.dtype, {num_recv_rows, cfg.hidden});
  return TensorView(base, cfg.dtype, {local_experts, RT(), cfg.hidden});
}

TensorView Buffer::Impl::y_view() const {
  return TensorView(y.get(), cfg.dtype, {routing.num_tokens, cfg.hidden});
}

void Buffer::Impl::begin_dispatch(const DispatchArgs& a) {
  UBEP_CHECK_ARG(phase == Phase::kIdle,
                 "dispatch: a split-phase call is still outstanding on this buffer");
  UBEP_CHECK_ARG(a.layout == Layout::kThroughput || cfg.enable_latency_layout,
                 "dispatch: latency layout requested but the buffer was created with "
                 "enable_latency_layout=false");
  routing.build(a, cfg);  // validates: throws before anything is sent
  double rows = 0;
  for (int d = 0; d < ranks; ++d) rows += routing.dest_rows[static_cast<size_t>(d)];
  if (a.layout == Layout::kLatency) {
    rows = 0;
    for (int64_t i = 0; i < routing.num_tokens * routing.topk; ++i)
      rows += routing.topk_idx[static_cast<size_t>(i)] >= 0;
  }
  stream_rows = rows * static_cast<double>(row_bytes()) >= kStreamBytes;
  seq = next_seq++;
  layout = a.layout;
  have_dispatch = true;
  combined = false;
  topk_mismatch.store(-1, std::memory_order_relaxed);
}

void Buffer::Impl::check_combine(const CombineArgs& a) const {
  UBEP_CHECK_ARG(phase == Phase::kIdle,
                 "combine: a split-phase call is still outstanding on this buffer");
  UBEP_CHECK_ARG(have_dispatch, "combine: no dispatch on this buffer yet");
  UBEP_CHECK_ARG(
      !combined, "combine: dispatch ", seq,
      " was already combined; each dispatch is combined at most once (peers may still be "
      "reading the rows of the first combine)");
  UBEP_CHECK_ARG(a.handle == seq, "combine: handle ", a.handle,
                 " does not belong to the last dispatch on this buffer (", seq, ")");
  UBEP_CHECK_ARG(a.x.dtype == cfg.dtype, "combine: x dtype ", dtype_name(a.x.dtype),
                 " does not match the buffer's ", dtype_name(cfg.dtype));
  if (layout == Layout::kThroughput) {
    UBEP_CHECK_ARG(a.x.ndim == 2 && a.x.dim(0) == num_recv_rows && a.x.dim(1) == cfg.hidden,
                   "combine: x must be [", num_recv_rows, ", ", cfg.hidden,
                   "] (one row per received row), got ", a.x.describe());
  } else {
    UBEP_CHECK_ARG(a.x.ndim == 3 && a.x.dim(0) == local_experts && a.x.dim(1) == RT() &&
                       a.x.dim(2) == cfg.hidden,
                   "combine: x must be [", local_experts, ", ", RT(), ", ", cfg.hidden,
                   "] (latency layout), got ", a.x.describe());
  }
  UBEP_CHECK_ARG(a.x.data != nullptr || a.x.numel() == 0, "combine: x has no data");
  if (a.topk_weights.ndim != 0) {
    const TensorView& w = a.topk_weights;
    UBEP_CHECK_ARG(layout == Layout::kLatency,
                   "combine: topk_weights can only replace the dispatch's in the latency layout");
    UBEP_CHECK_ARG(!multi_host(), "combine: topk_weights cannot be replaced across hosts");
    UBEP_CHECK_ARG(w.ndim == 2 && w.dtype == DType::kFP32 && w.dim(0) == routing.num_tokens &&
                       w.dim(1) == routing.topk && (w.data != nullptr || w.numel() == 0),
                   "combine: topk_weights must be fp32 [", routing.num_tokens, ", ", routing.topk,
                   "] like the dispatch's topk_idx, got ", w.describe());
  }
}

void Buffer::Impl::set_combine_weights(const CombineArgs& a) {
  if (a.topk_weights.ndim != 0)
    std::memcpy(routing.topk_weights.data(), a.topk_weights.data, a.topk_weights.bytes());
}

// ---------------------------------------------------------------------------------------------

Buffer::Buffer(Group& group, BufferConfig config) : impl_(std::make_unique<Impl>(group, config)) {}
Buffer::~Buffer() = default;
Buffer::Impl::~Impl() = default;

namespace {
void report_topk_mismatch(const Buffer::Impl& b) {
  UBEP_CHECK_ARG(b.topk_mismatch.load() < 0, "dispatch: rank ", b.topk_mismatch.load(),
                 " used a different topk than rank ", b.rank, " (", b.routing.topk, ")");
}
}  // namespace

DispatchResult Buffer::dispatch(const DispatchArgs& args) {
  Impl& b = *impl_;
  const uint64_t barriers0 = b.group.barrier_count();
  if (b.cfg.algorithm == Algorithm::kBsp) {
    b.begin_dispatch(args);
    ep::bsp_dispatch(b, args);
  } else {
    dispatch_send(args);
    b.phase = Impl::Phase::kIdle;
    ep::ubep_dispatch_recv(b);
  }
  b.stats.barriers = b.group.barrier_count() - barriers0;
  b.record_network();
  report_topk_mismatch(b);
  return b.result();
}

TensorView Buffer::combine(const CombineArgs& args) {
  Impl& b = *impl_;
  const uint64_t barriers0 = b.group.barrier_count();
  b.check_combine(args);
  b.set_combine_weights(args);
  b.combined = true;
  if (b.cfg.algorithm == Algorithm::kBsp) {
    ep::bsp_combine(b, args);
  } else {
    ep::ubep_combine_send(b, args);
    ep::ubep_combine_recv(b);
  }
  b.stats.barriers = b.group.barrier_count() - barriers0;
  b.record_network();
  return b.y_view();
}

void Buffer::dispatch_send(const DispatchArgs& args) {
  Impl& b = *impl_;
  UBEP_CHECK_ARG(b.cfg.algorithm == Algorithm::kUbep,
                 "dispatch_send: split-phase calls need the ubep algorithm");
  b.begin_dispatch(args);
  ep::ubep_dispatch_send(b, args);
  b.phase = Impl::Phase::kDispatchSent;
}

DispatchResult Buffer::dispatch_recv() {
  Impl& b = *impl_;
  UBEP_CHECK_ARG(b.phase == Impl::Phase::kDispatchSent,
                 "dispatch_recv: no dispatch_send outstanding");
  b.phase = Impl::Phase::kIdle;
  ep::ubep_dispatch_recv(b);
  b.stats.barriers = 0;
  b.record_network();
  report_topk_mismatch(b);
  return b.result();
}

void Buffer::combine_send(const CombineArgs& args) {
  Impl& b = *impl_;
  UBEP_CHECK_ARG(b.cfg.algorithm == Algorithm::kUbep,
                 "combine_send: split-phase calls need the ubep algorithm");
  b.check_combine(args);
  b.set_combine_weights(args);
  b.combined = true;
  ep::ubep_combine_send(b, args);
  b.phase = Impl::Phase::kCombineSent;
}

TensorView Buffer::combine_recv() {
  Impl& b = *impl_;
  UBEP_CHECK_ARG(b.phase == Impl::Phase::kCombineSent, "combine_recv: no combine_send outstanding");
  b.phase = Impl::Phase::kIdle;
  ep::ubep_combine_recv(b);
  b.stats.barriers = 0;
  b.record_network();
  return b.y_view();
}

DispatchResult Buffer::pending_dispatch() const {
  UBEP_CHECK_ARG(impl_->phase == Impl::Phase::kDispatchSent && impl_->layout == Layout::kLatency,
                 "pending_dispatch: no latency-layout dispatch_send outstanding");
  return impl_->result();
}

TensorView Buffer::pending_combine() const {
  UBEP_CHECK_ARG(impl_->phase == Impl::Phase::kCombineSent,
                 "pending_combine: no combine_send outstanding");
  return impl_->y_view();
}

const BufferConfig& Buffer::config() const { return impl_->cfg; }
Group& Buffer::group() { return impl_->group; }
int Buffer::num_local_experts() const { return impl_->local_experts; }
int Buffer::num_workers() const { return impl_->team->size() - 1; }
void Buffer::set_algorithm(Algorithm a) {
  UBEP_CHECK_ARG(impl_->phase == Impl::Phase::kIdle,
                 "set_algorithm: a split-phase call is outstanding");
  impl_->cfg.algorithm = a;
}
void Buffer::set_sync_mode(SyncMode m) {
  UBEP_CHECK_ARG(impl_->phase == Impl::Phase::kIdle,
                 "set_sync_mode: a split-phase call is outstanding");
  impl_->cfg.sync = m;
}
const CallStats& Buffer::last_stats() const { return impl_->stats; }
size_t Buffer::shared_bytes() const { return impl_->win.total; }
TensorView Buffer::combine_buffer() const {
  UBEP_CHECK_ARG(impl_->have_dispatch, "combine_buffer: no dispatch on this buffer yet");
  return impl_->combine_input_view();
}

}  // namespace ubep
