// ubep::Buffer on a GPU (BufferConfig::device = cuda:0): thread ranks through run_on_threads,
// every rank's Buffer running the CUDA kernels through KernelEngine; inputs uploaded, results
// downloaded and checked bit for bit against tests/reference.cpp with gpu_support.hpp's checks.
// Part of ubep_cuda_gpu_tests (label gpu): runs only where a GPU is.
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "gpu_support.hpp"
#include "ubep/buffer.hpp"
#include "ubep/group.hpp"

namespace ubep::gpu_test {

struct BufferCase {
  int ranks = 2;
  Layout layout = Layout::kThroughput;
  DType dtype = DType::kBF16;
  Algorithm algo = Algorithm::kUbep;
  Placement placement = Placement::kAuto;
  bool split = false, zero_copy = false;
  int calls = 3;
  std::string name() const {
    return "Buffer on cuda:0: " + std::to_string(ranks) + " thread ranks, " + layout_name(layout) +
           ", " + dtype_name(dtype) + ", " + algorithm_name(algo) + ", " +
           placement_name(placement) + (split ? ", split" : "") + (zero_copy ? ", zero-copy" : "");
  }
};

inline void run_buffer_case(const BufferCase& c) {
  const int R = c.ranks, El = 4, K = 2;
  const int64_t T = 8, H = 64;
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, 0};
  cfg.max_tokens_per_rank = T;
  cfg.hidden = H;
  cfg.dtype = c.dtype;
  cfg.num_experts = R * El;
  cfg.max_topk = K;
  cfg.algorithm = c.algo;
  cfg.placement = c.placement;
  std::mt19937 rng(99u + static_cast<unsigned>(R));
  std::vector<test::Problem> problems;
  for (int call = 0; call < c.calls; ++call) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < R; ++r) tokens.push_back(static_cast<int64_t>(rng() % (T + 1)));
    problems.push_back(
        test::make_problem(R, R * El, H, c.dtype, tokens, K, test::Routing::kWithDrops, rng()));
  }
  run_on_threads(R, [&](Group& g) {
    const int d = g.rank();
    Buffer buf(g, cfg);
    for (const test::Problem& p : problems) {
      RankInputs in(p, d, c.layout);
      DispatchResult r;
      if (c.split) {
        buf.dispatch_send(in.args);
        r = buf.dispatch_recv();
      } else {
        r = buf.dispatch(in.args);
      }
      const int64_t RT = R * T;
      std::vector<char> comb = check_dispatch(p, d, r, r.num_recv_rows, El, RT, K);
      CombineArgs a;
      a.handle = r.handle;
      std::unique_ptr<DevMem> mem;
      if (c.zero_copy) {
        a.x = buf.combine_buffer();
      } else {
        mem = std::make_unique<DevMem>(comb.size());
        a.x = r.recv_x;
        a.x.data = mem->p;
      }
      upload(a.x.data, comb.data(), comb.size());
      TensorView y;
      if (c.split) {
        buf.combine_send(a);
        y = buf.combine_recv();
      } else {
        y = buf.combine(a);
      }
      check_combine(p, d, y, test::expected_combine(p, d, c.layout));
    }
  });
}

}  // namespace ubep::gpu_test
