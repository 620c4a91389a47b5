// The expert-layer test harness: a row-local test "GEMM", per-rank inputs, an independent
// reference of y, and run_case (dispatch with a Buffer, run the layer, compare bit for bit).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ubep/bf16.hpp"
#include "ubep/buffer.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"
#include "ubep/moe.hpp"

namespace ubep::moe::test {

inline float stored(float v, DType dt) {
  return dt == DType::kBF16 ? bf16_to_float(float_to_bf16(v)) : v;
}

// The test "GEMM": row-local, deterministic, different per global expert. Reference and tile
// function evaluate the same float expression, so they agree bit for bit.
inline float expert_value(const float* row, int64_t h, int64_t H, int global_expert) {
  return row[h] * (1.0f + 0.125f * static_cast<float>(global_expert)) + 0.5f * row[(h + 1) % H] -
         0.01f * static_cast<float>(global_expert);
}

TileFn test_tile_fn(int rank, int local_experts, int64_t H);

struct RankData {
  int64_t tokens = 0;
  int topk = 1;
  std::vector<char> x;  // [tokens, H] dtype
  std::vector<int64_t> idx;
  std::vector<float> w;
};

inline float load(const char* base, int64_t i, DType dt) { return load_value(base, i, dt); }
inline void store(char* base, int64_t i, float v, DType dt) { store_value(base, i, v, dt); }

RankData make_rank(RouterMode mode, int experts, int topk, int64_t tokens, int64_t H, DType dt,
                   uint64_t seed);
// Independent reference of rank `me`'s y, from every rank's inputs.
std::vector<char> reference_y(const std::vector<RankData>& all, int me, int64_t H, DType dt);

struct Case {
  int ranks = 2;
  int experts = 8;
  int topk = 2;
  int64_t H = 16;
  DType dtype = DType::kBF16;
  int64_t capacity = 12;
  RouterMode mode = RouterMode::kBalanced;
  int64_t tile = 4;
  int compute_workers = 1;
  int comm_workers = 1;
  bool remote_first = true;
  uint64_t seed = 1;
  uint64_t initial_epoch = 0;
  int calls = 2;
  bool random_tokens = true;
  bool delays = false;
  // Each call runs the serial schedule, then the overlapped one; false: only the overlapped.
  bool serial = true;
  // A fixed sleep before every tile (the communication workers scan long before it is done).
  int compute_delay_us = 0;
  bool check_buffer_latency = true;
};

std::string describe(const Case& c);

inline bool same_bits(const TensorView& y, const std::vector<char>& want) {
  return y.bytes() == want.size() &&
         (want.empty() || std::memcmp(y.data, want.data(), want.size()) == 0);
}

// Runs `c.calls` calls; each call routes anew, runs serial (unless !c.serial) and overlapped,
// and checks both against the reference (and, optionally, Buffer's latency combine fed with the
// layer's outputs).
void run_case(const Case& c);

}  // namespace ubep::moe::test
