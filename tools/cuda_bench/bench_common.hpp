// ubep-cuda-bench's shared pieces (cuda_bench.cu): the workload every implementation moves, the
// rows of the result table, device inputs, and the wall-clock timing every row uses.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ubep/buffer.hpp"

namespace ubep::cuda_bench {

// Exits with the CUDA error: the bench has nothing to report after one.
inline void ck(cudaError_t e, const char* what) {
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

// One line of the table: median and p99 over the timed iterations, GB/s = bytes moved / median.
struct Row {
  std::string workload, layout, placement, impl, op;
  double median_us, p99_us, gbps;
};

// Uniform top-k routing of every rank (host) and what it implies: the rows each source sends to
// each destination, and the bytes one dispatch (or combine) moves over all ranks.
struct Workload {
  Shape shape;
  int ranks = 0;
  Layout layout = Layout::kThroughput;
  std::vector<std::vector<int64_t>> topk_idx;                // [rank][token * topk + j]
  std::vector<std::vector<int64_t>> rows;                    // [source][destination]
  std::vector<std::vector<std::vector<int64_t>>> tokens_to;  // [source][destination] tokens
  double bytes_moved = 0;
  size_t row_bytes() const { return static_cast<size_t>(shape.hidden) * 2; }  // bf16
};
Workload make_workload(const Shape& shape, int ranks, Layout layout);

// Fills n bf16 values with small finite numbers derived from (index, seed).
void fill_bf16(uint16_t* p, size_t n, uint32_t seed, cudaStream_t s);

// One rank's inputs in device memory (x filled on the device, routing uploaded), as DispatchArgs
// for a Buffer on cuda:0. Allocated before any call and freed after the Buffer is gone (cudaFree
// synchronises the device, which would stall a peer rank's kernel waiting for this rank).
struct RankDeviceInputs {
  char* x = nullptr;
  int64_t* topk_idx = nullptr;
  float* topk_weights = nullptr;
  DispatchArgs args;
  RankDeviceInputs(const Workload& w, int rank);
  ~RankDeviceInputs();
  RankDeviceInputs(const RankDeviceInputs&) = delete;
  RankDeviceInputs& operator=(const RankDeviceInputs&) = delete;
};

inline double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// Wall time in microseconds of fn() until the stream has finished it, after `warmup` untimed
// runs: what a caller waiting for the result sees, the same measure as a Buffer call (which
// returns once its kernels are done).
template <typename Fn>
std::vector<double> time_on_stream(cudaStream_t s, int warmup, int iters, Fn&& fn) {
  std::vector<double> us;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ck(cudaStreamSynchronize(s), "timed op");
    const std::chrono::duration<double, std::micro> t = std::chrono::steady_clock::now() - t0;
    if (i >= warmup) us.push_back(t.count());
  }
  return us;
}

// Appends the row of one (impl, op) and prints it.
void report(const Workload& w, const std::string& placement, const std::string& impl,
            const std::string& op, const std::vector<double>& us, std::vector<Row>& out);

// The implementations (buffer_timing.cu, baselines.cu). `placement` applies to the Buffer only.
void time_buffer(const Workload& w, Placement placement, int warmup, int iters,
                 std::vector<Row>& out);
void time_copy_bound(const Workload& w, int warmup, int iters, std::vector<Row>& out);
void time_pack_copy(const Workload& w, int warmup, int iters, std::vector<Row>& out);

}  // namespace ubep::cuda_bench
