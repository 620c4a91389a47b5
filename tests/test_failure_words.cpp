// The failure words peers publish (src/protocol/protocol.hpp): which of a peer's words end this
// rank's call at once, and which call a word names, including across the counter's wrap.
#include <gtest/gtest.h>

#include <cstdint>

#include "protocol/protocol.hpp"

namespace ubep::test {
namespace {

using protocol::broken_marker;
using protocol::fail_marker;
using protocol::failure_ends_call;
using protocol::marked_call;

TEST(FailureWords, RejectionEndsOnlyTheCallItNames) {
  EXPECT_FALSE(failure_ends_call(0u, 7));
  EXPECT_TRUE(failure_ends_call(fail_marker(7), 7));
  EXPECT_FALSE(failure_ends_call(fail_marker(6), 7));  // an earlier rejection: that call is over
  EXPECT_FALSE(failure_ends_call(fail_marker(8), 7));
}

TEST(FailureWords, BreakEndsOnlyItsCallAndLaterOnes) {
  // A peer that broke in call 8 or 9 had finished call 7: call 7 may still complete here.
  EXPECT_FALSE(failure_ends_call(broken_marker(8), 7));
  EXPECT_FALSE(failure_ends_call(broken_marker(9), 7));
  EXPECT_TRUE(failure_ends_call(broken_marker(7), 7));
  EXPECT_TRUE(failure_ends_call(broken_marker(6), 7));
  EXPECT_NE(broken_marker(7), fail_marker(7));
}

TEST(FailureWords, NamedCallSurvivesTheWrap) {
  const uint64_t period = protocol::kMarkerPeriod;
  for (uint64_t call : {uint64_t{1}, uint64_t{2}, period - 1, period, period + 1, 3 * period + 5}) {
    for (int64_t d : {-2, -1, 0, 1, 2}) {
      if (d < 0 && call <= static_cast<uint64_t>(-d)) continue;  // calls count from 1
      const uint64_t peer = call + static_cast<uint64_t>(d);
      EXPECT_EQ(marked_call(broken_marker(peer), call), peer) << call << " " << d;
      EXPECT_EQ(marked_call(fail_marker(peer), call), peer) << call << " " << d;
    }
    EXPECT_FALSE(failure_ends_call(broken_marker(call + 1), call)) << call;
    EXPECT_TRUE(failure_ends_call(broken_marker(call), call)) << call;
    EXPECT_NE(fail_marker(call), 0u);
  }
}

}  // namespace
}  // namespace ubep::test
