// The dispatch kernel: the ubep algorithm's roles as warps of one launch (ubep.cpp is the CPU
// version; its comment argues why halves by parity and epoch tags make cleaning unnecessary,
// and the same argument holds here because calls on one rank stay in stream order).
//
// Per rank (VirtualPeers: blockIdx / blocks_per_rank; IpcPeers: this process's rank):
//  1. routing (all blocks): sanitized topk copy; warp per destination rank scans the tokens in
//     chunks of 32 (ballot + prefix popcount) for dest_slot/dest_tokens, and per-expert slots in
//     token order (shared-memory counts), i.e. exactly ep::Routing::build's numbering.
//     Each block then raises routing_done[b] = gen (release, gpu scope); block 0 waits for all.
//  2. count role (block 0, warp 0): one count record to every destination, rotated order,
//     completed by its tag (release, system scope). No wait before it.
//  3. offset role (block 0, warp w takes destinations w, w+warps, ...): computes where this
//     rank's rows start at that destination and raises offsets_ready[d] = gen (release, gpu
//     scope). Compact placement: after waiting point to point for the count records of the lower
//     ranks there (the only dependency on a peer). Per-source: its fixed region, no wait -- the
//     signal then only carries the routing of every block to the token warps.
//  4. token warps (every warp of the rank): per destination, wait for offsets_ready[d], then
//     rows gw, gw+W, ...: 16-byte copies straight into the final place, metadata, __syncwarp,
//     lane 0 publishes the row's tag (release, system scope).
//  5. receive (kRecv, may be a separate launch: split phase): wait for every count record at
//     this rank, each source's (begin, count) range per expert, then every expected row's tag.
//  kCompact (a launch of its own, after the receive): the valid rows copied densely.
// bsp: the same code with a group barrier after 2 and after 4 (then every wait is satisfied).
#pragma once

#include "backend/cuda/peers.cuh"
#include "backend/cuda/routing_hd.hpp"

namespace ubep::cuda_dev {

using cuda_hd::RankIO;
using cuda_hd::ScratchLayout;

struct RankCtx {
  const LaunchParams& p;
  const RankIO& io;
  int lr, rank, b, lane, warp, warps, gw, W;
  char* sc;
  __device__ char* base(int r) const { return p.bases[r]; }
  template <typename T>
  __device__ T* s(size_t region) const {
    return p.scratch.at<T>(sc, region);
  }
  template <typename T>
  __device__ T* win(int r, size_t region) const {
    return p.map.at<T>(p.bases[r], p.half, region);
  }
  __device__ const uint32_t* count_tag(int dest, int src) const {
    return p.stop_and_wait ? p.map.count_flag(p.bases[dest], p.half, src)
                           : p.map.count(p.bases[dest], p.half, src).tag();
  }
};

// 1. Routing of this rank's tokens (see the file comment). smem: per warp [32*K] + [El] int32.
__device__ inline void route(const RankCtx& c, int* smem) {
  const LaunchParams& p = c.p;
  const int R = p.ranks, El = p.local_experts, K = c.io.topk;
  const int64_t n = c.io.tokens, T = p.scratch.max_tokens;
  int32_t* idx = c.s<int32_t>(p.scratch.idx);
  float* w = c.s<float>(p.scratch.w);
  int32_t* eslot = c.s<int32_t>(p.scratch.expert_slot);
  int32_t* dslot = c.s<int32_t>(p.scratch.dest_slot);
  int32_t* dtok = c.s<int32_t>(p.scratch.dest_tokens);
  const int stride = p.blocks_per_rank * static_cast<int>(blockDim.x);
  for (int64_t i = c.b * static_cast<int>(blockDim.x) + threadIdx.x; i < n * K; i += stride) {
    const int64_t e = c.io.topk_idx[i];
    const int32_t s =
        cuda_hd::expert_at(c.io.topk_idx, i / K, static_cast<int>(i % K), K, p.experts);
    if (s != e && e != -1) report(p.error, cuda_hd::kBadExpert, c.rank, -1, 0, i, 0);
    idx[i] = s;
    w[i] = c.io.topk_w[i];
    if (s < 0) eslot[i] = -1;  // the destination task below writes the others
  }
  if (c.b == 0 && threadIdx.x == 0) {
    c.s<int64_t>(p.scratch.info)[0] = n;
    c.s<int64_t>(p.scratch.info)[1] = K;
  }
  int* chunk = smem + c.warp * (32 * K + El);  // [32][K] experts on r (-1 elsewhere)
  int* ecount = chunk + 32 * K;                // [El] running rows per local expert of r
  for (int r = c.gw; r < R; r += c.W) {
    for (int le = c.lane; le < El; le += 32) ecount[le] = 0;
    int32_t rows = 0;
    for (int64_t c0 = 0; c0 < n; c0 += 32) {
      const int64_t t = c0 + c.lane;
      const bool on =
          cuda_hd::chunk_row(c.io.topk_idx, t, n, K, p.experts, El, r, chunk + c.lane * K);
      __syncwarp();  // the chunk table (and, first time, ecount's zeros) before any lane reads it
      const unsigned ballot = __ballot_sync(0xffffffffu, on);
      if (t < n) {
        const int32_t slot = on ? cuda_hd::chunk_dest_slot(rows, ballot, c.lane) : -1;
        dslot[t * R + r] = slot;
        if (on) dtok[static_cast<int64_t>(r) * T + slot] = static_cast<int32_t>(t);
        for (int j = 0; j < K; ++j) {
          const int e = chunk[c.lane * K + j];
          if (e >= 0)
            eslot[t * K + j] = cuda_hd::chunk_expert_slot(chunk, K, c.lane, e, ecount[e - r * El]);
        }
      }
      __syncwarp();  // every lane read ecount before the lanes update it
      for (int le = c.lane; le < El; le += 32)
        ecount[le] += cuda_hd::chunk_expert_count(chunk, K, r * El + le);
      rows += cuda_hd::popcount(ballot);
      __syncwarp();  // updates done before the next chunk overwrites the table
    }
    if (c.lane == 0) c.s<int32_t>(p.scratch.dest_rows)[r] = rows;
    for (int le = c.lane; le < El; le += 32)
      c.s<int32_t>(p.scratch.dest_expert_rows)[r * El + le] = ecount[le];
    __syncwarp();
  }
}

// Rank-local meeting after routing: block b's writes, then routing_done[b] = gen (release,
// after the CTA barrier and a fence, the grid-sync pattern); block 0 acquires every block's
// flag before its count and offset roles read the routing. Token warps of other blocks read
// routing only after acquiring offsets_ready, which block 0 raises after this meeting.
__device__ inline void routing_meet(const RankCtx& c) {
  const LaunchParams& p = c.p;
  uint32_t* done = c.s<uint32_t>(p.scratch.routing_done);
  __syncthreads();
  if (c.b != 0) {
    if (threadIdx.x == 0) {
      __threadfence();
      st_release_gpu(done + c.b, p.gen);
    }
    return;
  }
  for (int t = 1 + static_cast<int>(threadIdx.x); t < p.blocks_per_rank;
       t += static_cast<int>(blockDim.x))
    wait_tag<false>(done + t, p.gen, p.timeout_cycles, p.error, c.rank, c.rank, cuda_hd::kWaitLocal,
                    t);
  __syncthreads();
}

// 2. Count role: block 0, warp 0.
__device__ inline void send_counts(const RankCtx& c) {
  const LaunchParams& p = c.p;
  const int R = p.ranks, El = p.local_experts;
  for (int k = 1; k <= R; ++k) {
    const int d = (c.rank + k) % R;
    protocol::CountRecord rec = p.map.count(c.base(d), p.half, c.rank);
    if (c.lane == 0) {
      *rec.rows() = c.s<int32_t>(p.scratch.dest_rows)[d];
      *rec.topk() = c.io.topk;
      *rec.shape() = cuda_hd::call_shape_of(p.latency, p.per_source);
    }
    for (int le = c.lane; le < El; le += 32)
      rec.expert_rows()[le] = c.s<int32_t>(p.scratch.dest_expert_rows)[d * El + le];
    __syncwarp();
    if (c.lane == 0)
      publish_tag(p.stop_and_wait ? p.map.count_flag(c.base(d), p.half, c.rank) : rec.tag(), p.tag,
                  p.stop_and_wait);
  }
}

// 3. Offset role for destination d (one warp). Compact: the count records of the sources below
// this rank (each lane acquires them itself); per-source: nothing to wait for.
__device__ inline void compute_offsets(const RankCtx& c, int d) {
  const LaunchParams& p = c.p;
  const int El = p.local_experts;
  const int64_t T = p.scratch.max_tokens;
  int64_t rows = 0;
  int64_t* eo = c.s<int64_t>(p.scratch.expert_offset_at) + static_cast<int64_t>(d) * El;
  for (int le = c.lane; le < El; le += 32) eo[le] = 0;
  for (int s = 0; s < (p.per_source ? 0 : c.rank); ++s) {
    wait_tag<true>(c.count_tag(d, s), p.tag, p.timeout_cycles, p.error, c.rank, s,
                   cuda_hd::kWaitCount, d);
    protocol::CountRecord rec = p.map.count(c.base(d), p.half, s);
    rows += *rec.rows();
    for (int le = c.lane; le < El; le += 32) eo[le] += rec.expert_rows()[le];
  }
  for (int le = c.lane; le < El; le += 32)
    eo[le] = cuda_hd::source_offset(p.per_source, c.rank, T, eo[le]);
  if (c.lane == 0)
    c.s<int64_t>(p.scratch.row_offset_at)[d] =
        cuda_hd::source_offset(p.per_source, c.rank, T, rows);
  __syncwarp();
  if (c.lane == 0) {
    __threadfence();
    st_release_gpu(c.s<uint32_t>(p.scratch.offsets_ready) + d, p.gen);
  }
}

// 4. Token warps: this warp's rows for every destination.
__device__ inline void send_rows(const RankCtx& c) {
  const LaunchParams& p = c.p;
  const int R = p.ranks, El = p.local_experts, K = c.io.topk;
  const int64_t T = p.scratch.max_tokens, RT = p.map.tp_rows();
  const size_t rb = p.map.row_bytes;
  const int32_t* idx = c.s<int32_t>(p.scratch.idx);
  const float* w = c.s<float>(p.scratch.w);
  const int32_t* eslot = c.s<int32_t>(p.scratch.expert_slot);
  for (int k = 1; k <= R; ++k) {
    const int d = (c.rank + k) % R;
    // Warp-uniform outcome: a lane that gave up (another thread timed out) and a lane that saw
    // the signal must not split, or the __syncwarp below would wait for absent lanes.
    if (!__all_sync(0xffffffffu, wait_tag<false>(c.s<uint32_t>(p.scratch.offsets_ready) + d, p.gen,
                                                 p.timeout_cycles, p.error, c.rank, c.rank,
                                                 cuda_hd::kWaitLocal, d)))
      return;
    const int32_t n = c.s<int32_t>(p.scratch.dest_rows)[d];
    const int64_t row_off = c.s<int64_t>(p.scratch.row_offset_at)[d];
    const int64_t* eo = c.s<int64_t>(p.scratch.expert_offset_at) + static_cast<int64_t>(d) * El;
    for (int64_t i = c.gw; i < n; i += c.W) {
      const int32_t t = c.s<int32_t>(p.scratch.dest_tokens)[d * T + i];
      const char* row = static_cast<const char*>(c.io.x) + static_cast<size_t>(t) * rb;
      const int64_t src = c.lane == 0 ? int64_t{c.rank} : int64_t{t};  // lanes 0, 1: (rank, token)
      if (!p.latency) {
        const int64_t pos = cuda_hd::tp_position(row_off, i);
        warp_copy(c.win<char>(d, p.map.tp_x) + static_cast<size_t>(pos) * rb, row, rb, c.lane);
        if (c.lane < 2) c.win<int64_t>(d, p.map.tp_src)[2 * pos + c.lane] = src;
        for (int j = c.lane; j < K; j += 32) {
          const int32_t e = idx[t * K + j];
          const bool here = e >= 0 && e / El == d;
          c.win<int32_t>(d, p.map.tp_idx)[pos * K + j] = here ? e % El : -1;
          c.win<float>(d, p.map.tp_w)[pos * K + j] = here ? w[t * K + j] : 0.0f;
        }
        __syncwarp();
        if (c.lane == 0)
          publish_tag(c.win<uint32_t>(d, p.map.tp_tag) + pos, p.tag, p.stop_and_wait);
      } else {
        for (int j = 0; j < K; ++j) {
          const int32_t e = idx[t * K + j];
          if (e < 0 || e / El != d) continue;
          const int le = e % El;
          const int64_t pos = cuda_hd::lat_position(RT, le, eo[le], eslot[t * K + j]);
          warp_copy(c.win<char>(d, p.map.lat_x) + static_cast<size_t>(pos) * rb, row, rb, c.lane);
          protocol::LatencyRecord* rec = c.win<protocol::LatencyRecord>(d, p.map.lat_rec) + pos;
          if (c.lane == 0) rec->token_k = protocol::LatencyRecord::pack(t, j);
          __syncwarp();
          if (c.lane == 0) publish_tag(&rec->tag, p.tag, p.stop_and_wait);
        }
      }
    }
  }
}

// 5. Receive: every warp waits for the count records (each lane acquires them itself before
// reading them), warp 0 publishes recv_count and each source's range, then the lanes wait for
// disjoint sets of row tags, source range by source range.
__device__ inline void receive(const RankCtx& c) {
  const LaunchParams& p = c.p;
  const int R = p.ranks, El = p.local_experts;
  const int64_t RT = p.map.tp_rows(), T = p.scratch.max_tokens;
  const int32_t shape = cuda_hd::call_shape_of(p.latency, p.per_source);
  int64_t rows = 0;
  for (int s = 0; s < R; ++s) {
    if (!__all_sync(0xffffffffu, wait_tag<true>(c.count_tag(c.rank, s), p.tag, p.timeout_cycles,
                                                p.error, c.rank, s, cuda_hd::kWaitCount, c.rank)))
      return;
    protocol::CountRecord rec = p.map.count(c.base(c.rank), p.half, s);
    rows += *rec.rows();
    if (c.gw == 0 && c.lane == 0 && *rec.topk() != c.io.topk)
      report(p.error, cuda_hd::kTopkMismatch, c.rank, s, 0, *rec.topk(), 0);
    // Another layout or placement: its rows are not where this call looks (warp-uniform: every
    // lane read the same acquired word). Report it; the error ends the launch's waits.
    if (*rec.shape() != shape) {
      if (c.gw == 0 && c.lane == 0)
        report(p.error, cuda_hd::kShapeMismatch, c.rank, s, 0, *rec.shape(), 0);
      return;
    }
  }
  auto rec_rows = [&](int s, int le) -> int64_t {
    const protocol::CountRecord rec = p.map.count(c.base(c.rank), p.half, s);
    return p.latency ? rec.expert_rows()[le] : *rec.rows();
  };
  if (c.gw == 0) {
    int64_t* rc = c.s<int64_t>(p.scratch.recv_count);
    int64_t* range = c.s<int64_t>(p.scratch.recv_range);
    for (int le = c.lane; le < El; le += 32) {
      int64_t n = 0;
      for (int s = 0; s < R; ++s) n += p.map.count(c.base(c.rank), p.half, s).expert_rows()[le];
      rc[le] = n;
    }
    for (int le = c.lane; le < (p.latency ? El : 1); le += 32) {
      int64_t before = 0;  // rows of the lower sources (compact placement)
      for (int s = 0; s < R; ++s) {
        const int64_t n = rec_rows(s, le), at = cuda_hd::range_index(p.latency, R, le, s);
        range[2 * at] = cuda_hd::source_offset(p.per_source, s, T, before);
        range[2 * at + 1] = n;
        before += n;
      }
    }
    if (c.lane == 0) {
      c.s<int64_t>(p.scratch.info)[2] = rows;
      if (p.host_recv_rows) p.host_recv_rows[c.lr] = rows;
    }
  }
  const int64_t first = static_cast<int64_t>(c.gw) * 32 + c.lane,
                step = static_cast<int64_t>(c.W) * 32;
  const uint32_t* tp_tags = c.win<uint32_t>(c.rank, p.map.tp_tag);
  const protocol::LatencyRecord* lat_recs = c.win<protocol::LatencyRecord>(c.rank, p.map.lat_rec);
  int64_t* lat_src = c.win<int64_t>(c.rank, p.map.lat_src);
  for (int le = 0; le < (p.latency ? El : 1); ++le) {
    int64_t before = 0;
    for (int s = 0; s < R; ++s) {
      const int64_t n = rec_rows(s, le);
      const int64_t at =
          (p.latency ? le * RT : 0) + cuda_hd::source_offset(p.per_source, s, T, before);
      before += n;
      for (int64_t q = first; q < n; q += step) {
        const int64_t row = at + q;
        if (!wait_tag<true>(p.latency ? &lat_recs[row].tag : tp_tags + row, p.tag, p.timeout_cycles,
                            p.error, c.rank, s, cuda_hd::kWaitDispatchRow, row))
          return;
        // The owner notes recv_src from the record its tag just published (LatencyRecord).
        if (p.latency) {
          lat_src[2 * row] = s;
          lat_src[2 * row + 1] = lat_recs[row].token();
        }
      }
    }
  }
}

// The valid rows of this rank's last dispatch output, copied densely into compact_out in
// compact order (by local expert in the latency layout, then source, then token): the ranges
// receive() published, read after the receive's launch completed (stream order).
__device__ inline void compact_rows(const RankCtx& c) {
  const LaunchParams& p = c.p;
  const int R = p.ranks, El = p.local_experts;
  const int64_t RT = p.map.tp_rows();
  const size_t rb = p.map.row_bytes;
  const int64_t* range = c.s<int64_t>(p.scratch.recv_range);
  const char* from = c.win<char>(c.rank, p.latency ? p.map.lat_x : p.map.tp_x);
  char* to = static_cast<char*>(c.io.compact_out);
  int64_t packed = 0;
  for (int le = 0; le < (p.latency ? El : 1); ++le)
    for (int s = 0; s < R; ++s) {
      const int64_t* r = range + 2 * cuda_hd::range_index(p.latency, R, le, s);
      const int64_t at = (p.latency ? le * RT : 0) + r[0];
      for (int64_t q = c.gw; q < r[1]; q += c.W)
        warp_copy(to + static_cast<size_t>(packed + q) * rb,
                  from + static_cast<size_t>(at + q) * rb, rb, c.lane);
      packed += r[1];
    }
}

// Test hook (VirtualBuffer::set_start_delays): this rank's blocks start late, so the others
// must wait for it point to point -- the skew a real group has, inside one launch.
__device__ inline void start_delay(const RankCtx& c) {
  if (c.io.start_delay_ns == 0) return;
  const unsigned long long t0 = globaltimer_ns();
  while (globaltimer_ns() - t0 < c.io.start_delay_ns) __nanosleep(1000);
}

template <class Peers>
__device__ inline RankCtx make_ctx(const LaunchParams& p) {
  const int lr = Peers::local_rank(p), b = Peers::block_in_rank(p);
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5,
            warps = static_cast<int>(blockDim.x) >> 5;
  return RankCtx{p,
                 p.io[lr],
                 lr,
                 p.first_rank + lr,
                 b,
                 lane,
                 warp,
                 warps,
                 b * warps + warp,
                 p.blocks_per_rank * warps,
                 p.io[lr].scratch};
}

template <class Peers>
__global__ void __launch_bounds__(512, 1) dispatch_kernel(const LaunchParams p) {
  UBEP_DYNAMIC_SMEM(smem);
  const RankCtx c = make_ctx<Peers>(p);
  if (p.phases & cuda_hd::kSend) {
    start_delay(c);
    route(c, smem);
    routing_meet(c);
    if (c.b == 0 && c.warp == 0) send_counts(c);
    if (p.bsp) Peers::group_barrier(p, 0);
    if (c.b == 0)
      for (int k = 1 + c.warp; k <= p.ranks; k += c.warps)
        compute_offsets(c, (c.rank + k) % p.ranks);
    send_rows(c);
    if (p.bsp) Peers::group_barrier(p, 1);
  }
  if (p.phases & cuda_hd::kRecv) receive(c);
  if (p.phases & cuda_hd::kCompact) compact_rows(c);
}

}  // namespace ubep::cuda_dev
