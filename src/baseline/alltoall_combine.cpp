// The MPI baseline's combine: each layout's pack -> alltoallv -> unpack and fixed-order reduce.
#include "baseline/alltoall_impl.hpp"

namespace ubep::baseline {

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

}  // namespace ubep::baseline
