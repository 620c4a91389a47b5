// Checks one rank's dispatch and combine results against the test reference (tests/reference),
// bit for bit, and builds the "expert" outputs combine is fed with (the reference's expert_fn).
// Each check returns "" or a description of the first difference.
#pragma once

#include <string>
#include <vector>

#include "reference.hpp"
#include "ubep/buffer.hpp"

namespace ubep::fuzz {

struct RankView {
  const test::Problem& problem;
  int me;
  const BufferConfig& config;
  Layout layout;
  Placement placement;  // resolved (never kAuto)
};

std::string check_dispatch(const RankView& v, const DispatchResult& r);

// The expert outputs for combine shaped like recv_x (rows outside the received ranges are 0).
std::vector<char> expert_outputs(const RankView& v, const DispatchResult& r);

// Checks compact()'s rows (expert, then source rank, then token) and returns the expert outputs
// in that order, for combine with CombineArgs::compacted.
std::string check_compact(const RankView& v, const TensorView& rows, std::vector<char>* outputs);

// y against the reference's combine; `problem` carries the weights combine applied.
std::string check_combine(const RankView& v, const TensorView& y);

}  // namespace ubep::fuzz
