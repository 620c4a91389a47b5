// ubep-cuda-bench: the CUDA backend on one GPU with virtual ranks (single-GPU loopback: every
// "peer" is the same HBM, so this measures kernels and protocol, not NVLink). Implementations:
//   ubep      split phase (send + recv launches), zero-copy combine input
//   bsp       the same kernels with grid-wide barriers between stages
//   pack_copy the path users write: pack rows per destination (kernel), count exchange
//             (device -> host copy + stream sync: the host must size the copies), one
//             cudaMemcpyAsync per (source, destination), unpack (kernel); combine: pack back,
//             copies, unpack + fixed-order reduce. Routing is precomputed on the host and not
//             timed, which flatters this baseline. Throughput layout only.
//   copy_bound one device-to-device cudaMemcpyAsync of the same bytes the op moves.
// ubep and bsp run once per --placement (compact, per-source; auto resolves per layout); ubep
// also times compact() (op "compact": the valid rows copied densely, for a dense expert GEMM).
// Timed with CUDA events, median and p99 over --iters. `ubep-bench --backend cuda` maps here.
// JSON (--json FILE): {"config": {...}, "results": [{"impl","placement","op","median_us",...}]}.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ubep/cuda.hpp"

using namespace ubep;

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Shape {
  std::string name;
  int64_t tokens, hidden;
  int topk, experts;
};

struct Row {
  std::string workload, layout, placement, impl, op;
  double median_us, p99_us, gbps;
};

__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    p[i] = static_cast<uint16_t>(0x3c00u | (h & 0x00ffu));  // small finite bf16 values
  }
}

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
      for (int i = 0; i < 4; ++i) {
        auto rn = [](float f) {
          uint32_t b = __float_as_uint(f);
          b += 0x7fffu + ((b >> 16) & 1u);
          return b >> 16;
        };
        o[i] = rn(acc[2 * i]) | (rn(acc[2 * i + 1]) << 16);
      }
      *reinterpret_cast<int4*>(out[t] + h * 2) =
          make_int4(int(o[0]), int(o[1]), int(o[2]), int(o[3]));
    }
  }
}

template <typename T>
T* dev_copy(const std::vector<T>& v) {
  T* p = nullptr;
  ck(cudaMalloc(&p, std::max<size_t>(v.size() * sizeof(T), 16)), "cudaMalloc");
  if (!v.empty())
    ck(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return p;
}

struct Timer {
  cudaStream_t s;
  std::vector<double> us;
  template <typename Fn>
  void run(int warmup, int iters, Fn&& fn) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < warmup + iters; ++i) {
      cudaEventRecord(a, s);
      fn();
      cudaEventRecord(b, s);
      ck(cudaEventSynchronize(b), "timed op");
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (i >= warmup) us.push_back(1e3 * ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  static double pct(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
  }
};

// One shape, layout and placement; `baselines`: also copy_bound and pack_copy (placement-free).
void bench_shape(const Shape& sh, int R, Layout layout, Placement placement, bool baselines,
                 int warmup, int iters, std::vector<Row>& out) {
  const size_t rb = static_cast<size_t>(sh.hidden) * 2;
  const int El = sh.experts / R;
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, 0};
  cfg.max_tokens_per_rank = sh.tokens;
  cfg.hidden = sh.hidden;
  cfg.dtype = DType::kBF16;
  cfg.num_experts = sh.experts;
  cfg.max_topk = sh.topk;
  cfg.enable_latency_layout = layout == Layout::kLatency;
  cfg.placement = placement;
  const std::string pl_name =
      placement_name(placement == Placement::kAuto ? placement_for(layout) : placement);
  cuda::VirtualBuffer vb(R, cfg);
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  auto st = reinterpret_cast<cuda::Stream>(s);

  // Inputs: random bf16 rows (device), uniform top-k routing (host, then device).
  std::mt19937 rng(42);
  std::vector<char*> x(static_cast<size_t>(R));
  std::vector<std::vector<int64_t>> idx(static_cast<size_t>(R));
  std::vector<DispatchArgs> args;
  std::vector<int64_t*> idx_d;
  std::vector<float*> w_d;
  for (int r = 0; r < R; ++r) {
    ck(cudaMalloc(&x[static_cast<size_t>(r)], static_cast<size_t>(sh.tokens) * rb), "x");
    fill_bf16<<<256, 256, 0, s>>>(reinterpret_cast<uint16_t*>(x[static_cast<size_t>(r)]),
                                  static_cast<size_t>(sh.tokens * sh.hidden),
                                  static_cast<uint32_t>(r));
    std::vector<float> w;
    for (int64_t t = 0; t < sh.tokens; ++t) {
      std::vector<int64_t> chosen;
      while (static_cast<int>(chosen.size()) < sh.topk) {
        const int64_t e = static_cast<int64_t>(rng() % static_cast<uint32_t>(sh.experts));
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      for (int64_t e : chosen) {
        idx[static_cast<size_t>(r)].push_back(e);
        w.push_back(0.125f);
      }
    }
    idx_d.push_back(dev_copy(idx[static_cast<size_t>(r)]));
    w_d.push_back(dev_copy(w));
    DispatchArgs a;
    a.x = TensorView(x[static_cast<size_t>(r)], DType::kBF16, {sh.tokens, sh.hidden});
    a.topk_idx = TensorView(idx_d.back(), DType::kInt64, {sh.tokens, sh.topk});
    a.topk_weights = TensorView(w_d.back(), DType::kFP32, {sh.tokens, sh.topk});
    a.x.device = a.topk_idx.device = a.topk_weights.device = cfg.device;
    a.layout = layout;
    args.push_back(a);
  }
  // Host routing: rows[s][d] and the bytes one op moves.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(R),
                                         std::vector<int64_t>(static_cast<size_t>(R)));
  std::vector<std::vector<std::vector<int64_t>>> toks(
      static_cast<size_t>(R), std::vector<std::vector<int64_t>>(static_cast<size_t>(R)));
  double moved = 0;
  for (int s0 = 0; s0 < R; ++s0)
    for (int64_t t = 0; t < sh.tokens; ++t) {
      std::vector<bool> to(static_cast<size_t>(R), false);
      for (int j = 0; j < sh.topk; ++j) {
        to[static_cast<size_t>(idx[static_cast<size_t>(s0)][static_cast<size_t>(t * sh.topk + j)] /
                               El)] = true;
        if (layout == Layout::kLatency) moved += static_cast<double>(rb);
      }
      for (int d = 0; d < R; ++d)
        if (to[static_cast<size_t>(d)]) {
          toks[static_cast<size_t>(s0)][static_cast<size_t>(d)].push_back(t);
          ++rows[static_cast<size_t>(s0)][static_cast<size_t>(d)];
          if (layout == Layout::kThroughput) moved += static_cast<double>(rb);
        }
    }
  auto add = [&](const std::string& impl, const std::string& op, const std::vector<double>& us) {
    const double med = Timer::pct(us, 0.5);
    const std::string pl = impl == "ubep" || impl == "bsp" ? pl_name : "-";
    out.push_back({sh.name, layout_name(layout), pl, impl, op, med, Timer::pct(us, 0.99),
                   moved / (med * 1e3)});
    std::printf("%-8s %-10s %-10s %-11s %-9s %10.1f %10.1f %9.1f\n", sh.name.c_str(),
                layout_name(layout), pl.c_str(), impl.c_str(), op.c_str(), med,
                Timer::pct(us, 0.99), moved / (med * 1e3));
    std::fflush(stdout);
  };
  // One event pair around each op; the ops are enqueued exactly as an application would.
  auto timed = [&](auto&& fn) {
    Timer one{s};
    one.run(0, 1, fn);
    return one.us[0];
  };
  for (Algorithm algo : {Algorithm::kUbep, Algorithm::kBsp}) {
    vb.set_algorithm(algo);
    const bool split = algo == Algorithm::kUbep;
    std::vector<double> td, tc, tk;
    for (int i = 0; i < warmup + iters; ++i) {
      std::vector<DispatchResult> res;
      const double d_us = timed([&] {
        if (split) {
          vb.dispatch_send(args, st);
          res = vb.dispatch_recv(st);
        } else {
          res = vb.dispatch(args, st);
        }
      });
      // compact(): one local copy of the valid rows (what a dense expert GEMM would need).
      const double k_us = split ? timed([&] { vb.compact(st); }) : 0.0;
      std::vector<CombineArgs> cargs;  // zero-copy: the "experts" wrote into combine_buffer
      for (int r = 0; r < R; ++r)
        cargs.push_back({vb.combine_buffer(r), res[static_cast<size_t>(r)].handle});
      const double c_us = timed([&] {
        if (split) {
          vb.combine_send(cargs, st);
          vb.combine_recv(st);
        } else {
          vb.combine(cargs, st);
        }
      });
      if (i >= warmup) {
        td.push_back(d_us);
        tc.push_back(c_us);
        tk.push_back(k_us);
      }
    }
    vb.synchronize(st);
    add(algorithm_name(algo), "dispatch", td);
    add(algorithm_name(algo), "combine", tc);
    if (split) add(algorithm_name(algo), "compact", tk);
  }
  if (!baselines) {
    for (char* p : x) cudaFree(p);
    for (auto* p : idx_d) cudaFree(p);
    for (auto* p : w_d) cudaFree(p);
    cudaStreamDestroy(s);
    return;
  }

  // copy_bound: one device-to-device copy of the bytes the op moves.
  {
    char *a = nullptr, *b = nullptr;
    const size_t n = static_cast<size_t>(moved);
    ck(cudaMalloc(&a, n), "copy bound src");
    ck(cudaMalloc(&b, n), "copy bound dst");
    Timer t{s};
    t.run(warmup, iters, [&] { cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s); });
    add("copy_bound", "dispatch", t.us);
    add("copy_bound", "combine", t.us);
    cudaFree(a);
    cudaFree(b);
  }

  // pack_copy (throughput layout): buffers per rank, copy plans precomputed on the host.
  if (layout == Layout::kThroughput) {
    std::vector<char*> send(static_cast<size_t>(R)), recv(static_cast<size_t>(R)),
        outb(static_cast<size_t>(R)), back(static_cast<size_t>(R)), y(static_cast<size_t>(R));
    const size_t cap = static_cast<size_t>(R * sh.tokens) * rb;
    for (int r = 0; r < R; ++r)
      for (auto* v : {&send, &recv, &outb, &back, &y})
        ck(cudaMalloc(&(*v)[static_cast<size_t>(r)], cap), "pack_copy buffers");
    std::vector<char*> pk_dst, pk_src, un_dst, un_src, red_out;
    std::vector<const char*> red_rows;
    std::vector<std::vector<int64_t>> soff(static_cast<size_t>(R),
                                           std::vector<int64_t>(static_cast<size_t>(R) + 1, 0)),
        roff(static_cast<size_t>(R), std::vector<int64_t>(static_cast<size_t>(R) + 1, 0));
    for (int s0 = 0; s0 < R; ++s0)
      for (int d = 0; d < R; ++d) {
        soff[static_cast<size_t>(s0)][static_cast<size_t>(d) + 1] =
            soff[static_cast<size_t>(s0)][static_cast<size_t>(d)] +
            rows[static_cast<size_t>(s0)][static_cast<size_t>(d)];
        roff[static_cast<size_t>(d)][static_cast<size_t>(s0) + 1] =
            roff[static_cast<size_t>(d)][static_cast<size_t>(s0)] +
            rows[static_cast<size_t>(s0)][static_cast<size_t>(d)];
      }
    for (int s0 = 0; s0 < R; ++s0)
      for (int d = 0; d < R; ++d)
        for (size_t k = 0; k < toks[static_cast<size_t>(s0)][static_cast<size_t>(d)].size(); ++k) {
          const int64_t t = toks[static_cast<size_t>(s0)][static_cast<size_t>(d)][k];
          pk_dst.push_back(
              send[static_cast<size_t>(s0)] +
              static_cast<size_t>(soff[static_cast<size_t>(s0)][static_cast<size_t>(d)] +
                                  static_cast<int64_t>(k)) *
                  rb);
          pk_src.push_back(x[static_cast<size_t>(s0)] + static_cast<size_t>(t) * rb);
        }
    for (int d = 0; d < R; ++d)
      for (int64_t i = 0; i < roff[static_cast<size_t>(d)][static_cast<size_t>(R)]; ++i) {
        un_dst.push_back(outb[static_cast<size_t>(d)] + static_cast<size_t>(i) * rb);
        un_src.push_back(recv[static_cast<size_t>(d)] + static_cast<size_t>(i) * rb);
      }
    for (int s0 = 0; s0 < R; ++s0)
      for (int64_t t = 0; t < sh.tokens; ++t) {
        red_out.push_back(y[static_cast<size_t>(s0)] + static_cast<size_t>(t) * rb);
        for (int d = 0; d < R; ++d) {
          const auto& v = toks[static_cast<size_t>(s0)][static_cast<size_t>(d)];
          const auto it = std::find(v.begin(), v.end(), t);
          red_rows.push_back(
              it == v.end()
                  ? nullptr
                  : back[static_cast<size_t>(s0)] +
                        static_cast<size_t>(soff[static_cast<size_t>(s0)][static_cast<size_t>(d)] +
                                            (it - v.begin())) *
                            rb);
        }
      }
    char** pk_dst_d = dev_copy(pk_dst);
    char** pk_src_d = dev_copy(pk_src);
    char** un_dst_d = dev_copy(un_dst);
    char** un_src_d = dev_copy(un_src);
    char** red_out_d = dev_copy(red_out);
    const char** red_rows_d = dev_copy(red_rows);
    std::vector<int> counts_h(static_cast<size_t>(R * R), 0);
    int* counts_d = dev_copy(counts_h);
    int* counts_pinned = nullptr;
    ck(cudaMallocHost(&counts_pinned, counts_h.size() * sizeof(int)), "pinned counts");
    const auto npk = static_cast<int64_t>(pk_dst.size()), nun = static_cast<int64_t>(un_dst.size()),
               nred = static_cast<int64_t>(red_out.size());
    Timer td{s}, tc{s};
    td.run(warmup, iters, [&] {
      copy_rows<<<264, 512, 0, s>>>(pk_dst_d, pk_src_d, npk, rb);
      cudaMemcpyAsync(counts_pinned, counts_d, counts_h.size() * sizeof(int),
                      cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);  // the host needs the counts to size the copies
      for (int s0 = 0; s0 < R; ++s0)
        for (int d = 0; d < R; ++d) {
          const size_t n =
              static_cast<size_t>(rows[static_cast<size_t>(s0)][static_cast<size_t>(d)]) * rb;
          if (n)
            cudaMemcpyAsync(
                recv[static_cast<size_t>(d)] +
                    static_cast<size_t>(roff[static_cast<size_t>(d)][static_cast<size_t>(s0)]) * rb,
                send[static_cast<size_t>(s0)] +
                    static_cast<size_t>(soff[static_cast<size_t>(s0)][static_cast<size_t>(d)]) * rb,
                n, cudaMemcpyDeviceToDevice, s);
        }
      copy_rows<<<264, 512, 0, s>>>(un_dst_d, un_src_d, nun, rb);
    });
    tc.run(warmup, iters, [&] {
      // pack back = the expert output is already per source, contiguous: one copy per peer
      for (int s0 = 0; s0 < R; ++s0)
        for (int d = 0; d < R; ++d) {
          const size_t n =
              static_cast<size_t>(rows[static_cast<size_t>(s0)][static_cast<size_t>(d)]) * rb;
          if (n)
            cudaMemcpyAsync(
                back[static_cast<size_t>(s0)] +
                    static_cast<size_t>(soff[static_cast<size_t>(s0)][static_cast<size_t>(d)]) * rb,
                outb[static_cast<size_t>(d)] +
                    static_cast<size_t>(roff[static_cast<size_t>(d)][static_cast<size_t>(s0)]) * rb,
                n, cudaMemcpyDeviceToDevice, s);
        }
      reduce_rows<<<264, 512, 0, s>>>(red_out_d, red_rows_d, R, nred, sh.hidden);
    });
    add("pack_copy", "dispatch", td.us);
    add("pack_copy", "combine", tc.us);
    ck(cudaStreamSynchronize(s), "pack_copy");
    for (auto* v : {&send, &recv, &outb, &back, &y})
      for (char* p : *v) cudaFree(p);
    for (void* p :
         {static_cast<void*>(pk_dst_d), static_cast<void*>(pk_src_d), static_cast<void*>(un_dst_d),
          static_cast<void*>(un_src_d), static_cast<void*>(red_out_d),
          static_cast<void*>(red_rows_d), static_cast<void*>(counts_d)})
      cudaFree(p);
    cudaFreeHost(counts_pinned);
  }
  for (char* p : x) cudaFree(p);
  for (auto* p : idx_d) cudaFree(p);
  for (auto* p : w_d) cudaFree(p);
  cudaStreamDestroy(s);
}

}  // namespace

int main(int argc, char** argv) {
  std::string workload = "all", layouts = "both", placements = "both", json;
  int R = 8, iters = 50, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--workload")
      workload = v;
    else if (k == "--layout")
      layouts = v;
    else if (k == "--placement")
      placements = v;
    else if (k == "--ranks")
      R = std::stoi(v);
    else if (k == "--iters")
      iters = std::stoi(v);
    else if (k == "--warmup")
      warmup = std::stoi(v);
    else if (k == "--json")
      json = v;
    else {
      std::fprintf(stderr,
                   "usage: ubep-cuda-bench [--workload decode|prefill|tiny|all] [--layout "
                   "throughput|latency|both] [--placement auto|compact|per-source|both]"
                   " [--ranks 8] [--iters 50] [--warmup 5] [--json FILE]\n");
      return 2;
    }
  }
  std::string why;
  if (!cuda::device_available(&why)) {
    std::printf("SKIPPED: no usable CUDA device (%s); nothing measured\n", why.c_str());
    return 77;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("ubep-cuda-bench on %s: %d virtual ranks, single-GPU loopback (not NVLink)\n",
              prop.name, R);
  std::vector<Placement> pls;
  try {
    if (placements == "both")
      pls = {Placement::kCompact, Placement::kPerSource};
    else
      pls = {parse_placement(placements)};
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ubep-cuda-bench: %s\n", e.what());
    return 2;
  }
  std::printf("%-8s %-10s %-10s %-11s %-9s %10s %10s %9s\n", "workload", "layout", "placement",
              "impl", "op", "median_us", "p99_us", "GB/s");
  const std::vector<Shape> shapes = {
      {"decode", 128, 7168, 8, 256}, {"prefill", 4096, 7168, 8, 256}, {"tiny", 8, 256, 2, 4 * R}};
  std::vector<Row> rows;
  for (const Shape& sh : shapes) {
    if (workload != "all" && workload != sh.name) continue;
    for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
      if (layouts != "both" && layouts != layout_name(l)) continue;
      if (sh.name == "prefill" && l == Layout::kLatency) continue;  // [El, R*T] rows: too large
      for (size_t k = 0; k < pls.size(); ++k) {
        try {
          bench_shape(sh, R, l, pls[k], k + 1 == pls.size(), warmup, iters, rows);
        } catch (const std::exception& e) {
          std::printf("%-8s %-10s %-10s FAILED: %s\n", sh.name.c_str(), layout_name(l),
                      placement_name(pls[k]), e.what());
        }
      }
    }
  }
  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\"config\": {\"bench\": \"ubep-cuda-bench\", \"device\": \"" << prop.name
      << "\", \"ranks\": " << R
      << ", \"note\": \"single-GPU loopback (virtual ranks), not NVLink\", \"dtype\": \"bf16\", "
         "\"iters\": "
      << iters << ", \"warmup\": " << warmup << "},\n \"results\": [";
    for (size_t i = 0; i < rows.size(); ++i)
      f << (i ? ",\n  " : "\n  ") << "{\"workload\": \"" << rows[i].workload << "\", \"layout\": \""
        << rows[i].layout << "\", \"placement\": \"" << rows[i].placement << "\", \"impl\": \""
        << rows[i].impl << "\", \"op\": \"" << rows[i].op
        << "\", \"median_us\": " << rows[i].median_us << ", \"p99_us\": " << rows[i].p99_us
        << ", \"gbps\": " << rows[i].gbps << "}";
    f << "\n]}\n";
  }
  return 0;
}
