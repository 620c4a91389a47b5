// Elastic EP on thread ranks (docs/ELASTIC.md): masking a rank, the survivors' agreement through
// their windows, and the rank's return (rejoin), checked against the reference with the masked
// ranks' experts dropped. Process ranks killed with SIGKILL: test_elastic_kill.cpp.
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <thread>

#include "elastic_case.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

struct ElasticParam {
  int ranks;
  Algorithm algo;
  Layout layout;
};
std::string name_of(const testing::TestParamInfo<ElasticParam>& i) {
  return std::to_string(i.param.ranks) + "ranks_" + algorithm_name(i.param.algo) + "_" +
         layout_name(i.param.layout);
}

class MaskAndRejoin : public testing::TestWithParam<ElasticParam> {};

// Every rank makes a full call; the others mask the last rank, which stays idle, and make
// masked calls (a rank that did not call mask learns it at its next dispatch); the rank
// rejoins and the next call is full again -- every call checked against its reference.
TEST_P(MaskAndRejoin, SurvivorsGoOnAndTheRankComesBack) {
  const ElasticParam prm = GetParam();
  const int R = prm.ranks, victim = R - 1;
  std::barrier sync(R);
  GroupOptions opt;
  opt.timeout = std::chrono::milliseconds(20000);
  run_on_threads(
      R,
      [&](Group& g) {
        const int me = g.rank();
        // A rank that fails leaves the barriers, so its peers fail at their timeout, not hang.
        struct Drop {
          std::barrier<>& b;
          bool armed = true;
          ~Drop() {
            if (armed && std::uncaught_exceptions()) b.arrive_and_drop();
          }
        } drop{sync};
        Case c = elastic_case(R, prm.layout, 11);
        Buffer buf(g, config_for(c, prm.algo));
        run_and_check(g, c, elastic_problem(c, R), &buf, nullptr);
        sync.arrive_and_wait();
        if (me != victim) {
          if (me != 0) buf.mask(victim);  // rank 0 learns it from the others
          for (uint64_t seed = 12; seed < 15; ++seed) {
            c.seed = seed;
            elastic_call(g, c, elastic_problem(c, R), buf, seed == 13);
            EXPECT_EQ(buf.masked_ranks(), std::vector<int>{victim});
          }
        }
        sync.arrive_and_wait();
        if (me == victim) buf.rejoin();
        // The survivors see the rejoin at a dispatch of their own; until then their calls run
        // masked (each checked against the ranks it ran with). The victim's first call is the
        // agreed, full one.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (int i = 0;
             i == 0 || (!buf.masked_ranks().empty() && std::chrono::steady_clock::now() < deadline);
             ++i) {
          // One seed for every call of this loop: after a change the ranks' loops need not be
          // in step (a survivor may have made a masked call before it saw the rejoin), and the
          // reference assumes every rank passed the same problem's inputs.
          c.seed = 20;
          elastic_call(g, c, elastic_problem(c, R), buf, false);
          if (me == victim) break;
        }
        EXPECT_TRUE(buf.masked_ranks().empty()) << "rank " << me;
      },
      opt);
}

INSTANTIATE_TEST_SUITE_P(All, MaskAndRejoin,
                         testing::Values(ElasticParam{3, Algorithm::kUbep, Layout::kLatency},
                                         ElasticParam{3, Algorithm::kUbep, Layout::kThroughput},
                                         ElasticParam{4, Algorithm::kUbep, Layout::kLatency},
                                         ElasticParam{4, Algorithm::kBsp, Layout::kThroughput},
                                         ElasticParam{3, Algorithm::kBsp, Layout::kLatency}),
                         name_of);

// A masked rank that keeps calling (it was masked while alive) is told so, never given data.
TEST(MaskedRank, ThatKeepsCallingIsToldToRejoin) {
  GroupOptions opt;
  opt.timeout = std::chrono::milliseconds(3000);
  std::barrier sync(3);
  run_on_threads(
      3,
      [&](Group& g) {
        Case c = elastic_case(3, Layout::kLatency, 5);
        Buffer buf(g, config_for(c, Algorithm::kUbep));
        const Problem p = elastic_problem(c, 3);
        if (g.rank() != 2) buf.mask(2);
        sync.arrive_and_wait();
        if (g.rank() == 2) {
          const RankInput& in = p.inputs[2];
          EXPECT_THROW(buf.dispatch(in.args(c.dtype, c.hidden, c.layout)), PeerFailedError);
        } else {
          elastic_call(g, c, p, buf, false);
          EXPECT_EQ(buf.masked_ranks(), std::vector<int>{2});
        }
      },
      opt);
}

TEST(MaskArguments, BadRanksAreNamed) {
  run_on_threads(2, [&](Group& g) {
    Case c = elastic_case(2, Layout::kLatency, 5);
    Buffer buf(g, config_for(c, Algorithm::kUbep));
    try {
      buf.mask(7);
      ADD_FAILURE() << "mask(7) accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 7 out of range"), std::string::npos) << e.what();
    }
    EXPECT_THROW(buf.mask(g.rank()), InvalidArgument);
    EXPECT_TRUE(buf.masked_ranks().empty());
  });
}

}  // namespace
}  // namespace ubep::test
