// What the CUDA host-model suites share: a small CUDA config, and a Sequencer for 4 ranks (2 of
// them local) whose window bases all point at one host array (the host model computes
// addresses and never dereferences kernel memory), with dispatch arguments tagged as device
// tensors for that config.
#pragma once

#include <initializer_list>
#include <vector>

#include "backend/cuda/sequencer.hpp"
#include "ubep/buffer.hpp"

namespace ubep::cuda_test {

inline BufferConfig cuda_config() {
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, 0};
  cfg.max_tokens_per_rank = 8;
  cfg.hidden = 16;
  cfg.num_experts = 8;
  cfg.max_topk = 2;
  return cfg;
}

struct SequencerRig {
  SequencerRig(const BufferConfig& config, size_t bytes)
      : cfg(config), mem(bytes), q(cfg, 4, 0, 2) {
    q.set_bases({mem.data(), mem.data(), mem.data(), mem.data()});
    for (int i = 0; i < 2; ++i) q.set_rank_memory(i, mem.data(), mem.data());
  }
  TensorView dev(DType t, std::initializer_list<int64_t> dims) {
    TensorView v(mem.data(), t, dims);
    v.device = cfg.device;
    return v;
  }
  // 4 tokens of hidden 16, top-2, in `layout`.
  DispatchArgs dispatch_args(Layout layout) {
    DispatchArgs a;
    a.x = dev(DType::kBF16, {4, 16});
    a.topk_idx = dev(DType::kInt64, {4, 2});
    a.topk_weights = dev(DType::kFP32, {4, 2});
    a.layout = layout;
    return a;
  }

  BufferConfig cfg;  // before q, which is built from it
  std::vector<char> mem;
  cuda_host::Sequencer q;
};

}  // namespace ubep::cuda_test
