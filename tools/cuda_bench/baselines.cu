// The rows ubep is compared with, on the same GPU and workload (host thread, one stream):
//   copy_bound  one device-to-device cudaMemcpyAsync of the bytes the op moves, all ranks' at once
//   pack_copy   the path users write: pack rows per destination (kernel), count exchange (device
//               -> host copy + stream sync: the host must size the copies), one cudaMemcpyAsync
//               per (source, destination), unpack (kernel); combine: the rows back per peer, then
//               unpack + fixed-order reduce. Routing is precomputed on the host and not timed,
//               which flatters this baseline. Throughput layout only.
#include <memory>

#include "bench_common.hpp"

namespace ubep::cuda_bench {

namespace {

// Warp per row pair: dst[i] <- src[i], 16-byte vectors (rows are 16-byte multiples here).
__global__ void copy_rows(char* const* dst, const char* const* src, int64_t n, size_t rb) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = (blockIdx.x * blockDim.x + threadIdx.x) / 32; i < n; i += warps) {
    auto* o = reinterpret_cast<int4*>(dst[i]);
    const auto* s = reinterpret_cast<const int4*>(src[i]);
    for (size_t k = static_cast<size_t>(lane); k < rb / 16; k += 32) o[k] = s[k];
  }
}

__device__ uint32_t round_to_bf16(float f) {
  uint32_t b = __float_as_uint(f);
  b += 0x7fffu + ((b >> 16) & 1u);
  return b >> 16;
}

// Warp per token: out = round(sum of up to R rows, ascending rank), bf16, fixed order.
__global__ void reduce_rows(char* const* out, const char* const* rows, int R, int64_t n,
                            int64_t hidden) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t t = (blockIdx.x * blockDim.x + threadIdx.x) / 32; t < n; t += warps) {
    for (int64_t h = lane * 8; h < hidden; h += 256) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int r = 0; r < R; ++r) {
        const char* row = rows[t * R + r];
        if (!row) continue;
        const int4 v = *reinterpret_cast<const int4*>(row + h * 2);
        const uint32_t u[4] = {uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)};
        for (int i = 0; i < 4; ++i) {
          acc[2 * i] = __fadd_rn(acc[2 * i], __uint_as_float(u[i] << 16));
          acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], __uint_as_float(u[i] & 0xffff0000u));
        }
      }
      uint32_t o[4];
      for (int i = 0; i < 4; ++i)
        o[i] = round_to_bf16(acc[2 * i]) | (round_to_bf16(acc[2 * i + 1]) << 16);
      *reinterpret_cast<int4*>(out[t] + h * 2) =
          make_int4(int(o[0]), int(o[1]), int(o[2]), int(o[3]));
    }
  }
}

// Device memory freed with the owner.
struct DeviceBlock {
  void* p = nullptr;
  explicit DeviceBlock(size_t bytes) {
    ck(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
  }
  ~DeviceBlock() { cudaFree(p); }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  char* bytes() const { return static_cast<char*>(p); }
};

template <typename T>
std::unique_ptr<DeviceBlock> upload(const std::vector<T>& v) {
  auto b = std::make_unique<DeviceBlock>(v.size() * sizeof(T));
  if (!v.empty())
    ck(cudaMemcpy(b->p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return b;
}

using Offsets = std::vector<std::vector<int64_t>>;  // [rank][peer], prefix sums of rows

// pack_copy's buffers per rank and its copy plans, built on the host before timing.
struct PackCopyPlan {
  const Workload& w;
  std::vector<std::unique_ptr<RankDeviceInputs>> inputs;
  std::vector<std::unique_ptr<DeviceBlock>> send, recv, expert_out, back, y;  // per rank
  Offsets send_at, recv_at;  // send_at[s][d]: row of s's rows for d in send[s]; recv_at[d][s]
  std::unique_ptr<DeviceBlock> pack_dst, pack_src, unpack_dst, unpack_src, reduce_out, reduce_rows;
  int64_t packs = 0, unpacks = 0, reduces = 0;
  std::unique_ptr<DeviceBlock> counts;
  int* counts_host = nullptr;  // pinned

  explicit PackCopyPlan(const Workload& work);
  ~PackCopyPlan() { cudaFreeHost(counts_host); }
  char* send_row(int s, int d, int64_t k) const {
    return send[size_t(s)]->bytes() + size_t(send_at[size_t(s)][size_t(d)] + k) * w.row_bytes();
  }
  char* recv_row(int d, int s, int64_t k) const {
    return recv[size_t(d)]->bytes() + size_t(recv_at[size_t(d)][size_t(s)] + k) * w.row_bytes();
  }
};

Offsets prefix_rows(const Workload& w, bool by_destination) {
  const auto R = static_cast<size_t>(w.ranks);
  Offsets at(R, std::vector<int64_t>(R + 1, 0));
  for (size_t a = 0; a < R; ++a)
    for (size_t b = 0; b < R; ++b)
      at[a][b + 1] = at[a][b] + (by_destination ? w.rows[a][b] : w.rows[b][a]);
  return at;
}

PackCopyPlan::PackCopyPlan(const Workload& work) : w(work) {
  const int R = w.ranks;
  const size_t cap = static_cast<size_t>(R * w.shape.tokens) * w.row_bytes();
  for (int r = 0; r < R; ++r) {
    inputs.push_back(std::make_unique<RankDeviceInputs>(w, r));
    for (auto* v : {&send, &recv, &expert_out, &back, &y})
      v->push_back(std::make_unique<DeviceBlock>(cap));
  }
  send_at = prefix_rows(w, true);
  recv_at = prefix_rows(w, false);
  std::vector<char*> pk_dst, un_dst, red_out;
  std::vector<const char*> pk_src, un_src, red_rows;
  for (int s = 0; s < R; ++s)
    for (int d = 0; d < R; ++d) {
      const std::vector<int64_t>& toks = w.tokens_to[size_t(s)][size_t(d)];
      for (size_t k = 0; k < toks.size(); ++k) {
        pk_dst.push_back(send_row(s, d, static_cast<int64_t>(k)));
        pk_src.push_back(inputs[size_t(s)]->x + static_cast<size_t>(toks[k]) * w.row_bytes());
      }
    }
  for (int d = 0; d < R; ++d)
    for (int64_t i = 0; i < recv_at[size_t(d)][size_t(R)]; ++i) {
      un_dst.push_back(expert_out[size_t(d)]->bytes() + static_cast<size_t>(i) * w.row_bytes());
      un_src.push_back(recv[size_t(d)]->bytes() + static_cast<size_t>(i) * w.row_bytes());
    }
  for (int s = 0; s < R; ++s)
    for (int64_t t = 0; t < w.shape.tokens; ++t) {
      red_out.push_back(y[size_t(s)]->bytes() + static_cast<size_t>(t) * w.row_bytes());
      for (int d = 0; d < R; ++d) {  // the row that came back from d for token t, if any
        const std::vector<int64_t>& v = w.tokens_to[size_t(s)][size_t(d)];
        const auto it = std::find(v.begin(), v.end(), t);
        red_rows.push_back(it == v.end()
                               ? nullptr
                               : back[size_t(s)]->bytes() +
                                     size_t(send_at[size_t(s)][size_t(d)] + (it - v.begin())) *
                                         w.row_bytes());
      }
    }
  packs = static_cast<int64_t>(pk_dst.size());
  unpacks = static_cast<int64_t>(un_dst.size());
  reduces = static_cast<int64_t>(red_out.size());
  pack_dst = upload(pk_dst), pack_src = upload(pk_src), unpack_dst = upload(un_dst);
  unpack_src = upload(un_src), reduce_out = upload(red_out), reduce_rows = upload(red_rows);
  counts = upload(std::vector<int>(static_cast<size_t>(R * R), 0));
  ck(cudaMallocHost(&counts_host, static_cast<size_t>(R * R) * sizeof(int)), "pinned counts");
}

// Dispatch: pack, count exchange (the host must know the counts to size the copies), one copy
// per (source, destination), unpack.
void pack_copy_dispatch(const PackCopyPlan& p, cudaStream_t s) {
  const int R = p.w.ranks;
  copy_rows<<<264, 512, 0, s>>>(reinterpret_cast<char* const*>(p.pack_dst->p),
                                reinterpret_cast<const char* const*>(p.pack_src->p), p.packs,
                                p.w.row_bytes());
  ck(cudaMemcpyAsync(p.counts_host, p.counts->p, static_cast<size_t>(R * R) * sizeof(int),
                     cudaMemcpyDeviceToHost, s),
     "counts");
  ck(cudaStreamSynchronize(s), "counts");
  for (int src = 0; src < R; ++src)
    for (int d = 0; d < R; ++d)
      if (const size_t n = static_cast<size_t>(p.w.rows[size_t(src)][size_t(d)]) * p.w.row_bytes())
        cudaMemcpyAsync(p.recv_row(d, src, 0), p.send_row(src, d, 0), n, cudaMemcpyDeviceToDevice,
                        s);
  copy_rows<<<264, 512, 0, s>>>(reinterpret_cast<char* const*>(p.unpack_dst->p),
                                reinterpret_cast<const char* const*>(p.unpack_src->p), p.unpacks,
                                p.w.row_bytes());
}

// Combine: the expert output is already contiguous per source, so one copy per peer back, then
// the fixed-order reduction per token.
void pack_copy_combine(const PackCopyPlan& p, cudaStream_t s) {
  const int R = p.w.ranks;
  for (int src = 0; src < R; ++src)
    for (int d = 0; d < R; ++d)
      if (const size_t n =
              static_cast<size_t>(p.w.rows[size_t(src)][size_t(d)]) * p.w.row_bytes()) {
        char* to = p.back[size_t(src)]->bytes() +
                   static_cast<size_t>(p.send_at[size_t(src)][size_t(d)]) * p.w.row_bytes();
        const char* from = p.expert_out[size_t(d)]->bytes() +
                           static_cast<size_t>(p.recv_at[size_t(d)][size_t(src)]) * p.w.row_bytes();
        cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToDevice, s);
      }
  reduce_rows<<<264, 512, 0, s>>>(reinterpret_cast<char* const*>(p.reduce_out->p),
                                  reinterpret_cast<const char* const*>(p.reduce_rows->p), R,
                                  p.reduces, p.w.shape.hidden);
}

}  // namespace

void time_copy_bound(const Workload& w, int warmup, int iters, std::vector<Row>& out) {
  const auto n = static_cast<size_t>(w.bytes_moved);
  DeviceBlock from(n), to(n);
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  const std::vector<double> us = time_on_stream(s, warmup, iters, [&] {
    ck(cudaMemcpyAsync(to.p, from.p, n, cudaMemcpyDeviceToDevice, s), "copy bound");
  });
  report(w, "-", "copy_bound", "dispatch", us, out);
  report(w, "-", "copy_bound", "combine", us, out);
  cudaStreamDestroy(s);
}

void time_pack_copy(const Workload& w, int warmup, int iters, std::vector<Row>& out) {
  if (w.layout != Layout::kThroughput) return;
  const PackCopyPlan plan(w);
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  report(w, "-", "pack_copy", "dispatch",
         time_on_stream(s, warmup, iters, [&] { pack_copy_dispatch(plan, s); }), out);
  report(w, "-", "pack_copy", "combine",
         time_on_stream(s, warmup, iters, [&] { pack_copy_combine(plan, s); }), out);
  ck(cudaStreamSynchronize(s), "pack_copy");
  cudaStreamDestroy(s);
}

}  // namespace ubep::cuda_bench
