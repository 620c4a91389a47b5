// A single-process reference of dispatch and combine, written for clarity, used by tests only.
// It works from every rank's inputs at once, so it does not share code paths with the library.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "ubep/bf16.hpp"
#include "ubep/buffer.hpp"

namespace ubep::test {

enum class Routing { kUniform, kHot, kWithDrops };

struct RankInput {
  int64_t tokens = 0;
  int topk = 0;
  std::vector<uint16_t> x_bf16;  // used when dtype is bf16
  std::vector<float> x_f32;      // used when dtype is fp32
  std::vector<int64_t> topk_idx;
  std::vector<float> topk_weights;
  DispatchArgs args(DType dt, int64_t hidden, Layout layout) const;
};

// The device the Buffer-level suites run on: UBEP_TEST_DEVICE ("cpu" unless set; ctest runs
// chosen suites again with "cuda-sim", label cuda_sim). Test inputs and configs are tagged with
// it; on cuda-sim the memory is host memory, so the same checks read results directly.
Device test_device();
// Short timeouts in tests are stretched this much on the simulation device, whose calls start a
// thread per simulated GPU thread and so take milliseconds even when nothing is wrong.
inline int test_time_scale() { return test_device().type == DeviceType::kCudaSim ? 5 : 1; }
inline TensorView on_test_device(TensorView v) {
  v.device = test_device();
  return v;
}

struct Problem {
  int ranks = 1;
  int experts = 8;
  int64_t hidden = 16;
  DType dtype = DType::kFP32;
  int ranks_per_host = 0;  // 0: one host
  std::vector<RankInput> inputs;
  int host_of(int rank) const { return ranks_per_host ? rank / ranks_per_host : 0; }
  int num_hosts() const {
    return ranks_per_host ? (ranks + ranks_per_host - 1) / ranks_per_host : 1;
  }
  float value(int rank, int64_t t, int64_t h) const;  // x[rank][t][h] as float
};

// Random problem: token counts per rank from `tokens` (entry per rank), routing style.
Problem make_problem(int ranks, int experts, int64_t hidden, DType dt,
                     const std::vector<int64_t>& tokens, int topk, Routing routing, uint64_t seed);

// The "expert" applied by tests before combine: deterministic, depends on the value and the
// expert (latency layout) or the expert rank (throughput layout).
float expert_fn(float v, int64_t which);
// Rounds through the dtype, as a stored value would be.
float stored(float v, DType dt);

// Expected dispatch outputs on rank `me`.
struct ExpectedDispatch {
  // throughput
  std::vector<std::array<int64_t, 2>> src;  // (rank, token) per row
  std::vector<std::vector<int32_t>> local_idx;
  std::vector<std::vector<float>> weights;
  // latency: per local expert, (rank, token) per row
  std::vector<std::vector<std::array<int64_t, 2>>> expert_rows;
};
ExpectedDispatch expected_dispatch(const Problem& p, int me);

using ExpertFn = float (*)(float v, int64_t which);

// Expected combine output of rank `me` (as floats rounded to the dtype), when every expert rank
// feeds combine with `expert` (expert_fn unless given) applied to its received rows. The order of
// the fp32 sum is DESIGN §2's, per host: each host's contributions from 0 in ascending rank (or k),
// then the host partials in ascending host order, the first taken as is (on one host: the plain
// order).
std::vector<float> expected_combine(const Problem& p, int me, Layout layout,
                                    ExpertFn expert = expert_fn);

}  // namespace ubep::test
