#include "baseline/alltoall_impl.hpp"

namespace ubep {

AlltoallBaseline::AlltoallBaseline(Group& g, BufferConfig c)
    : impl_(std::make_unique<Impl>(g, c)) {}
namespace {
std::unique_ptr<BulkExchange> non_null(std::unique_ptr<BulkExchange> ex) {
  UBEP_CHECK_ARG(ex != nullptr, "AlltoallBaseline: the exchange is null");
  return ex;
}
}  // namespace
AlltoallBaseline::AlltoallBaseline(Group& g, BufferConfig c, std::unique_ptr<BulkExchange> ex)
    : impl_(std::make_unique<Impl>(g, c, non_null(std::move(ex)))) {}
AlltoallBaseline::~AlltoallBaseline() = default;
const CallStats& AlltoallBaseline::last_stats() const { return impl_->stats; }
const char* AlltoallBaseline::name() const { return impl_->exchange->name(); }

namespace {

using Impl = AlltoallBaseline::Impl;

// The peer whose block in row_prefix holds row position g (of the send or the receive buffer).
int peer_of(const Impl& b, int64_t g) {
  const auto it = std::upper_bound(b.row_prefix.begin(), b.row_prefix.begin() + b.ranks + 1, g);
  return static_cast<int>(it - b.row_prefix.begin()) - 1;
}

// Dispatch, pack: counts and offsets per destination (serial: R entries), then every row sent
// (payload, scales, then its token, local experts, slots and weights) in parallel.
void pack_dispatch(Impl& b, const protocol::RowArrays& source) {
  const int R = b.ranks, El = b.El, K = b.routing.topk;
  const auto rec = static_cast<int64_t>(b.rec_bytes);
  int64_t off = 0;
  for (int d = 0; d < R; ++d) {
    const int32_t n = b.routing.dest_rows[static_cast<size_t>(d)];
    int32_t* c = &b.send_counts[static_cast<size_t>(d * (1 + El))];
    c[0] = n;
    std::memcpy(c + 1, &b.routing.dest_expert_rows[static_cast<size_t>(d * El)],
                static_cast<size_t>(El) * 4);
    b.row_prefix[static_cast<size_t>(d)] = off / rec;
    b.sb[d] = n * rec;
    b.so[d] = off;
    off += b.sb[d];
  }
  b.row_prefix[static_cast<size_t>(R)] = off / rec;
  for_range(*b.dp, off / rec, [&](int, int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int d = peer_of(b, g);
      const int32_t t = b.routing.dest_token(d, g - b.row_prefix[static_cast<size_t>(d)]);
      char* r = b.send_buf.get() + g * rec;
      const protocol::RowRef x = source.row(t);
      std::memcpy(r, x.payload, b.XC.payload_bytes);
      if (b.XC.scale_bytes) std::memcpy(r + b.XC.payload_bytes, x.scales, b.XC.scale_bytes);
      auto* meta = reinterpret_cast<int32_t*>(r + b.rec_bytes - b.meta_bytes);
      meta[0] = t;
      for (int j = 0; j < K; ++j) {
        const size_t tk = static_cast<size_t>(t) * static_cast<size_t>(K) + static_cast<size_t>(j);
        const int32_t e = b.routing.topk_idx[tk];
        const bool here = e >= 0 && e / El == d;
        meta[1 + j] = here ? e % El : -1;
        meta[1 + K + j] = here ? b.routing.expert_slot[tk] : -1;
        reinterpret_cast<float*>(meta)[1 + 2 * K + j] = here ? b.routing.topk_weights[tk] : 0.0f;
      }
    }
  });
}

// Dispatch, after the count exchange: every source's rows and each local expert's offset from
// the received counts, then the token alltoallv. Returns the rows received.
int64_t receive_dispatch_rows(Impl& b) {
  const int R = b.ranks, El = b.El;
  const auto rec = static_cast<int64_t>(b.rec_bytes);
  int64_t roff = 0;
  auto* counts = b.recv_count.get<int64_t>();
  std::fill(counts, counts + El, 0);
  for (int s = 0; s < R; ++s) {
    const int32_t* c = &b.recv_counts[static_cast<size_t>(s * (1 + El))];
    b.row_prefix[static_cast<size_t>(s)] = roff / rec;
    b.rb[s] = c[0] * rec;
    b.ro[s] = roff;
    roff += b.rb[s];
    for (int e = 0; e < El; ++e) {
      b.expert_offset[static_cast<size_t>(e * R + s)] = counts[e];
      counts[e] += c[1 + e];
    }
  }
  b.row_prefix[static_cast<size_t>(R)] = roff / rec;
  b.exchange->alltoallv(b.send_buf.get(), b.tok_sb.data(), b.tok_so.data(), b.recv_buf.get(),
                        b.rb.data(), b.ro.data());
  return roff / rec;
}

// Dispatch, unpack: every received row has its own place (its position, or its (expert,
// slot)s in the latency layout).
void unpack_dispatch(Impl& b, int64_t rows) {
  const int R = b.ranks, K = b.routing.topk;
  const auto rec = static_cast<int64_t>(b.rec_bytes);
  const int64_t RT = static_cast<int64_t>(R) * b.T;
  for_range(*b.dp, rows, [&](int, int64_t begin, int64_t end) {
    for (int64_t pos = begin; pos < end; ++pos) {
      const int s = peer_of(b, pos);
      const char* r = b.recv_buf.get() + pos * rec;
      const auto* meta = reinterpret_cast<const int32_t*>(r + b.rec_bytes - b.meta_bytes);
      if (b.layout == Layout::kThroughput) {
        b.unpack_row(b.recv_x, b.recv_scales, pos, r);
        b.recv_src.get<int64_t>()[2 * pos] = s;
        b.recv_src.get<int64_t>()[2 * pos + 1] = meta[0];
        for (int j = 0; j < K; ++j) {
          b.recv_idx.get<int32_t>()[pos * K + j] = meta[1 + j];
          b.recv_w.get<float>()[pos * K + j] = reinterpret_cast<const float*>(meta)[1 + 2 * K + j];
        }
      } else {
        for (int j = 0; j < K; ++j) {
          const int32_t e = meta[1 + j];
          if (e < 0) continue;
          const int64_t p =
              e * RT + b.expert_offset[static_cast<size_t>(e * R + s)] + meta[1 + K + j];
          b.unpack_row(b.lat_x, b.lat_scales, p, r);
          b.lat_src.get<int64_t>()[2 * p] = s;
          b.lat_src.get<int64_t>()[2 * p + 1] = meta[0];
          b.lat_k.get<int8_t>()[p] = static_cast<int8_t>(j);
        }
      }
    }
  });
}

// The views a dispatch returns over the unpacked outputs.
DispatchResult dispatch_result(const Impl& b, int64_t rows) {
  const int El = b.El, K = b.routing.topk;
  const int64_t RT = static_cast<int64_t>(b.ranks) * b.T;
  DispatchResult r;
  const auto scales = static_cast<int64_t>(b.XC.scale_bytes / sizeof(float));
  r.layout = b.layout;
  r.handle = b.seq;
  r.recv_count = TensorView(b.recv_count.get(), DType::kInt64, {El});
  if (b.layout == Layout::kThroughput) {
    r.num_recv_rows = rows;
    r.recv_x = TensorView(b.recv_x.get(), b.cfg.dtype, {rows, b.cfg.hidden});
    if (scales) r.recv_x_scales = TensorView(b.recv_scales.get(), DType::kFP32, {rows, scales});
    r.recv_topk_idx = TensorView(b.recv_idx.get(), DType::kInt32, {rows, K});
    r.recv_topk_weights = TensorView(b.recv_w.get(), DType::kFP32, {rows, K});
    r.recv_src = TensorView(b.recv_src.get(), DType::kInt64, {rows, 2});
  } else {
    r.recv_x = TensorView(b.lat_x.get(), b.cfg.dtype, {El, RT, b.cfg.hidden});
    if (scales) r.recv_x_scales = TensorView(b.lat_scales.get(), DType::kFP32, {El, RT, scales});
    r.recv_src = TensorView(b.lat_src.get(), DType::kInt64, {El, RT, 2});
  }
  return r;
}

}  // namespace

DispatchResult AlltoallBaseline::dispatch(const DispatchArgs& a) {
  Impl& b = *impl_;
  // Pointers first: the shape checks below read the routing arrays.
  UBEP_CHECK_ARG(a.topk_idx.data != nullptr || a.topk_idx.numel() == 0,
                 "dispatch: topk_idx has no data");
  UBEP_CHECK_ARG(a.topk_weights.data != nullptr || a.topk_weights.numel() == 0,
                 "dispatch: topk_weights has no data");
  UBEP_CHECK_ARG(a.layout == Layout::kThroughput || b.cfg.enable_latency_layout,
                 "dispatch: latency layout needs enable_latency_layout");
  b.routing.build(a, b.cfg);
  StageTimer timer(b.stats);
  const protocol::RowArrays source = b.dispatch_source(a);
  b.layout = a.layout;
  ++b.seq;
  pack_dispatch(b, source);
  timer.lap("pack");
  // Sizes first (like MPI_Alltoall of counts), then the tokens and metadata.
  b.tok_sb = b.sb;  // keep the token exchange's sizes (no reallocation: same size)
  b.tok_so = b.so;
  b.exchange_fixed(b.send_counts.data(), b.recv_counts.data(), static_cast<size_t>(1 + b.El) * 4);
  timer.lap("count alltoall");
  const int64_t rows = receive_dispatch_rows(b);
  timer.lap("token alltoallv");
  b.num_recv_rows = rows;
  unpack_dispatch(b, rows);
  timer.lap("unpack");
  return dispatch_result(b, rows);
}

TensorView AlltoallBaseline::combine(const CombineArgs& a) {
  Impl& b = *impl_;
  UBEP_CHECK_ARG(a.handle == b.seq && b.seq != 0, "combine: handle ", a.handle,
                 " does not belong to the last dispatch (", b.seq, ")");
  UBEP_CHECK_ARG(a.x.dtype == b.cdtype, "combine: x dtype ", dtype_name(a.x.dtype),
                 " does not match the buffer's combine dtype ", dtype_name(b.cdtype));
  UBEP_CHECK_ARG(a.x.data != nullptr || a.x.numel() == 0, "combine: x has no data");
  StageTimer timer(b.stats);
  const int64_t RT = static_cast<int64_t>(b.ranks) * b.T;
  const int64_t N = b.routing.num_tokens;
  if (b.layout == Layout::kThroughput) {
    UBEP_CHECK_ARG(a.x.ndim == 2 && a.x.dim(0) == b.num_recv_rows && a.x.dim(1) == b.cfg.hidden,
                   "combine: x must be [", b.num_recv_rows, ", ", b.cfg.hidden, "], got ",
                   a.x.describe());
    baseline::combine_throughput(b, a, timer);
  } else {
    UBEP_CHECK_ARG(
        a.x.ndim == 3 && a.x.dim(0) == b.El && a.x.dim(1) == RT && a.x.dim(2) == b.cfg.hidden,
        "combine: x must be [", b.El, ", ", RT, ", ", b.cfg.hidden, "], got ", a.x.describe());
    baseline::pack_latency_combine(b, a);
    timer.lap("pack");
    const int64_t total = baseline::exchange_latency_combine(b);
    timer.lap("row alltoallv");
    baseline::reduce_latency_combine(b, total);
  }
  timer.lap("unpack + reduce");
  return TensorView(b.y.get(), b.cdtype, {N, b.cfg.hidden});
}

}  // namespace ubep
