// ubep and bsp through ubep::Buffer on cuda:0: one thread rank per simulated GPU rank
// (run_on_threads), every rank's Buffer launching its own kernels on the shared GPU. Each op is
// timed on every rank from a group barrier to the call's return; the row is the slowest rank of
// each iteration (the group is done when its last rank is).
#include <chrono>
#include <random>

#include "bench_common.hpp"
#include "ubep/cuda.hpp"
#include "ubep/group.hpp"

namespace ubep::cuda_bench {

namespace {

// Fills bf16 values that are small and finite (exponent of 1.0, random low mantissa bits).
__global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    p[i] = static_cast<uint16_t>(0x3c00u | (h & 0x00ffu));
  }
}

// Per op, per timed iteration, per rank: microseconds. Each rank writes only its own slots.
struct RankTimes {
  std::vector<std::vector<double>> us;  // [iteration][rank]
  RankTimes(int iters, int ranks)
      : us(static_cast<size_t>(iters), std::vector<double>(static_cast<size_t>(ranks))) {}
  std::vector<double> slowest() const {
    std::vector<double> out;
    for (const auto& ranks : us) out.push_back(*std::max_element(ranks.begin(), ranks.end()));
    return out;
  }
};

struct AlgorithmTimes {
  RankTimes dispatch, compact, combine;
  AlgorithmTimes(int iters, int ranks)
      : dispatch(iters, ranks), compact(iters, ranks), combine(iters, ranks) {}
};

// Microseconds from a group barrier (all ranks start together) to fn's return on this rank.
template <typename Fn>
double after_barrier(Group& g, Fn&& fn) {
  g.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// One rank's iterations of one algorithm: dispatch (split phase for ubep), compact() (ubep: the
// copy a dense expert GEMM needs), combine with zero-copy input (the "experts" wrote into
// combine_buffer()).
void time_rank(Group& g, Buffer& buf, Algorithm algorithm, const DispatchArgs& args, int warmup,
               int iters, AlgorithmTimes& t) {
  buf.set_algorithm(algorithm);
  const bool split = algorithm == Algorithm::kUbep;  // split phase is ubep's
  const auto me = static_cast<size_t>(g.rank());
  for (int i = 0; i < warmup + iters; ++i) {
    DispatchResult r;
    const double d = after_barrier(g, [&] {
      r = split ? (buf.dispatch_send(args), buf.dispatch_recv()) : buf.dispatch(args);
    });
    const double k = split ? after_barrier(g, [&] { buf.compact(); }) : 0.0;
    const CombineArgs ca{buf.combine_buffer(), r.handle};
    const double c = after_barrier(g, [&] {
      if (split) {
        buf.combine_send(ca);
        buf.combine_recv();
      } else {
        buf.combine(ca);
      }
    });
    if (i < warmup) continue;
    const auto at = static_cast<size_t>(i - warmup);
    t.dispatch.us[at][me] = d;
    t.compact.us[at][me] = k;
    t.combine.us[at][me] = c;
  }
}

BufferConfig bench_config(const Workload& w, Placement placement) {
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, 0};
  cfg.max_tokens_per_rank = w.shape.tokens;
  cfg.hidden = w.shape.hidden;
  cfg.dtype = DType::kBF16;
  cfg.num_experts = w.shape.experts;
  cfg.max_topk = w.shape.topk;
  cfg.enable_latency_layout = w.layout == Layout::kLatency;
  cfg.placement = placement;
  return cfg;
}

}  // namespace

void fill_bf16(uint16_t* p, size_t n, uint32_t seed, cudaStream_t s) {
  fill_bf16_kernel<<<256, 256, 0, s>>>(p, n, seed);
  ck(cudaGetLastError(), "fill_bf16 launch");
}

RankDeviceInputs::RankDeviceInputs(const Workload& w, int rank) {
  const Shape& sh = w.shape;
  const std::vector<int64_t>& idx = w.topk_idx[static_cast<size_t>(rank)];
  const std::vector<float> weights(idx.size(), 0.125f);
  ck(cudaMalloc(&x, std::max<size_t>(static_cast<size_t>(sh.tokens) * w.row_bytes(), 16)), "x");
  ck(cudaMalloc(&topk_idx, std::max<size_t>(idx.size() * 8, 16)), "topk_idx");
  ck(cudaMalloc(&topk_weights, std::max<size_t>(weights.size() * 4, 16)), "topk_weights");
  fill_bf16(reinterpret_cast<uint16_t*>(x), static_cast<size_t>(sh.tokens * sh.hidden),
            static_cast<uint32_t>(rank), cudaStreamLegacy);
  ck(cudaMemcpy(topk_idx, idx.data(), idx.size() * 8, cudaMemcpyHostToDevice), "upload");
  ck(cudaMemcpy(topk_weights, weights.data(), weights.size() * 4, cudaMemcpyHostToDevice),
     "upload");
  ck(cudaStreamSynchronize(cudaStreamLegacy), "inputs");
  args.x = cuda::device_view(x, DType::kBF16, {sh.tokens, sh.hidden});
  args.topk_idx = cuda::device_view(topk_idx, DType::kInt64, {sh.tokens, sh.topk});
  args.topk_weights = cuda::device_view(topk_weights, DType::kFP32, {sh.tokens, sh.topk});
  args.layout = w.layout;
}

RankDeviceInputs::~RankDeviceInputs() {
  cudaFree(x);
  cudaFree(topk_idx);
  cudaFree(topk_weights);
}

void time_buffer(const Workload& w, Placement placement, int warmup, int iters,
                 std::vector<Row>& out) {
  const std::string pl =
      placement_name(placement == Placement::kAuto ? placement_for(w.layout) : placement);
  AlgorithmTimes ubep_t(iters, w.ranks), bsp_t(iters, w.ranks);
  run_on_threads(w.ranks, [&](Group& g) {
    RankDeviceInputs in(w, g.rank());
    Buffer buf(g, bench_config(w, placement));
    time_rank(g, buf, Algorithm::kUbep, in.args, warmup, iters, ubep_t);
    time_rank(g, buf, Algorithm::kBsp, in.args, warmup, iters, bsp_t);
    g.barrier();  // nobody frees its inputs (cudaFree waits for the device) while a peer calls
  });
  report(w, pl, "ubep", "dispatch", ubep_t.dispatch.slowest(), out);
  report(w, pl, "ubep", "combine", ubep_t.combine.slowest(), out);
  report(w, pl, "ubep", "compact", ubep_t.compact.slowest(), out);
  report(w, pl, "bsp", "dispatch", bsp_t.dispatch.slowest(), out);
  report(w, pl, "bsp", "combine", bsp_t.combine.slowest(), out);
}

}  // namespace ubep::cuda_bench
