// ubep-bench's inputs and its identity expert (workload.cpp); shared by the measurements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench.hpp"

namespace ubep::tools {

// One rank's inputs: bf16/fp32 tokens in [-1, 1), the routing, and for fp8 the codes and scales
// made before the timed calls.
struct Input {
  std::vector<char> x;
  std::vector<int64_t> idx;
  std::vector<float> w;
  std::vector<uint8_t> codes;  // fp8: x quantized before the timed calls
  std::vector<float> scales;
  std::vector<uint16_t> expert_out;  // fp8: the expert's bf16 output for the baseline
  DispatchArgs args;
};
Input make_input(const Group& g, const BenchOptions& o);

// The expert (untimed): the identity, written into buf's zero-copy combine buffer (nullptr: the
// baseline, which combines recv_x itself); fp8 dequantizes its valid rows into bf16.
CombineArgs expert_identity(const DispatchResult& r, Buffer* buf, size_t row_bytes);
// Reads one word of every cache line of [data, data + bytes), as a caller's first pass over a
// combine output does (the result is kept from the optimiser).
void read_every_line(const void* data, size_t bytes);
CombineArgs expert_fp8(const DispatchResult& r, Buffer* buf, Input& in, int64_t hidden);
// The fp8 expert's work on one row: its codes and scales dequantized (through `scratch`, hidden
// floats) into a bf16 row. The bound harness's expert step does the same (BoundHarness).
void expert_fp8_row(const uint8_t* codes, const float* scales, int64_t hidden, float* scratch,
                    uint16_t* out);

// Bytes a dispatch delivered to this rank, and the bytes its combine brings back to it.
double dispatch_bytes(const DispatchResult& r, size_t row_bytes);
double combine_bytes(const Input& in, const BenchOptions& o, int ranks, size_t row_bytes);

// --dump: one call's inputs and outputs of this rank as .npy files + meta.json.
void dump_call(Group& g, const BenchOptions& o, const Input& in, const DispatchResult& r,
               const TensorView& y, const std::string& impl);

}  // namespace ubep::tools
