// The fuzz input decoded: a group shape, a Buffer config and a few dispatch+combine calls with
// per-rank routing, shapes and defects; and what each rank should observe (the validity model,
// written from the documented rules, independent of the library's checks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "reference.hpp"
#include "ubep/buffer.hpp"

namespace ubep::fuzz {

// A defect one rank's dispatch inputs may carry.
enum class Defect : uint8_t { kNone, kNullX, kNullIdx, kNullWeights, kWrongDtype, kWrongHidden };
const char* defect_name(Defect d);

// How a rank feeds combine: its own array, the buffer's zero-copy input, or compact() rows.
enum class CombineMode : uint8_t { kPlain, kZeroCopy, kCompacted };

struct RankCall {
  Layout layout = Layout::kThroughput;
  Defect defect = Defect::kNone;
  bool bad_combine_handle = false;  // combine with a handle that is not the dispatch's
};

struct CallPlan {
  Algorithm algorithm = Algorithm::kUbep;
  bool split_phase = false;  // ubep only: *_send then *_recv
  CombineMode combine = CombineMode::kPlain;
  bool replace_weights = false;  // latency layout, one host: combine takes new weights
  test::Problem problem;         // per-rank routing and values (tokens may exceed capacity)
  std::vector<RankCall> ranks;
  std::vector<std::vector<float>> combine_weights;  // per rank, [tokens * topk]
};

struct Scenario {
  int ranks = 1;
  int ranks_per_host = 0;
  BufferConfig config;
  std::vector<CallPlan> calls;
  std::string describe() const;
};

// What a call should give on every rank.
enum class Expect : uint8_t {
  kSuccess,           // every rank: results equal to the reference
  kConfigRejected,    // every rank: InvalidArgument from the Buffer constructor
  kDispatchRejected,  // the ranks with bad inputs: InvalidArgument; the others: PeerFailedError
                      // (or InvalidArgument)
  kDisagreement,      // valid inputs, but ranks disagree on layout or topk: InvalidArgument
  kCombineRejected,   // dispatch fine; combine: InvalidArgument on the bad rank, peers fail
};
const char* expect_name(Expect e);

// UBEP_FUZZ_STRICT=1: also generate the cases of the open findings (a rank with another layout;
// bad inputs across hosts), which today end in a TimeoutError instead of the documented error.
bool strict_mode();

// Decodes arbitrary bytes into a scenario (never fails; missing bytes read as 0).
Scenario decode(const uint8_t* data, size_t size);

bool config_valid(const Scenario& s);
// Whether rank r's dispatch inputs of call c are valid on their own (the documented rules).
bool dispatch_valid(const Scenario& s, const CallPlan& c, int r);
Expect expect_call(const Scenario& s, const CallPlan& c);

}  // namespace ubep::fuzz
