// Runs one dispatch + expert + combine case on a group and checks it against the reference.
#pragma once

#include <functional>
#include <string>

#include "reference.hpp"
#include "ubep/baseline.hpp"
#include "ubep/buffer.hpp"
#include "ubep/error.hpp"

namespace ubep::test {

enum class Impl { kBsp, kUbep, kBaseline };
const char* impl_name(Impl i);

struct Case {
  int experts = 8;
  int64_t hidden = 16;
  DType dtype = DType::kFP32;
  int64_t capacity = 8;  // max tokens per rank
  int topk = 2;
  Routing routing = Routing::kUniform;
  Layout layout = Layout::kThroughput;
  Placement placement = Placement::kAuto;
  std::vector<int64_t> tokens;  // per rank; empty = capacity on every rank
  uint64_t seed = 1;
  std::string describe() const;
};

// Builds the combine input from a dispatch result (the "expert"), as the tests' experts do.
std::vector<char> expert_outputs(const DispatchResult& r, const Buffer* buf_or_null, DType dt,
                                 int64_t hidden, int rank, int local_experts);

// One rank's part of a case: dispatch, check, expert, combine, check; returns y's bytes.
// Uses `buffer` (bsp/ubep) or `baseline`. Failures are reported through GoogleTest.
std::vector<char> run_and_check(Group& g, const Case& c, const Problem& p, Buffer* buffer,
                                AlltoallBaseline* baseline, bool zero_copy_combine = false,
                                const std::function<Problem()>& expect = {},
                                const std::function<void()>& before_combine = {});
// `expect`: the problem the results are checked against when it differs from the inputs', asked
// for once dispatch returned (an elastic test's: the inputs with the ranks masked in that call
// dropped). `before_combine`: run between the dispatch's checks and the combine (a rejected
// call in between, say).

BufferConfig config_for(const Case& c, Algorithm algo);

}  // namespace ubep::test
