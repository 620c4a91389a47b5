// The combine kernel. kCombSend (expert side): every row of this rank's dispatch output is
// copied into its combine window (unless the experts wrote there: zero-copy) and completed by
// its tag. kCombRecv (owner side): one warp per token gathers the token's contributions in the
// fixed order -- ascending rank (throughput) or ascending k (latency) -- waits for each row's
// tag, and reduces them with explicitly rounded fp32 operations, ((0 + w0*r0) + w1*r1) + ...,
// then rounds once to the output dtype: the CPU backend's and the reference's order and bits.
// Rows are read in place in the peers' windows (one copy, like ubep.cpp's combine).
// bsp: a group barrier between the phases.
#pragma once

#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/hd_math.hpp"

namespace ubep::cuda_dev {

__device__ inline void combine_send(const RankCtx& c) {
  const LaunchParams& p = c.p;
  const int R = p.ranks, El = p.local_experts;
  const int64_t RT = p.map.tp_rows();
  const size_t rb = p.map.row_bytes;
  char* comb = c.win<char>(c.rank, p.map.comb_x);
  uint32_t* tags = c.win<uint32_t>(c.rank, p.map.comb_tag);
  const char* in = static_cast<const char*>(c.io.comb_in);
  // Zero-copy: the experts' kernel wrote the rows earlier in stream order, so they happen-before
  // this launch; the release store below carries them to the readers.
  const bool compacted = c.io.comb_in_compacted;
  const bool copy = in != nullptr && (in != comb || compacted);
  const int64_t* range = c.s<int64_t>(p.scratch.recv_range);
  if (compacted && c.s<int64_t>(p.scratch.info)[2] > c.io.comb_in_rows) {
    // Fewer rows than were received: refuse rather than read past the caller's tensor. The
    // report ends every wait of the owners (they give up instead of timing out).
    if (c.gw == 0 && c.lane == 0)
      report(p.error, cuda_hd::kCompactedShort, c.rank, -1, 0, c.s<int64_t>(p.scratch.info)[2],
             static_cast<uint32_t>(c.io.comb_in_rows));
    return;
  }
  // Every valid row of the dispatch output, range by range (the ranges receive() published):
  // `pos` its place in the dispatch output (= in the combine window), `packed` its index in
  // compact order (the input's row when it is compacted).
  int64_t packed = 0;
  for (int le = 0; le < (p.latency ? El : 1); ++le)
    for (int s = 0; s < R; ++s) {
      const int64_t* r = range + 2 * cuda_hd::range_index(p.latency, R, le, s);
      const int64_t at = (p.latency ? le * RT : 0) + r[0];
      for (int64_t q = c.gw; q < r[1]; q += c.W) {
        const int64_t pos = at + q, from = compacted ? packed + q : pos;
        if (copy)
          warp_copy(comb + static_cast<size_t>(pos) * rb, in + static_cast<size_t>(from) * rb, rb,
                    c.lane);
        __syncwarp();
        if (c.lane == 0) publish_tag(tags + pos, p.tag, p.stop_and_wait);
      }
      packed += r[1];
    }
}

template <typename Elem>
struct ElemIO;
template <>
struct ElemIO<uint16_t> {  // bf16
  __device__ static float get(const char* row, int64_t h) {
    return cuda_hd::bf16_to_float(reinterpret_cast<const uint16_t*>(row)[h]);
  }
  __device__ static void put(char* row, int64_t h, float v) {
    reinterpret_cast<uint16_t*>(row)[h] = cuda_hd::float_to_bf16(v);
  }
  static constexpr int kVec = 8;  // elements per 16-byte vector
  __device__ static void unpack(int4 raw, float* v) {
    const uint32_t u[4] = {static_cast<uint32_t>(raw.x), static_cast<uint32_t>(raw.y),
                           static_cast<uint32_t>(raw.z), static_cast<uint32_t>(raw.w)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = cuda_hd::bits_float(u[i] << 16);
      v[2 * i + 1] = cuda_hd::bits_float(u[i] & 0xffff0000u);
    }
  }
  __device__ static int4 pack(const float* v) {
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      u[i] = static_cast<uint32_t>(cuda_hd::float_to_bf16(v[2 * i])) |
             (static_cast<uint32_t>(cuda_hd::float_to_bf16(v[2 * i + 1])) << 16);
    return make_int4(static_cast<int>(u[0]), static_cast<int>(u[1]), static_cast<int>(u[2]),
                     static_cast<int>(u[3]));
  }
};
template <>
struct ElemIO<float> {
  __device__ static float get(const char* row, int64_t h) {
    return reinterpret_cast<const float*>(row)[h];
  }
  __device__ static void put(char* row, int64_t h, float v) {
    reinterpret_cast<float*>(row)[h] = v;
  }
  static constexpr int kVec = 4;
  __device__ static void unpack(int4 raw, float* v) {
    v[0] = __int_as_float(raw.x);
    v[1] = __int_as_float(raw.y);
    v[2] = __int_as_float(raw.z);
    v[3] = __int_as_float(raw.w);
  }
  __device__ static int4 pack(const float* v) {
    return make_int4(__float_as_int(v[0]), __float_as_int(v[1]), __float_as_int(v[2]),
                     __float_as_int(v[3]));
  }
};

// One token's contributions: lane i describes contribution slot i and 32+i (rank r or k j).
struct Contribution {
  const char* row = nullptr;
  const uint32_t* tag = nullptr;
  float w = 0.0f;
  bool on = false;
  int peer = -1;
};

__device__ inline Contribution locate(const RankCtx& c, int64_t t, int i) {
  const LaunchParams& p = c.p;
  const int El = p.local_experts, K = c.io.topk;
  Contribution x;
  int64_t pos;
  if (!p.latency) {
    if (i >= p.ranks) return x;
    const int32_t slot = c.s<int32_t>(p.scratch.dest_slot)[t * p.ranks + i];
    if (slot < 0) return x;
    x.peer = i;
    pos = cuda_hd::tp_position(c.s<int64_t>(p.scratch.row_offset_at)[i], slot);
    x.w = 1.0f;
  } else {
    if (i >= K) return x;
    const int32_t e = c.s<int32_t>(p.scratch.idx)[t * K + i];
    if (e < 0) return x;
    x.peer = e / El;
    const int le = e % El;
    pos = cuda_hd::lat_position(p.map.tp_rows(), le,
                                c.s<int64_t>(p.scratch.expert_offset_at)[x.peer * El + le],
                                c.s<int32_t>(p.scratch.expert_slot)[t * K + i]);
    x.w = c.s<float>(p.scratch.w)[t * K + i];
  }
  x.on = true;
  x.row = c.win<char>(x.peer, p.map.comb_x) + static_cast<size_t>(pos) * p.map.row_bytes;
  x.tag = c.win<uint32_t>(x.peer, p.map.comb_tag) + pos;
  return x;
}

// reduce_token's sums over hidden: this warp's share (part of parts) of the row, the n
// contributions in the fixed order nth(i) gives. The loops run the same trip count on every
// lane (nth() shuffles across the warp: a lane-dependent bound would leave lanes out of a
// full-mask __shfl_sync); lanes past the end of the row only skip the loads and the store.
template <typename Elem, typename Nth>
__device__ inline void reduce_vectors(const RankCtx& c, char* out, int n, int part, int parts,
                                      Nth&& nth) {
  using IO = ElemIO<Elem>;
  constexpr int V = IO::kVec;
  const int64_t H = c.p.hidden;
  const bool weighted = c.p.latency;
  const int64_t step = 32 * V, pieces = (H + step - 1) / step;
  for (int64_t base = pieces * part / parts * step; base < pieces * (part + 1) / parts * step;
       base += step) {
    const int64_t h0 = base + static_cast<int64_t>(c.lane) * V;
    const bool active = h0 < H;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.0f;
    for (int i = 0; i < n; ++i) {
      const char* row;
      float w;
      const uint32_t* tag;
      nth(i, &row, &w, &tag);
      if (!active) continue;
      float v[V];
      IO::unpack(*reinterpret_cast<const int4*>(row + h0 * static_cast<int64_t>(sizeof(Elem))), v);
#pragma unroll
      for (int k = 0; k < V; ++k)
        acc[k] = weighted ? cuda_hd::add_weighted_term(acc[k], w, v[k])
                          : cuda_hd::add_term(acc[k], v[k]);
    }
    if (active)
      *reinterpret_cast<int4*>(out + h0 * static_cast<int64_t>(sizeof(Elem))) = IO::pack(acc);
  }
}

template <typename Elem, typename Nth>
__device__ inline void reduce_scalars(const RankCtx& c, char* out, int n, int part, int parts,
                                      Nth&& nth) {
  using IO = ElemIO<Elem>;
  const int64_t H = c.p.hidden;
  const bool weighted = c.p.latency;
  const int64_t pieces = (H + 31) / 32;
  for (int64_t base = pieces * part / parts * 32; base < pieces * (part + 1) / parts * 32;
       base += 32) {
    const int64_t h = base + c.lane;
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) {
      const char* row;
      float w;
      const uint32_t* tag;
      nth(i, &row, &w, &tag);
      if (h >= H) continue;
      const float v = IO::get(row, h);
      acc = weighted ? cuda_hd::add_weighted_term(acc, w, v) : cuda_hd::add_term(acc, v);
    }
    if (h < H) IO::put(out, h, acc);
  }
}

template <typename Elem>
__device__ inline void reduce_token(const RankCtx& c, int64_t t, int part, int parts) {
  using IO = ElemIO<Elem>;
  const LaunchParams& p = c.p;
  const int64_t H = p.hidden;
  Contribution lo = locate(c, t, c.lane), hi = locate(c, t, 32 + c.lane);
  // Each lane waits for its own contributions' tags (bounded), in parallel.
  bool ok = true;
  if (lo.on)
    ok = wait_tag<true>(lo.tag, p.tag, p.timeout_cycles, p.error, c.rank, lo.peer,
                        cuda_hd::kWaitCombineRow, t);
  if (ok && hi.on)
    ok = wait_tag<true>(hi.tag, p.tag, p.timeout_cycles, p.error, c.rank, hi.peer,
                        cuda_hd::kWaitCombineRow, t);
  if (!__all_sync(0xffffffffu, ok)) return;
  const unsigned m_lo = __ballot_sync(0xffffffffu, lo.on), m_hi = __ballot_sync(0xffffffffu, hi.on);
  const int n = __popc(m_lo) + __popc(m_hi);
  // The i-th contribution in the fixed order (ascending lane in lo, then in hi), broadcast.
  auto nth = [&](int i, const char** row, float* w, const uint32_t** tag) {
    unsigned m = i < __popc(m_lo) ? m_lo : m_hi;
    int k = i < __popc(m_lo) ? i : i - __popc(m_lo);
    for (; k > 0; --k) m &= m - 1;
    const int src = __ffs(static_cast<int>(m)) - 1;
    const bool use_lo = i < __popc(m_lo);
    const auto row_bits = reinterpret_cast<unsigned long long>(use_lo ? lo.row : hi.row);
    const auto tag_bits = reinterpret_cast<unsigned long long>(use_lo ? lo.tag : hi.tag);
    *row = reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, row_bits, src));
    *tag = reinterpret_cast<const uint32_t*>(__shfl_sync(0xffffffffu, tag_bits, src));
    *w = __shfl_sync(0xffffffffu, use_lo ? lo.w : hi.w, src);
  };
  // Every lane acquires every row's tag itself before reading the row (already arrived: one
  // load each), so its reads are ordered after the writer's release without a warp barrier.
  for (int i = 0; i < n; ++i) {
    const char* row;
    float w;
    const uint32_t* tag;
    nth(i, &row, &w, &tag);
    (void)ld_acquire_sys(tag);
  }
  char* out = static_cast<char*>(c.io.y) + static_cast<size_t>(t) * p.map.row_bytes;
  if (H % IO::kVec == 0)
    reduce_vectors<Elem>(c, out, n, part, parts, nth);
  else
    reduce_scalars<Elem>(c, out, n, part, parts, nth);
}

template <class Peers>
__global__ void __launch_bounds__(512, 1) combine_kernel(const LaunchParams p) {
  const RankCtx c = make_ctx<Peers>(p);
  if (p.phases & cuda_hd::kCombSend) {
    start_delay(c);
    combine_send(c);
  }
  if (p.bsp) Peers::group_barrier(p, 0);
  if (p.phases & cuda_hd::kCombRecv) {
    // Work items (token, part of the row): with fewer tokens than warps (decode), several
    // warps share a token's row, each a contiguous run of 32-lane pieces, so every warp of the
    // rank has work. The same fixed order per element: parts only split the elements.
    const int64_t n = c.io.tokens;
    const int64_t piece =
        p.elem_bytes == 2 ? (p.hidden % 8 == 0 ? 256 : 32) : (p.hidden % 4 == 0 ? 128 : 32);
    const int64_t max_parts = (p.hidden + piece - 1) / piece;
    const int parts = static_cast<int>(
        n > 0 ? (c.W / n < 1 ? 1 : (c.W / n > max_parts ? max_parts : c.W / n)) : 1);
    for (int64_t item = c.gw; item < n * parts; item += c.W) {
      const int64_t t = item / parts;
      const int part = static_cast<int>(item % parts);
      if (p.elem_bytes == 2)
        reduce_token<uint16_t>(c, t, part, parts);
      else
        reduce_token<float>(c, t, part, parts);
    }
  }
}

}  // namespace ubep::cuda_dev
