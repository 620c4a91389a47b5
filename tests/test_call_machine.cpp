// The one split-phase state machine both engines run (src/protocol/call_machine.hpp) and the one
// BufferConfig validator (src/protocol/config_checks.hpp), on their own: which calls each phase
// admits, what a rejection and a break tell the peers (through the failure-word callbacks), and
// that every component's config errors name the field and the value.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "protocol/call_machine.hpp"
#include "protocol/config_checks.hpp"
#include "ubep/buffer.hpp"
#if UBEP_TEST_HAS_MOE
#include "ubep/moe.hpp"
#endif

namespace ubep::test {
namespace {

using protocol::CallMachine;
using protocol::FailureFate;
using protocol::Phase;

// A rank of 2 whose peer's failure word the test sets, and whose own published words it records.
struct Words {
  uint32_t peer = 0;
  std::vector<uint32_t> published;
  CallMachine machine{0, 2, [this](int) { return peer; },
                      [this](uint32_t w) { published.push_back(w); }};
};

template <typename Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no exception";
}

TEST(CallMachine, SplitPhaseCallsNeedTheirFirstHalf) {
  Words w;
  CallMachine& m = w.machine;
  EXPECT_TRUE(m.idle());
  EXPECT_EQ(message_of([&] { m.require_dispatch_sent("dispatch_recv"); }),
            "dispatch_recv: no dispatch_send outstanding");
  EXPECT_EQ(message_of([&] { m.require_combine_sent("combine_recv"); }),
            "combine_recv: no combine_send outstanding");
  EXPECT_EQ(message_of([&] { m.require_dispatch("combine"); }),
            "combine: no dispatch on this buffer yet");
  m.start("dispatch_send");
  m.accept("dispatch_send", [] {});
  m.dispatched();
  m.enter(Phase::kDispatchSent);
  EXPECT_NO_THROW(m.require_dispatch_sent("dispatch_recv"));
  EXPECT_NO_THROW(m.require_pending_latency_dispatch(Layout::kLatency));
  EXPECT_THROW(m.require_pending_latency_dispatch(Layout::kThroughput), InvalidArgument);
  EXPECT_EQ(message_of([&] { m.require_idle("dispatch"); }),
            "dispatch: a split-phase call is still outstanding on this buffer");
  m.enter(Phase::kDispatchReceived);  // a receive hook ran the receive (kernels)
  EXPECT_NO_THROW(m.require_dispatch_sent("dispatch_recv"));
  m.enter(Phase::kIdle);
  EXPECT_NO_THROW(m.require_dispatch("combine"));
  EXPECT_FALSE(m.mark_combined());
  EXPECT_TRUE(m.mark_combined());  // a second combine of one dispatch is a repeat
  m.dispatched();
  EXPECT_FALSE(m.combined());
  EXPECT_EQ(m.calls(), 1u);
  EXPECT_TRUE(w.published.empty());
}

TEST(CallMachine, OnlyUbepSplitsCalls) {
  EXPECT_NO_THROW(CallMachine::require_split_phase("dispatch_send", Algorithm::kUbep));
  EXPECT_EQ(message_of([] { CallMachine::require_split_phase("combine_send", Algorithm::kBsp); }),
            "combine_send: split-phase calls need the ubep algorithm, this buffer runs bsp");
}

TEST(CallMachine, RejectedInputTellsThePeersAndLeavesTheBufferUsable) {
  Words w;
  CallMachine& m = w.machine;
  m.start("dispatch");
  EXPECT_THROW(m.accept("dispatch", [] { throw InvalidArgument("bad x"); }), InvalidArgument);
  ASSERT_EQ(w.published.size(), 1u);
  EXPECT_EQ(w.published[0], protocol::fail_marker(1));
  EXPECT_FALSE(m.ledger().broken());
  m.start("dispatch");  // the next call starts
  EXPECT_EQ(m.calls(), 2u);
}

TEST(CallMachine, AFailedPhaseBreaksUnlessTheRanksAreInStep) {
  for (FailureFate fate : {FailureFate::kBreaks, FailureFate::kInStep, FailureFate::kAbandoned}) {
    Words w;
    CallMachine& m = w.machine;
    m.start("combine_send");
    m.accept("combine_send", [] {});
    m.enter(Phase::kCombineSent);
    EXPECT_THROW(m.run(
                     "combine_recv", [&]() -> int { throw std::runtime_error("lost"); },
                     [&](const std::exception&) { return fate; }),
                 std::runtime_error);
    EXPECT_EQ(m.ledger().broken(), fate == FailureFate::kBreaks);
    EXPECT_EQ(m.idle(), fate != FailureFate::kInStep);
    if (fate == FailureFate::kBreaks) {
      EXPECT_EQ(w.published.back(), protocol::broken_marker(1));
      EXPECT_THROW(m.start("dispatch"), BrokenBufferError);
    }
  }
}

TEST(CallMachine, APeerThatBrokeFailsTheCallAtJoin) {
  Words w;
  CallMachine& m = w.machine;
  m.start("dispatch");
  w.peer = protocol::broken_marker(1);  // the peer broke in this very call
  EXPECT_THROW(m.accept("dispatch", [] {}), PeerFailedError);
  EXPECT_TRUE(m.idle());
  EXPECT_THROW(m.start("dispatch"), BrokenBufferError);
}

TEST(CallMachine, DepartureNamesTheNextCallOnlyWhenThisOneWasSent) {
  Words idle, outstanding;
  for (Words* w : {&idle, &outstanding}) {
    w->machine.start("dispatch_send");
    w->machine.accept("dispatch_send", [] {});
  }
  outstanding.machine.enter(Phase::kDispatchSent);
  idle.machine.depart();
  outstanding.machine.depart();
  EXPECT_EQ(idle.published.back(), protocol::broken_marker(2));
  EXPECT_EQ(outstanding.published.back(), protocol::broken_marker(1));
}

// Every component that sizes memory from a config names the field and the value, in one form.
TEST(ConfigChecks, EveryFieldAndEveryComponentNamesTheValue) {
  struct Case {
    void (*set)(BufferConfig&);
    const char* message;
  };
  const Case cases[] = {
      {[](BufferConfig& c) { c.max_tokens_per_rank = 0; },
       "max_tokens_per_rank must be >= 1, got 0"},
      {[](BufferConfig& c) { c.max_tokens_per_rank = int64_t{1} << 30; },
       "max_tokens_per_rank must be < 2^30, got 1073741824"},
      {[](BufferConfig& c) { c.max_tokens_per_rank = int64_t{1} << 24; },
       "max_tokens_per_rank must be < 2^24 with enable_latency_layout (a latency row's record "
       "holds its token in 24 bits), got 16777216"},
      {[](BufferConfig& c) { c.hidden = -3; }, "hidden must be >= 1, got -3"},
      {[](BufferConfig& c) { c.num_experts = 7; },
       "num_experts 7 must be a positive multiple of the group size 2"},
      {[](BufferConfig& c) { c.max_topk = 65; }, "max_topk must be in [1, 64], got 65"},
      {[](BufferConfig& c) { c.num_workers = 2000; },
       "num_workers must be in [-1, 1024], got 2000"},
  };
  for (const Case& k : cases) {
    BufferConfig c;
    c.num_experts = 8;
    k.set(c);
    for (const char* who : {"Buffer", "AlltoallBaseline", "CUDA buffer"}) {
      const std::string got = message_of([&] {
        protocol::check_buffer_config(c, 2, who, {.fp8 = std::string(who) != "CUDA buffer"});
      });
      EXPECT_EQ(got, std::string(who) + ": " + k.message);
    }
  }
  BufferConfig throughput_only;  // the latency record's token limit binds only that layout
  throughput_only.num_experts = 8;
  throughput_only.enable_latency_layout = false;
  throughput_only.max_tokens_per_rank = int64_t{1} << 24;
  EXPECT_NO_THROW(protocol::check_buffer_config(throughput_only, 2, "Buffer"));
  BufferConfig fp8;
  fp8.num_experts = 8;
  fp8.dtype = DType::kFP8E4M3;
  EXPECT_NO_THROW(protocol::check_buffer_config(fp8, 2, "Buffer"));
  EXPECT_EQ(
      message_of([&] { protocol::check_buffer_config(fp8, 2, "ExpertLayer", {.fp8 = false}); }),
      "ExpertLayer: dtype must be bf16, fp32 (no fp8), got fp8");
}

// The components themselves go through the validator: each error carries its name.
TEST(ConfigChecks, TheComponentsUseIt) {
  run_on_threads(2, [](Group& g) {
    BufferConfig c;
    c.num_experts = 8;
    c.hidden = 0;
    EXPECT_NE(message_of([&] { Buffer b(g, c); }).find("Buffer: hidden must be >= 1, got 0"),
              std::string::npos);
#if UBEP_TEST_HAS_MOE
    moe::ExpertLayerConfig e;
    e.num_experts = 8;
    e.max_topk = 0;
    EXPECT_EQ(message_of([&] { moe::ExpertLayer layer(g, e); }),
              "ExpertLayer: max_topk must be in [1, 64], got 0");
#endif
  });
}

}  // namespace
}  // namespace ubep::test
