// ubep-cuda-bench: ubep::Buffer on one GPU, thread ranks sharing it (single-GPU loopback: every
// "peer" is the same HBM, so this measures kernels and protocol, not NVLink). Implementations:
//   ubep      Buffer, split phase (dispatch_send + dispatch_recv), zero-copy combine input
//   bsp       Buffer with Algorithm::kBsp: the same kernels with group barriers between stages
//   pack_copy the path users write (baselines.cu); throughput layout only
//   copy_bound one device-to-device copy of the bytes the op moves (baselines.cu)
// ubep and bsp run once per --placement (compact, per-source; auto resolves per layout); ubep
// also times compact() (op "compact": the valid rows copied densely, for a dense expert GEMM).
// Every row is wall time until the result is there, median and p99 over --iters: Buffer ops on
// every rank from a group barrier to the call's return, the slowest rank per iteration
// (buffer_timing.cu); baselines from enqueue to the end of a stream synchronisation.
// `ubep-bench --backend cuda` maps here.
// JSON (--json FILE): {"config": {...}, "results": [{"impl","placement","op","median_us",...}]}.
#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "ubep/cuda.hpp"

using namespace ubep;
using namespace ubep::cuda_bench;

namespace ubep::cuda_bench {

Workload make_workload(const Shape& sh, int R, Layout layout) {
  Workload w;
  w.shape = sh;
  w.ranks = R;
  w.layout = layout;
  const auto ranks = static_cast<size_t>(R);
  w.rows.assign(ranks, std::vector<int64_t>(ranks, 0));
  w.tokens_to.assign(ranks, std::vector<std::vector<int64_t>>(ranks));
  const int experts_per_rank = sh.experts / R;
  std::mt19937 rng(42);
  for (size_t s = 0; s < ranks; ++s) {
    std::vector<int64_t>& idx = w.topk_idx.emplace_back();
    for (int64_t t = 0; t < sh.tokens; ++t) {
      std::vector<bool> to(ranks, false);
      const size_t first = idx.size();
      while (idx.size() - first < static_cast<size_t>(sh.topk)) {  // topk distinct experts
        const auto e = static_cast<int64_t>(rng() % static_cast<uint32_t>(sh.experts));
        if (std::find(idx.begin() + static_cast<std::ptrdiff_t>(first), idx.end(), e) != idx.end())
          continue;
        idx.push_back(e);
        to[static_cast<size_t>(e / experts_per_rank)] = true;
        if (layout == Layout::kLatency) w.bytes_moved += static_cast<double>(w.row_bytes());
      }
      for (size_t d = 0; d < ranks; ++d) {
        if (!to[d]) continue;
        w.tokens_to[s][d].push_back(t);
        ++w.rows[s][d];
        if (layout == Layout::kThroughput) w.bytes_moved += static_cast<double>(w.row_bytes());
      }
    }
  }
  return w;
}

void report(const Workload& w, const std::string& placement, const std::string& impl,
            const std::string& op, const std::vector<double>& us, std::vector<Row>& out) {
  const double med = percentile(us, 0.5), p99 = percentile(us, 0.99);
  out.push_back({w.shape.name, layout_name(w.layout), placement, impl, op, med, p99,
                 w.bytes_moved / (med * 1e3)});
  std::printf("%-8s %-10s %-10s %-11s %-9s %10.1f %10.1f %9.1f\n", w.shape.name.c_str(),
              layout_name(w.layout), placement.c_str(), impl.c_str(), op.c_str(), med, p99,
              out.back().gbps);
  std::fflush(stdout);
}

}  // namespace ubep::cuda_bench

namespace {

void write_json(const std::string& path, const char* device, int R, int iters, int warmup,
                const std::vector<Row>& rows) {
  std::ofstream f(path);
  f << "{\"config\": {\"bench\": \"ubep-cuda-bench\", \"device\": \"" << device
    << "\", \"ranks\": " << R
    << ", \"note\": \"single-GPU loopback (thread ranks sharing one GPU), not NVLink\", "
       "\"timing\": \"wall time to the result; Buffer ops: slowest rank after a group barrier\", "
       "\"dtype\": \"bf16\", \"iters\": "
    << iters << ", \"warmup\": " << warmup << "},\n \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i)
    f << (i ? ",\n  " : "\n  ") << "{\"workload\": \"" << rows[i].workload << "\", \"layout\": \""
      << rows[i].layout << "\", \"placement\": \"" << rows[i].placement << "\", \"impl\": \""
      << rows[i].impl << "\", \"op\": \"" << rows[i].op
      << "\", \"median_us\": " << rows[i].median_us << ", \"p99_us\": " << rows[i].p99_us
      << ", \"gbps\": " << rows[i].gbps << "}";
  f << "\n]}\n";
}

// One shape and layout: the Buffer per placement, then the baselines once.
void bench_layout(const Shape& sh, int R, Layout l, const std::vector<Placement>& placements,
                  int warmup, int iters, std::vector<Row>& rows) {
  const Workload w = make_workload(sh, R, l);
  for (Placement pl : placements) {
    try {
      time_buffer(w, pl, warmup, iters, rows);
    } catch (const std::exception& e) {
      std::printf("%-8s %-10s %-10s FAILED: %s\n", sh.name.c_str(), layout_name(l),
                  placement_name(pl), e.what());
    }
  }
  time_copy_bound(w, warmup, iters, rows);
  time_pack_copy(w, warmup, iters, rows);
}

}  // namespace

namespace {

struct Options {
  std::string workload = "all", layouts = "both", json;
  std::vector<Placement> placements = {Placement::kCompact, Placement::kPerSource};
  int ranks = 8, iters = 50, warmup = 5;
};

const char* const kUsage =
    "usage: ubep-cuda-bench [--workload decode|prefill|tiny|all] [--layout "
    "throughput|latency|both] [--placement auto|compact|per-source|both] [--ranks 8] [--iters 50] "
    "[--warmup 5] [--json FILE]\n";

int parse_count(const std::string& flag, const std::string& value, int min) {
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || n < min)
    throw std::invalid_argument(flag + " " + value + ": want an integer >= " + std::to_string(min));
  return n;
}

// Throws std::invalid_argument naming the flag and the value it refuses.
Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(k + ": missing value");
    const std::string v = argv[i + 1];
    if (k == "--workload" && (v == "all" || v == "decode" || v == "prefill" || v == "tiny"))
      o.workload = v;
    else if (k == "--layout" && (v == "both" || v == "throughput" || v == "latency"))
      o.layouts = v;
    else if (k == "--placement")
      o.placements = v == "both" ? o.placements : std::vector<Placement>{parse_placement(v)};
    else if (k == "--ranks")
      o.ranks = parse_count(k, v, 1);
    else if (k == "--iters")
      o.iters = parse_count(k, v, 1);
    else if (k == "--warmup")
      o.warmup = parse_count(k, v, 0);
    else if (k == "--json")
      o.json = v;
    else
      throw std::invalid_argument(k + " " + v + ": unknown flag or value");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ubep-cuda-bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  std::string why;
  if (!cuda::device_available(&why)) {
    std::printf("SKIPPED: no usable CUDA device (%s); nothing measured\n", why.c_str());
    return 77;
  }
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf(
      "ubep-cuda-bench on %s: ubep::Buffer, %d thread ranks sharing it, single-GPU loopback "
      "(not NVLink)\n",
      prop.name, o.ranks);
  std::printf("%-8s %-10s %-10s %-11s %-9s %10s %10s %9s\n", "workload", "layout", "placement",
              "impl", "op", "median_us", "p99_us", "GB/s");
  const std::vector<Shape> shapes = {{"decode", 128, 7168, 8, 256},
                                     {"prefill", 4096, 7168, 8, 256},
                                     {"tiny", 8, 256, 2, 4 * o.ranks}};
  std::vector<Row> rows;
  for (const Shape& sh : shapes) {
    if (o.workload != "all" && o.workload != sh.name) continue;
    for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
      if (o.layouts != "both" && o.layouts != layout_name(l)) continue;
      if (sh.name == "prefill" && l == Layout::kLatency) continue;  // [El, R*T] rows: too large
      bench_layout(sh, o.ranks, l, o.placements, o.warmup, o.iters, rows);
    }
  }
  if (!o.json.empty()) write_json(o.json, prop.name, o.ranks, o.iters, o.warmup, rows);
  return 0;
}
