// Process ranks killed with SIGKILL in a decode loop (docs/ELASTIC.md): the survivors learn of
// the death from the death watch in milliseconds (not at the timeout), mask the dead rank at
// their next dispatch and go on; every completed call is checked against the reference with the
// dead rank's experts dropped (kill_run.cpp). A stopped rank is slow, not dead.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>

#include "kill_run.hpp"

namespace ubep::elastic {
namespace {

#if defined(__SANITIZE_THREAD__)
#define UBEP_SKIP_UNDER_TSAN() GTEST_SKIP() << "fork of a process under ThreadSanitizer"
#else
#define UBEP_SKIP_UNDER_TSAN() (void)0
#endif

void expect_survivors_went_on(const RunResult& res, const RunOptions& o, int kills) {
  ASSERT_TRUE(res.error.empty()) << res.error;
  int survivors = 0;
  for (int r = 0; r < o.ranks; ++r) {
    const RankReport& rep = res.ranks[static_cast<size_t>(r)];
    bool victim = false;
    for (const Victim& v : o.victims) victim = victim || v.rank == r;
    if (victim) {
      EXPECT_TRUE(rep.died) << "rank " << r;
      EXPECT_EQ(rep.exit_signal, SIGKILL) << "rank " << r;
      continue;
    }
    ++survivors;
    SCOPED_TRACE("rank " + std::to_string(r) + " first error: " + rep.first_error +
                 " | last: " + rep.last_error);
    EXPECT_FALSE(rep.died);
    EXPECT_EQ(rep.wrong, 0);
    EXPECT_EQ(rep.other_errors, 0);  // never a TimeoutError: the death watch named it
    // Every call ran to its end or failed with PeerFailedError (a failed dispatch skips its
    // combine); at most a few calls per death fail (the one in flight, echoes of peers that
    // left it), and the rest ran masked.
    EXPECT_LE(rep.failed, 3 * kills);
    EXPECT_GE(rep.completed, 2 * (o.calls - 3 * kills));
    EXPECT_GT(rep.masked_calls, 0);
    if (rep.failed > 0) {
      EXPECT_GE(rep.first_error_us, 0);
      EXPECT_LT(rep.first_error_us, 0.5e6 * o.timeout_ms / 1000.0);  // far below the timeout
    }
  }
  EXPECT_EQ(survivors, o.ranks - static_cast<int>(o.victims.size()));
}

struct KillParam {
  int ranks;
  KillPhase phase;
};

class KillOneRank : public testing::TestWithParam<KillParam> {};

TEST_P(KillOneRank, SurvivorsMaskItAndGoOn) {
  UBEP_SKIP_UNDER_TSAN();
  RunOptions o;
  o.ranks = GetParam().ranks;
  o.calls = 16;
  o.pace_us = 200;  // a late kill thread (a loaded machine) still lands mid-loop
  o.victims = {{1, 4, GetParam().phase}};
  const RunResult res = run_kill_loop(o);
  expect_survivors_went_on(res, o, 1);
  // Names are unlinked once every rank mapped them, so even a killed rank leaves none.
  EXPECT_EQ(res.leftover_segments(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Phases, KillOneRank,
    testing::Values(KillParam{3, KillPhase::kBefore}, KillParam{3, KillPhase::kDuring},
                    KillParam{3, KillPhase::kReceive}, KillParam{3, KillPhase::kBetween},
                    KillParam{4, KillPhase::kBefore}, KillParam{4, KillPhase::kDuring},
                    KillParam{4, KillPhase::kReceive}, KillParam{4, KillPhase::kBetween}),
    [](const testing::TestParamInfo<KillParam>& i) {
      return std::to_string(i.param.ranks) + "ranks_" + phase_name(i.param.phase);
    });

TEST(KillTwoRanks, SurvivorsMaskBoth) {
  UBEP_SKIP_UNDER_TSAN();
  RunOptions o;
  o.ranks = 4;
  o.calls = 12;
  o.victims = {{1, 3, KillPhase::kBefore}, {2, 7, KillPhase::kBetween}};
  expect_survivors_went_on(run_kill_loop(o), o, 2);
}

// SIGSTOP is not death: the watch stays quiet, the survivors wait out the group's timeout.
TEST(StoppedRank, IsNotDeclaredDead) {
  UBEP_SKIP_UNDER_TSAN();
  RunOptions o;
  o.ranks = 3;
  o.calls = 5;
  o.timeout_ms = 400;
  o.stop_ms = 1200;
  o.victims = {{1, 2, KillPhase::kStop}};
  const RunResult res = run_kill_loop(o);
  for (int r = 0; r < o.ranks; ++r) {
    const RankReport& rep = res.ranks[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r) + " completed " + std::to_string(rep.completed) +
                 " failed " + std::to_string(rep.failed) + " tail " +
                 std::to_string(rep.tail_failed) + " other " + std::to_string(rep.other_errors) +
                 " masked " + std::to_string(rep.masked_calls) + " first: " + rep.first_error +
                 " | last: " + rep.last_error);
    EXPECT_FALSE(rep.died) << "rank " << r;
    EXPECT_EQ(rep.wrong, 0) << "rank " << r;
    EXPECT_EQ(std::string(rep.first_error).find("died"), std::string::npos) << rep.first_error;
    if (r != 1) {
      // Its failed calls may all fall in the tail: the first survivor's buffer broke at the
      // timeout, and it ran through its last calls (each failing at once) before this one
      // read its word, so this one's echo ends its loop as a peer that finished (kill_run).
      EXPECT_GE(rep.other_errors + rep.failed + rep.tail_failed, 1) << "rank " << r;
      EXPECT_EQ(rep.masked_calls, 0) << "rank " << r;
    }
  }
  // A survivor times out; the other may instead get the echo (the first one's broken buffer).
  const std::string e0 = res.ranks[0].first_error, e2 = res.ranks[2].first_error;
  EXPECT_TRUE(e0.find("timed out") != std::string::npos ||
              e2.find("timed out") != std::string::npos)
      << e0 << " | " << e2;
}

}  // namespace
}  // namespace ubep::elastic

namespace ubep::elastic {
namespace {

// A replacement process for the dead rank joins the live Buffer (make_rejoin_group): the
// survivors map its windows at a dispatch, unmask it from an agreed call on, and every call of
// everyone, the replacement's first included, matches the reference.
TEST(KillAndReplace, ReplacementServesAndEveryCallIsRight) {
  UBEP_SKIP_UNDER_TSAN();
  RunOptions o;
  o.ranks = 4;
  o.calls = 60;
  o.pace_us = 1000;  // the replacement starts while the survivors are still at it
  Victim v{1, 4, KillPhase::kBefore};
  v.replace = true;
  o.victims = {v};
  const RunResult res = run_kill_loop(o);
  ASSERT_EQ(res.replacements.size(), 1u);
  const RankReport& rep = res.replacements[0];
  SCOPED_TRACE(std::string("replacement: ") + rep.first_error + " | " + rep.last_error);
  EXPECT_FALSE(rep.died);
  EXPECT_EQ(rep.wrong, 0);
  EXPECT_EQ(rep.other_errors, 0);
  EXPECT_GT(rep.completed, 0);
  EXPECT_GE(rep.first_call_us, 0);
  EXPECT_LT(rep.first_call_us, 1e6);  // serving within a second of its start
  EXPECT_EQ(rep.final_masked, 0);
  for (int r : {0, 2, 3}) {
    const RankReport& s = res.ranks[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + s.first_error + " | " + s.last_error);
    EXPECT_EQ(s.wrong, 0);
    EXPECT_EQ(s.other_errors, 0);
    EXPECT_EQ(s.final_masked, 0);  // unmasked again: its last calls ran with the replacement
  }
  EXPECT_EQ(res.leftover_segments(), 0);
}

// The replacement dies too, during its first (agreeing) dispatch: the survivors mask it again
// and go on; nothing wrong is returned anywhere.
TEST(KillAndReplace, DeathDuringTheRejoin) {
  UBEP_SKIP_UNDER_TSAN();
  RunOptions o;
  o.ranks = 3;
  o.calls = 40;
  o.pace_us = 1000;
  Victim v{2, 3, KillPhase::kBetween};
  v.replace = true;
  v.kill_replacement_at = 0;
  o.victims = {v};
  const RunResult res = run_kill_loop(o);
  ASSERT_EQ(res.replacements.size(), 1u);
  EXPECT_TRUE(res.replacements[0].died);
  EXPECT_EQ(res.replacements[0].wrong, 0);
  for (int r : {0, 1}) {
    const RankReport& s = res.ranks[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + s.first_error + " | " + s.last_error);
    EXPECT_EQ(s.wrong, 0);
    EXPECT_EQ(s.other_errors, 0);
    EXPECT_EQ(s.final_masked, 1);
  }
}

}  // namespace
}  // namespace ubep::elastic
