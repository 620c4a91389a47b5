#include <algorithm>
#include <thread>

#include "core/log.hpp"
#include "ep/buffer_impl.hpp"
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

namespace {

BufferConfig checked(const Group& g, BufferConfig c) {
  UBEP_CHECK_ARG(c.max_tokens_per_rank >= 1, "max_tokens_per_rank must be >= 1, got ",
                 c.max_tokens_per_rank);
  UBEP_CHECK_ARG(c.max_tokens_per_rank < (int64_t{1} << 30), "max_tokens_per_rank too large: ",
                 c.max_tokens_per_rank);
  UBEP_CHECK_ARG(c.hidden >= 1, "hidden must be >= 1, got ", c.hidden);
  UBEP_CHECK_ARG(c.dtype == DType::kBF16 || c.dtype == DType::kFP32,
                 "buffer dtype must be bf16 or fp32, got ", dtype_name(c.dtype));
  UBEP_CHECK_ARG(c.num_experts >= 1 && c.num_experts % g.size() == 0, "num_experts ",
                 c.num_experts, " must be a positive multiple of the group size ", g.size());
  UBEP_CHECK_ARG(c.max_topk >= 1 && c.max_topk <= 64, "max_topk must be in [1, 64], got ", c.max_topk);
  if (c.num_workers < 0) {
    // Cores per rank on this host, minus the caller (which is a team member itself).
    int local = 0;
    for (int r = 0; r < g.size(); ++r) local += g.same_host(r, g.rank());
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    c.num_workers = std::max(0, cores / std::max(1, local) - 1);
  }
  return c;
}

}  // namespace

Buffer::Impl::Impl(Group& g, const BufferConfig& c)
    : group(g),
      cfg(checked(g, c)),
      rank(g.rank()),
      ranks(g.size()),
      local_experts(cfg.num_experts / g.size()),
      T(cfg.max_tokens_per_rank),
      fmt{static_cast<size_t>(cfg.hidden) * dtype_size(cfg.dtype), cfg.max_topk,
          cfg.num_experts / g.size()},
      staging(fmt, g.size(), cfg.max_tokens_per_rank, cfg.enable_latency_layout),
      routing(g.size(), cfg.num_experts, cfg.max_tokens_per_rank, cfg.max_topk),
      wait{std::chrono::duration_cast<std::chrono::nanoseconds>(g.options().timeout)},
      next_seq(cfg.initial_epoch) {
  const auto R = static_cast<size_t>(ranks), El = static_cast<size_t>(local_experts);
  const auto Tz = static_cast<size_t>(T), K = static_cast<size_t>(cfg.max_topk);
  const size_t RB = fmt.row_bytes;
  window = g.allocate_window(staging.total);
  team = std::make_unique<ep::WorkerTeam>(cfg.num_workers);
  src_rows.resize(R);
  src_offset.resize(R);
  src_expert_rows.resize(R * El);
  expert_offset.resize(El * R);
  recv_x = LocalArray(R * Tz * RB);
  recv_topk_idx = LocalArray(R * Tz * K * 4);
  recv_topk_weights = LocalArray(R * Tz * K * 4);
  recv_src = LocalArray(R * Tz * 16);
  recv_count = LocalArray(El * 8);
  if (cfg.enable_latency_layout) {
    lat_x = LocalArray(El * R * Tz * RB);
    lat_src = LocalArray(El * R * Tz * 16);
    lat_k = LocalArray(El * R * Tz);
  }
  y = LocalArray(Tz * RB);
  acc.resize(static_cast<size_t>(team->size()) * static_cast<size_t>(cfg.hidden));
  cursors.resize(static_cast<size_t>(team->size()) * R);
  stats.stage_us.reserve(16);
  log::info("rank ", rank, ": buffer with ", staging.total, " shared bytes, ", cfg.num_workers,
            " workers, algorithm ", algorithm_name(cfg.algorithm));
}

ep::CountRecord Buffer::Impl::fill_count(int dest) {
  ep::CountRecord rec = staging.count(peer(dest), half(), rank);
  *rec.rows() = routing.dest_rows[static_cast<size_t>(dest)];
  std::memcpy(rec.expert_rows(), &routing.dest_expert_rows[static_cast<size_t>(dest * local_experts)],
              static_cast<size_t>(local_experts) * 4);
  return rec;
}

ep::TokenRecord Buffer::Impl::fill_token(const DispatchArgs& a, int dest, int64_t i) {
  const int32_t t = routing.dest_token(dest, i);
  ep::TokenRecord rec = staging.token(peer(dest), half(), rank, i);
  std::memcpy(rec.row(), static_cast<const char*>(a.x.data) + static_cast<size_t>(t) * row_bytes(),
              row_bytes());
  *rec.src_token() = t;
  *rec.topk() = routing.topk;
  const int K = routing.topk;
  for (int j = 0; j < K; ++j) {
    const size_t tk = static_cast<size_t>(t) * static_cast<size_t>(K) + static_cast<size_t>(j);
    const int32_t e = routing.topk_idx[tk];
    const bool here = e >= 0 && e / local_experts == dest;
    rec.local_expert()[j] = here ? e % local_experts : -1;
    rec.expert_slot()[j] = here ? routing.expert_slot[tk] : -1;
    rec.weight()[j] = here ? routing.topk_weights[tk] : 0.0f;
  }
  return rec;
}

void Buffer::Impl::prefix_sum() {
  int64_t rows = 0;
  auto* counts = recv_count.get<int64_t>();
  std::fill(counts, counts + local_experts, 0);
  for (int s = 0; s < ranks; ++s) {
    ep::CountRecord rec = staging.count(local(), half(), s);
    src_rows[static_cast<size_t>(s)] = *rec.rows();
    src_offset[static_cast<size_t>(s)] = rows;
    rows += *rec.rows();
    for (int e = 0; e < local_experts; ++e) {
      const int32_t n = rec.expert_rows()[e];
      src_expert_rows[static_cast<size_t>(s * local_experts + e)] = n;
      expert_offset[static_cast<size_t>(e * ranks + s)] = counts[e];
      counts[e] += n;
    }
  }
  num_recv_rows = rows;
}

void Buffer::Impl::consume_token(int src, int64_t i) {
  ep::TokenRecord rec = staging.token(local(), half(), src, i);
  const int K = routing.topk;
  if (*rec.topk() != K) topk_mismatch.store(src, std::memory_order_relaxed);
  const int32_t t = *rec.src_token();
  if (layout == Layout::kThroughput) {
    const int64_t pos = src_offset[static_cast<size_t>(src)] + i;
    std::memcpy(recv_x.get() + static_cast<size_t>(pos) * row_bytes(), rec.row(), row_bytes());
    auto* srcp = recv_src.get<int64_t>() + 2 * pos;
    srcp[0] = src;
    srcp[1] = t;
    auto* idx = recv_topk_idx.get<int32_t>() + pos * K;
    auto* w = recv_topk_weights.get<float>() + pos * K;
    for (int j = 0; j < K; ++j) {
      idx[j] = rec.local_expert()[j];
      w[j] = rec.weight()[j];
    }
  } else {
    for (int j = 0; j < K; ++j) {
      const int32_t e = rec.local_expert()[j];
      if (e < 0) continue;
      const int64_t pos = e * lat_rows() + expert_offset[static_cast<size_t>(e * ranks + src)] +
                          rec.expert_slot()[j];
      std::memcpy(lat_x.get() + static_cast<size_t>(pos) * row_bytes(), rec.row(), row_bytes());
      auto* srcp = lat_src.get<int64_t>() + 2 * pos;
      srcp[0] = src;
      srcp[1] = t;
      lat_k.get<int8_t>()[pos] = static_cast<int8_t>(j);
    }
  }
}

int64_t Buffer::Impl::combine_row_count() const {
  if (layout == Layout::kThroughput) return num_recv_rows;
  return static_cast<int64_t>(local_experts) * lat_rows();
}

void Buffer::Impl::combine_target(int64_t row, int* owner, int64_t* slot, const char** data,
                                  const CombineArgs& a) const {
  // Latency layout: `row` walks [expert, slot]; slots past the expert's count are skipped
  // (owner < 0).
  if (layout == Layout::kThroughput) {
    const auto* s = recv_src.get<int64_t>() + 2 * row;
    *owner = static_cast<int>(s[0]);
    *slot = static_cast<int64_t>(rank) * T + s[1];
  } else {
    const int64_t e = row / lat_rows(), p = row % lat_rows();
    if (p >= recv_count.get<int64_t>()[e]) {
      *owner = -1;
      return;
    }
    const auto* s = lat_src.get<int64_t>() + 2 * row;
    *owner = static_cast<int>(s[0]);
    *slot = s[1] * routing.max_topk + lat_k.get<int8_t>()[row];
  }
  *data = static_cast<const char*>(a.x.data) + static_cast<size_t>(row) * row_bytes();
}

void write_row(char* dst, const float* acc, DType t, int64_t hidden) {
  if (t == DType::kBF16) {
    auto* o = reinterpret_cast<uint16_t*>(dst);
    for (int64_t h = 0; h < hidden; ++h) o[h] = float_to_bf16(acc[h]);
  } else {
    std::memcpy(dst, acc, static_cast<size_t>(hidden) * 4);
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
    r.recv_x = TensorView(recv_x.get(), cfg.dtype, {num_recv_rows, cfg.hidden});
    r.recv_topk_idx = TensorView(recv_topk_idx.get(), DType::kInt32, {num_recv_rows, K});
    r.recv_topk_weights = TensorView(recv_topk_weights.get(), DType::kFP32, {num_recv_rows, K});
    r.recv_src = TensorView(recv_src.get(), DType::kInt64, {num_recv_rows, 2});
  } else {
    r.recv_x = TensorView(lat_x.get(), cfg.dtype, {local_experts, lat_rows(), cfg.hidden});
    r.recv_src = TensorView(lat_src.get(), DType::kInt64, {local_experts, lat_rows(), 2});
  }
  return r;
}

TensorView Buffer::Impl::y_view() const {
  return TensorView(y.get(), cfg.dtype, {routing.num_tokens, cfg.hidden});
}

void Buffer::Impl::begin_dispatch(const DispatchArgs& a) {
  UBEP_CHECK_ARG(phase == Phase::kIdle, "dispatch: a split-phase call is still outstanding on this buffer");
  UBEP_CHECK_ARG(a.layout == Layout::kThroughput || cfg.enable_latency_layout,
                 "dispatch: latency layout requested but the buffer was created with "
                 "enable_latency_layout=false");
  routing.build(a, cfg);  // validates: throws before anything is sent
  seq = next_seq++;
  layout = a.layout;
  have_dispatch = true;
  topk_mismatch.store(-1, std::memory_order_relaxed);
}

void Buffer::Impl::check_combine(const CombineArgs& a) const {
  UBEP_CHECK_ARG(phase == Phase::kIdle, "combine: a split-phase call is still outstanding on this buffer");
  UBEP_CHECK_ARG(have_dispatch, "combine: no dispatch on this buffer yet");
  UBEP_CHECK_ARG(a.handle == seq, "combine: handle ", a.handle,
                 " does not belong to the last dispatch on this buffer (", seq, ")");
  UBEP_CHECK_ARG(a.x.dtype == cfg.dtype, "combine: x dtype ", dtype_name(a.x.dtype),
                 " does not match the buffer's ", dtype_name(cfg.dtype));
  if (layout == Layout::kThroughput) {
    UBEP_CHECK_ARG(a.x.ndim == 2 && a.x.dim(0) == num_recv_rows && a.x.dim(1) == cfg.hidden,
                   "combine: x must be [", num_recv_rows, ", ", cfg.hidden, "] (one row per received row), got ",
                   a.x.describe());
  } else {
    UBEP_CHECK_ARG(a.x.ndim == 3 && a.x.dim(0) == local_experts && a.x.dim(1) == lat_rows() &&
                       a.x.dim(2) == cfg.hidden,
                   "combine: x must be [", local_experts, ", ", lat_rows(), ", ", cfg.hidden,
                   "] (latency layout), got ", a.x.describe());
  }
  UBEP_CHECK_ARG(a.x.data != nullptr || a.x.numel() == 0, "combine: x has no data");
}

// ---------------------------------------------------------------------------------------------

Buffer::Buffer(Group& group, BufferConfig config) : impl_(std::make_unique<Impl>(group, config)) {}
Buffer::~Buffer() = default;

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
  report_topk_mismatch(b);
  return b.result();
}

TensorView Buffer::combine(const CombineArgs& args) {
  Impl& b = *impl_;
  const uint64_t barriers0 = b.group.barrier_count();
  b.check_combine(args);
  if (b.cfg.algorithm == Algorithm::kBsp) {
    ep::bsp_combine(b, args);
  } else {
    ep::ubep_combine_send(b, args);
    ep::ubep_combine_recv(b);
  }
  b.stats.barriers = b.group.barrier_count() - barriers0;
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
  UBEP_CHECK_ARG(b.phase == Impl::Phase::kDispatchSent, "dispatch_recv: no dispatch_send outstanding");
  b.phase = Impl::Phase::kIdle;
  ep::ubep_dispatch_recv(b);
  b.stats.barriers = 0;
  report_topk_mismatch(b);
  return b.result();
}

void Buffer::combine_send(const CombineArgs& args) {
  Impl& b = *impl_;
  UBEP_CHECK_ARG(b.cfg.algorithm == Algorithm::kUbep,
                 "combine_send: split-phase calls need the ubep algorithm");
  b.check_combine(args);
  ep::ubep_combine_send(b, args);
  b.phase = Impl::Phase::kCombineSent;
}

TensorView Buffer::combine_recv() {
  Impl& b = *impl_;
  UBEP_CHECK_ARG(b.phase == Impl::Phase::kCombineSent, "combine_recv: no combine_send outstanding");
  b.phase = Impl::Phase::kIdle;
  ep::ubep_combine_recv(b);
  b.stats.barriers = 0;
  return b.y_view();
}

const BufferConfig& Buffer::config() const { return impl_->cfg; }
Group& Buffer::group() { return impl_->group; }
int Buffer::num_local_experts() const { return impl_->local_experts; }
int Buffer::num_workers() const { return impl_->team->size() - 1; }
void Buffer::set_algorithm(Algorithm a) {
  UBEP_CHECK_ARG(impl_->phase == Impl::Phase::kIdle, "set_algorithm: a split-phase call is outstanding");
  impl_->cfg.algorithm = a;
}
void Buffer::set_sync_mode(SyncMode m) {
  UBEP_CHECK_ARG(impl_->phase == Impl::Phase::kIdle, "set_sync_mode: a split-phase call is outstanding");
  impl_->cfg.sync = m;
}
const CallStats& Buffer::last_stats() const { return impl_->stats; }
size_t Buffer::shared_bytes() const { return impl_->staging.total; }

}  // namespace ubep
