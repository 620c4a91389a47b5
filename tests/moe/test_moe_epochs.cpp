// The expert layer's epochs: the call sequence across the 32-bit tag wrap and across the 64-bit
// counter wrap (fuzz finding F7), and a stress run with random delays over many calls.
#include <gtest/gtest.h>

#include <cstdint>

#include "moe_harness.hpp"

namespace ubep::moe {
namespace {

using namespace test;

// Consecutive overlapped calls only (the per-tile ready tags are the one tag the layer does not
// double-buffer by parity), every result against the reference, and a sleep before every tile so
// the communication workers scan the ready tags long before a tile is computed: a stale ready tag
// equal to the current call's would make them ship the previous call's outputs at once.
Case epoch_case(uint64_t initial_epoch, DType dt) {
  Case c;
  c.ranks = 2;
  c.experts = 8;
  c.topk = 2;
  c.dtype = dt;
  c.capacity = 12;
  c.tile = 2;
  c.random_tokens = false;
  c.serial = false;
  c.compute_delay_us = 200;
  c.calls = 10;
  c.initial_epoch = initial_epoch;
  c.seed = 77;
  return c;
}

// tag_of wraps after 2^32-1 calls: tags ..., 2^32-2, 2^32-1, 1, 2, ... stay distinct.
TEST(ExpertLayerEpochs, TagWrapAround) {
  for (DType dt : {DType::kBF16, DType::kFP32}) run_case(epoch_case(0xFFFFFFFFull - 5, dt));
}

// An initial epoch near 2^64 (the fuzzer's choice for the Buffer in F7): tag_of(2^64-1) and
// tag_of(0) are both 1, so without protocol::first_seq_of the layer's 64-bit counter wraps
// between two calls with the same tag, and in the second one the communication workers take
// the first one's ready tags as current and ship stale rows (wrong y). The layer takes its
// epochs from protocol::CallSequence, like the Window, which starts at first_seq_of.
TEST(ExpertLayerEpochs, CounterWrapF7) {
  for (DType dt : {DType::kBF16, DType::kFP32}) run_case(epoch_case(~uint64_t{0} - 4, dt));
}

// Many back-to-back calls with changing routing and token counts, random delays in producers
// and shippers, more ranks than cores, epochs crossing the 32-bit tag wrap-around.
TEST(ExpertLayerStress, RandomDelaysManyCalls) {
  for (int ranks : {2, 4}) {
    Case c;
    c.ranks = ranks;
    c.experts = 4 * ranks;
    c.topk = 2;
    c.mode = ranks == 2 ? RouterMode::kStressSkew : RouterMode::kModerateSkew;
    c.tile = 2;
    c.compute_workers = 2;
    c.comm_workers = 2;
    c.capacity = 10;
    c.calls = ranks == 2 ? 150 : 60;
    c.delays = true;
    c.check_buffer_latency = false;
    c.initial_epoch = 0xFFFFFFFFull - 40;  // tag_of wraps after 2^32-1 calls
    c.seed = 4242 + static_cast<uint64_t>(ranks);
    run_case(c);
  }
}

}  // namespace
}  // namespace ubep::moe
