// The MPI baseline's state (AlltoallBaseline::Impl: sized once at construction) and its combine
// steps, shared by mpi_baseline.cpp (set-up, dispatch, the calls) and alltoall_combine.cpp.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/data_path.hpp"
#include "baseline/exchange.hpp"
#include "baseline/team.hpp"
#include "core/local_array.hpp"
#include "core/stage_timer.hpp"
#include "ep/routing.hpp"
#include "protocol/config_checks.hpp"
#include "protocol/protocol.hpp"
#include "ubep/baseline.hpp"
#include "ubep/bf16.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"

namespace ubep {

using baseline::for_range;

namespace baseline {
// Rejects every config that would divide by zero or size nothing, before anything is sized.
inline const BufferConfig& checked_config(const Group& g, const BufferConfig& c) {
  protocol::check_buffer_config(c, g.size(), "AlltoallBaseline");
  return c;
}
}  // namespace baseline

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

  Impl(Group& g, const BufferConfig& c, std::unique_ptr<baseline::Exchange> ex = nullptr)
      : group(g),
        cfg(baseline::checked_config(g, c)),
        exchange(ex ? std::move(ex) : baseline::make_exchange(g)),
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
                      static_cast<int>(cs.size()), /*stream=*/false, nullptr, 0,
                      /*sequential=*/false);
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

namespace baseline {
using Impl = AlltoallBaseline::Impl;
// Combine steps (alltoall_combine.cpp): the throughput layout in one; the latency layout as
// pack, exchange (returns the rows received) and reduce.
void combine_throughput(Impl& b, const CombineArgs& a, StageTimer& timer);
void pack_latency_combine(Impl& b, const CombineArgs& a);
int64_t exchange_latency_combine(Impl& b);
void reduce_latency_combine(Impl& b, int64_t total);
}  // namespace baseline

}  // namespace ubep
