#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "baseline/exchange.hpp"
#include "baseline/team.hpp"
#include "core/local_array.hpp"
#include "core/stage_timer.hpp"
#include "ep/routing.hpp"
#include "protocol/protocol.hpp"
#include "ubep/baseline.hpp"
#include "ubep/bf16.hpp"
#include "ubep/error.hpp"
#include "protocol/config_checks.hpp"
#include "ubep/fp8.hpp"

namespace ubep {

using baseline::for_range;

namespace {

// Rejects every config that would divide by zero or size nothing, before anything is sized.
const BufferConfig& checked(const Group& g, const BufferConfig& c) {
  protocol::check_buffer_config(c, g.size(), "AlltoallBaseline");
  return c;
}

}  // namespace

struct AlltoallBaseline::Impl {
  struct Contribution {
    int rank;
    const char* row;
    const float* weight;
  };
  // Per team member: the reduction's scratch.
  struct Scratch {
    std::vector<Contribution> contrib;
    std::vector<const void*> rows;
    std::vector<float> weights, acc, part;
  };
  Group& group;
  BufferConfig cfg;
  std::unique_ptr<baseline::Exchange> exchange;  // after cfg: a bad config throws before set-up
  int rank, ranks, El;
  int64_t T;
  DType cdtype;           // combine_dtype(cfg)
  protocol::RowCodec XC;  // dispatch rows: on the wire payload then scales (protocol.hpp)
  size_t XB;              // XC.row_bytes()
  size_t RB, meta_bytes, rec_bytes;  // RB: a combine row
  ep::Routing routing;
  CallStats stats;
  Layout layout = Layout::kThroughput;
  uint64_t seq = 0;
  int64_t num_recv_rows = 0;

  // Count exchange: [R][1 + El] int32 (rows, then rows per local expert).
  std::vector<int32_t> send_counts, recv_counts;
  std::vector<int64_t> sb, so, rb, ro;  // alltoallv bytes / offsets
  std::vector<int64_t> tok_sb, tok_so;
  std::vector<int64_t> per_owner, fill, expect, where;  // latency combine scratch
  std::vector<int64_t> pack_row;                        // latency combine: source row of slot i
  std::vector<int64_t> row_prefix;                      // [R + 1] rows before each peer's block
  LocalArray send_buf, recv_buf;
  LocalArray recv_x, recv_idx, recv_w, recv_src, recv_count, lat_x, lat_src, lat_k, y;
  LocalArray recv_scales, lat_scales, cast_x, cast_scales;  // fp8 only
  LocalArray comb_send, comb_recv;
  std::vector<int64_t> expert_offset;                   // [El, R]
  std::vector<int32_t> comb_meta_send, comb_meta_recv;  // latency combine: (token, k) per row
  std::vector<Scratch> scratch;                         // [team size]
  // Its loops' roles and the fixed-order reduction: the CPU backend, through its interface.
  std::unique_ptr<backend::DataPath> dp;

  Impl(Group& g, const BufferConfig& c)
      : group(g),
        cfg(checked(g, c)),
        exchange(baseline::make_exchange(g)),
        rank(g.rank()),
        ranks(g.size()),
        El(c.num_experts / g.size()),
        T(c.max_tokens_per_rank),
        cdtype(combine_dtype(c)),
        XC(protocol::row_codec(c.dtype, c.hidden)),
        XB(XC.row_bytes()),
        RB(static_cast<size_t>(c.hidden) * dtype_size(cdtype)),
        meta_bytes(protocol::round_up(8 + 12 * static_cast<size_t>(c.max_topk), 16)),
        rec_bytes(protocol::round_up(XB, 4) + meta_bytes),
        routing(g.size(), c.num_experts, c.max_tokens_per_rank, c.max_topk),
        dp(baseline::make_roles(g, c)) {
    const auto R = static_cast<size_t>(ranks), Tz = static_cast<size_t>(T),
               K = static_cast<size_t>(c.max_topk);
    send_counts.resize(R * (1 + static_cast<size_t>(El)));
    recv_counts.resize(send_counts.size());
    sb.resize(R);
    so.resize(R);
    rb.resize(R);
    ro.resize(R);
    send_buf = LocalArray(R * Tz * rec_bytes);
    recv_buf = LocalArray(R * Tz * rec_bytes);
    recv_x = LocalArray(R * Tz * XC.payload_bytes);
    if (XC.scale_bytes) {
      recv_scales = LocalArray(R * Tz * XC.scale_bytes);
      cast_x = LocalArray(Tz * XC.payload_bytes);
      cast_scales = LocalArray(Tz * XC.scale_bytes);
      if (c.enable_latency_layout)
        lat_scales = LocalArray(static_cast<size_t>(El) * R * Tz * XC.scale_bytes);
    }
    recv_idx = LocalArray(R * Tz * K * 4);
    recv_w = LocalArray(R * Tz * K * 4);
    recv_src = LocalArray(R * Tz * 16);
    recv_count = LocalArray(static_cast<size_t>(El) * 8);
    if (c.enable_latency_layout) {
      lat_x = LocalArray(static_cast<size_t>(El) * R * Tz * XC.payload_bytes);
      lat_src = LocalArray(static_cast<size_t>(El) * R * Tz * 16);
      lat_k = LocalArray(static_cast<size_t>(El) * R * Tz);
    }
    y = LocalArray(Tz * RB);
    comb_send = LocalArray(R * Tz * K * RB);
    comb_recv = LocalArray(R * Tz * K * RB);
    comb_meta_send.resize(R * Tz * K * 2);
    comb_meta_recv.resize(R * Tz * K * 2);
    expert_offset.resize(static_cast<size_t>(El) * R);
    per_owner.resize(R);
    fill.resize(R);
    expect.resize(R);
    where.resize(Tz * K);
    pack_row.resize(R * Tz * K);
    row_prefix.resize(R + 1);
    scratch.resize(static_cast<size_t>(dp->members()));
    for (Scratch& sc : scratch) {
      sc.acc.resize(static_cast<size_t>(c.hidden));
      sc.part.resize(static_cast<size_t>(c.hidden));
      sc.contrib.reserve(static_cast<size_t>(std::max(ranks, c.max_topk)));
      sc.rows.reserve(sc.contrib.capacity());
      sc.weights.reserve(sc.contrib.capacity());
    }
    stats.stage_us.reserve(8);
  }

  // This rank's dispatch rows: x (and x_scales) as given, or bf16/fp32 x cast to fp8 with the
  // same codec as ubep::Buffer (split over the team; each member writes only its tokens).
  protocol::RowArrays dispatch_source(const DispatchArgs& a) {
    if (cfg.dtype != DType::kFP8E4M3 || a.x.dtype == DType::kFP8E4M3)
      return {static_cast<const char*>(a.x.data), static_cast<const char*>(a.x_scales.data), XC};
    const int64_t H = cfg.hidden, blocks = fp8_scales_per_row(H);
    for_range(*dp, routing.num_tokens, [&](int, int64_t t0, int64_t t1) {
      fp8_quantize_rows(
          static_cast<const char*>(a.x.data) + static_cast<size_t>(t0 * H) * dtype_size(a.x.dtype),
          a.x.dtype, t1 - t0, H, cfg.fp8_pow2_scales, cast_x.get<uint8_t>() + t0 * H,
          cast_scales.get<float>() + t0 * blocks);
    });
    return {cast_x.get(), cast_scales.get(), XC};
  }
  // A received wire row into row `pos` of the payload and scale outputs.
  void unpack_row(const LocalArray& x, const LocalArray& scales, int64_t pos, const char* wire) {
    const auto p = static_cast<size_t>(pos);
    std::memcpy(x.get() + p * XC.payload_bytes, wire, XC.payload_bytes);
    if (XC.scale_bytes)
      std::memcpy(scales.get() + p * XC.scale_bytes, wire + XC.payload_bytes, XC.scale_bytes);
  }

  void exchange_fixed(const void* send, void* recv, size_t bytes_each) {
    for (int p = 0; p < ranks; ++p) {
      sb[p] = rb[p] = static_cast<int64_t>(bytes_each);
      so[p] = ro[p] = static_cast<int64_t>(bytes_each) * p;
    }
    exchange->alltoallv(send, sb.data(), so.data(), recv, rb.data(), ro.data());
  }

  // Reduces one token's contributions, given in the fixed order (ascending rank or k) with the
  // rank that computed each: per host from 0, then host partials in ascending host order (the
  // first taken as is) -- on one host simply the sum in the given order. Same order as ubep.
  void reduce(char* out, Scratch& sc) {
    const std::vector<Contribution>& cs = sc.contrib;
    std::vector<float>& acc = sc.acc;
    std::vector<float>& part = sc.part;
    const int64_t H = cfg.hidden;
    if (group.num_hosts() == 1) {  // the same fused kernel as ubep::Buffer
      sc.rows.clear();
      sc.weights.clear();
      for (const Contribution& c : cs) {
        sc.rows.push_back(c.row);
        sc.weights.push_back(c.weight ? *c.weight : 1.0f);
      }
      const bool weighted = !cs.empty() && cs.front().weight;
      dp->reduce_rows(out, cdtype, H, sc.rows.data(), weighted ? sc.weights.data() : nullptr,
                      static_cast<int>(cs.size()), /*stream=*/false);
      return;
    }
    bool first = true;
    for (int h = 0; h < group.num_hosts(); ++h) {
      float* p = group.num_hosts() == 1 ? acc.data() : part.data();
      std::fill(p, p + H, 0.0f);
      bool any = false;
      for (const Contribution& c : cs) {
        if (group.host_of(c.rank) != h) continue;
        dp->accumulate_row(p, c.row, cdtype, H, c.weight);
        any = true;
      }
      if (!any) continue;
      if (p != acc.data()) {
        if (first)
          std::copy(p, p + H, acc.data());
        else
          for (int64_t i = 0; i < H; ++i) acc[static_cast<size_t>(i)] += p[i];
      }
      first = false;
    }
    if (first) std::fill(acc.begin(), acc.end(), 0.0f);
    dp->store_row(out, acc.data(), cdtype, H);
  }
};

AlltoallBaseline::AlltoallBaseline(Group& g, BufferConfig c)
    : impl_(std::make_unique<Impl>(g, c)) {}
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

// Throughput combine: rows are already grouped by source rank, so they go straight from x (no
// pack); rank p returns my rows in the order I sent them, so token t's row from p is at its
// slot among my tokens for p. Accumulates per token in ascending rank order.
void combine_throughput(Impl& b, const CombineArgs& a, StageTimer& timer) {
  const int R = b.ranks, El = b.El;
  const auto RB = static_cast<int64_t>(b.RB);
  int64_t off = 0, roff = 0;
  for (int p = 0; p < R; ++p) {
    const int64_t n_back = b.recv_counts[static_cast<size_t>(p * (1 + El))];
    b.sb[p] = n_back * RB;
    b.so[p] = off;
    off += b.sb[p];
    b.rb[p] = b.routing.dest_rows[static_cast<size_t>(p)] * RB;
    b.ro[p] = roff;
    roff += b.rb[p];
  }
  b.exchange->alltoallv(a.x.data, b.sb.data(), b.so.data(), b.comb_recv.get(), b.rb.data(),
                        b.ro.data());
  timer.lap("row alltoallv");
  for_range(*b.dp, b.routing.num_tokens, [&](int m, int64_t begin, int64_t end) {
    Impl::Scratch& sc = b.scratch[static_cast<size_t>(m)];
    for (int64_t t = begin; t < end; ++t) {
      sc.contrib.clear();
      for (int p = 0; p < R; ++p) {
        if (!b.routing.sent(t, p)) continue;
        sc.contrib.push_back(
            {p, b.comb_recv.get() + b.ro[p] + b.routing.slot_at(t, p) * RB, nullptr});
      }
      b.reduce(b.y.get() + t * RB, sc);
    }
  });
}

// Latency combine, pack: rows per owner with their (token, k), the slots serially (integers),
// the rows' bytes in parallel. Leaves b.per_owner (rows per owner) and b.so (the owners' first
// rows) for the exchange.
void pack_latency_combine(Impl& b, const CombineArgs& a) {
  const int R = b.ranks, El = b.El;
  const int64_t RT = static_cast<int64_t>(R) * b.T;
  const auto RB = static_cast<int64_t>(b.RB);
  const auto* counts = b.recv_count.get<int64_t>();
  const auto* src = b.lat_src.get<int64_t>();
  std::vector<int64_t>& per_owner = b.per_owner;
  std::fill(per_owner.begin(), per_owner.end(), 0);
  for (int e = 0; e < El; ++e)
    for (int64_t p = 0; p < counts[e]; ++p) ++per_owner[static_cast<size_t>(src[2 * (e * RT + p)])];
  int64_t off = 0;
  for (int p = 0; p < R; ++p) {
    b.so[p] = off;
    off += per_owner[static_cast<size_t>(p)];
  }
  std::vector<int64_t>& fill = b.fill;
  fill.assign(b.so.begin(), b.so.end());
  for (int e = 0; e < El; ++e) {
    for (int64_t p = 0; p < counts[e]; ++p) {
      const int64_t row = e * RT + p;
      const int owner = static_cast<int>(src[2 * row]);
      const int64_t i = fill[static_cast<size_t>(owner)]++;
      b.pack_row[static_cast<size_t>(i)] = row;
      b.comb_meta_send[static_cast<size_t>(2 * i)] = static_cast<int32_t>(src[2 * row + 1]);
      b.comb_meta_send[static_cast<size_t>(2 * i + 1)] = b.lat_k.get<int8_t>()[row];
    }
  }
  for_range(*b.dp, off, [&](int, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(b.comb_send.get() + i * RB,
                  static_cast<const char*>(a.x.data) + b.pack_row[static_cast<size_t>(i)] * RB,
                  b.RB);
  });
}

// Latency combine, exchange: the rows, then their (token, k) records, from and to every expert
// rank (the rows I expect from one: my (token, k) pairs whose expert lives there). Returns the
// rows received.
int64_t exchange_latency_combine(Impl& b) {
  const int R = b.ranks, El = b.El, K = b.routing.topk;
  const auto RB = static_cast<int64_t>(b.RB);
  const int64_t N = b.routing.num_tokens;
  const std::vector<int64_t>& per_owner = b.per_owner;
  std::vector<int64_t>& expect = b.expect;
  std::fill(expect.begin(), expect.end(), 0);
  for (int64_t t = 0; t < N; ++t)
    for (int j = 0; j < K; ++j) {
      const int32_t e = b.routing.topk_idx[static_cast<size_t>(t * K + j)];
      if (e >= 0) ++expect[static_cast<size_t>(e / El)];
    }
  int64_t roff = 0;
  for (int p = 0; p < R; ++p) {
    b.sb[p] = per_owner[static_cast<size_t>(p)] * RB;
    b.so[p] *= RB;
    b.rb[p] = expect[static_cast<size_t>(p)] * RB;
    b.ro[p] = roff;
    roff += b.rb[p];
  }
  b.exchange->alltoallv(b.comb_send.get(), b.sb.data(), b.so.data(), b.comb_recv.get(), b.rb.data(),
                        b.ro.data());
  for (int p = 0; p < R; ++p) {
    b.sb[p] = per_owner[static_cast<size_t>(p)] * 8;
    b.so[p] = b.so[p] / RB * 8;
    b.rb[p] = expect[static_cast<size_t>(p)] * 8;
    b.ro[p] = b.ro[p] / RB * 8;
  }
  b.exchange->alltoallv(b.comb_meta_send.data(), b.sb.data(), b.so.data(), b.comb_meta_recv.data(),
                        b.rb.data(), b.ro.data());
  return roff / RB;
}

// Latency combine, unpack + reduce: the received rows into (token, k) order, then each token
// reduced in ascending k.
void reduce_latency_combine(Impl& b, int64_t total) {
  const int El = b.El, K = b.routing.topk, Kmax = b.cfg.max_topk;
  const auto RB = static_cast<int64_t>(b.RB);
  const int64_t N = b.routing.num_tokens;
  std::vector<int64_t>& where = b.where;
  std::fill(where.begin(), where.begin() + N * Kmax, -1);
  for (int64_t i = 0; i < total; ++i)
    where[static_cast<size_t>(b.comb_meta_recv[static_cast<size_t>(2 * i)] * Kmax +
                              b.comb_meta_recv[static_cast<size_t>(2 * i + 1)])] = i;
  for_range(*b.dp, N, [&](int m, int64_t begin, int64_t end) {
    Impl::Scratch& sc = b.scratch[static_cast<size_t>(m)];
    for (int64_t t = begin; t < end; ++t) {
      sc.contrib.clear();
      for (int j = 0; j < K; ++j) {
        const size_t tk = static_cast<size_t>(t * K + j);
        if (b.routing.topk_idx[tk] < 0) continue;
        sc.contrib.push_back({b.routing.topk_idx[tk] / El,
                              b.comb_recv.get() + where[static_cast<size_t>(t * Kmax + j)] * RB,
                              &b.routing.topk_weights[tk]});
      }
      b.reduce(b.y.get() + t * RB, sc);
    }
  });
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
    combine_throughput(b, a, timer);
  } else {
    UBEP_CHECK_ARG(
        a.x.ndim == 3 && a.x.dim(0) == b.El && a.x.dim(1) == RT && a.x.dim(2) == b.cfg.hidden,
        "combine: x must be [", b.El, ", ", RT, ", ", b.cfg.hidden, "], got ", a.x.describe());
    pack_latency_combine(b, a);
    timer.lap("pack");
    const int64_t total = exchange_latency_combine(b);
    timer.lap("row alltoallv");
    reduce_latency_combine(b, total);
  }
  timer.lap("unpack + reduce");
  return TensorView(b.y.get(), b.cdtype, {N, b.cfg.hidden});
}

}  // namespace ubep
