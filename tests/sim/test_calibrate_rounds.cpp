// sim/validate.sh's calibration from calibrate's files of its rounds (sim/calibrate_rounds.hpp):
// each figure from its least disturbed round, the reuse capacity of the round whose re-read
// curve ran fastest in cache, and each round's own small-call figures.
#include <gtest/gtest.h>

#include "temp_files.hpp"

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "sim/calibrate_rounds.hpp"
#include "sim/experiments.hpp"
#include "ubep/error.hpp"

using namespace ubep;
using namespace ubep::sim;

namespace {

constexpr double M = 1 << 20;

std::map<std::string, double> as_map(const CalibrationFields& f) { return {f.begin(), f.end()}; }

// Three rounds as session k's run 3 measured them (the capacities and in-cache rates of its
// calibrate log), with other figures in round numbers.
std::vector<CalibrationFields> three_rounds(bool with_curves) {
  std::vector<CalibrationFields> r = {{{"decode_stream_GBps", 10},
                                       {"decode_ubep_dispatch_us", 900},
                                       {"cache_reduce_GBps", 39},
                                       {"handoff_ns", 300},
                                       {"oversubscribed_ratio_3", 2.1},
                                       {"l2_bytes", 1 * M},
                                       {"reuse_capacity_bytes", 4 * M}},
                                      {{"decode_stream_GBps", 12},
                                       {"decode_ubep_dispatch_us", 800},
                                       {"cache_reduce_GBps", 24},
                                       {"handoff_ns", 200},
                                       {"oversubscribed_ratio_3", 2.0},
                                       {"l2_bytes", 2 * M},
                                       {"reuse_capacity_bytes", 3 * M}},
                                      {{"decode_stream_GBps", 11},
                                       {"decode_ubep_dispatch_us", 850},
                                       {"cache_reduce_GBps", 22},
                                       {"handoff_ns", 250},
                                       {"oversubscribed_ratio_3", 1.9},
                                       {"l2_bytes", 3 * M},
                                       {"reuse_capacity_bytes", 2 * M}}};
  const double in_cache[] = {33.9, 55.5, 31.7};
  if (with_curves)
    for (size_t i = 0; i < r.size(); ++i) r[i].emplace_back("reuse_in_cache_GBps", in_cache[i]);
  return r;
}

TEST(SimCalibrateRounds, EachFigureFromItsLeastDisturbedRound) {
  const auto best = as_map(best_of_rounds(three_rounds(true), {"r1", "r2", "r3"}));
  EXPECT_DOUBLE_EQ(best.at("decode_stream_GBps"), 12);        // highest rate
  EXPECT_DOUBLE_EQ(best.at("cache_reduce_GBps"), 39);         // highest rate
  EXPECT_DOUBLE_EQ(best.at("decode_ubep_dispatch_us"), 800);  // shortest time
  EXPECT_DOUBLE_EQ(best.at("handoff_ns"), 200);
  EXPECT_DOUBLE_EQ(best.at("oversubscribed_ratio_3"), 1.9);
  EXPECT_DOUBLE_EQ(best.at("l2_bytes"), 1 * M);  // a size: the first round's
  EXPECT_DOUBLE_EQ(best.at("reuse_in_cache_GBps"), 55.5);
  // The capacity of the round whose curve ran fastest in cache (round 2: 3 MiB), not the
  // largest (round 1's 4 MiB, from a flat curve).
  EXPECT_DOUBLE_EQ(best.at("reuse_capacity_bytes"), 3 * M);
  // Files without the in-cache rate (before session l): the largest capacity, as before.
  EXPECT_DOUBLE_EQ(as_map(best_of_rounds(three_rounds(false), {})).at("reuse_capacity_bytes"),
                   4 * M);
}

TEST(SimCalibrateRounds, ARoundKeepsItsOwnSmallCallFigures) {
  const auto rounds = three_rounds(true);
  const CalibrationFields best = best_of_rounds(rounds, {});
  const auto r3 = as_map(round_calibration(best, rounds[2]));
  EXPECT_DOUBLE_EQ(r3.at("cache_reduce_GBps"), 22);        // round 3's own 2 MiB call
  EXPECT_DOUBLE_EQ(r3.at("decode_stream_GBps"), 12);       // the rest: the best of the rounds
  EXPECT_DOUBLE_EQ(r3.at("reuse_capacity_bytes"), 3 * M);  // the capacity too
  EXPECT_EQ(round_calibration(best, rounds[2]).size(), best.size());
}

TEST(SimCalibrateRounds, RoundsMustHaveTheSameMembers) {
  auto rounds = three_rounds(true);
  rounds[1].erase(rounds[1].begin());  // round 2 without decode_stream_GBps
  try {
    best_of_rounds(rounds, {"a.json", "b.json", "c.json"});
    ADD_FAILURE() << "a round without a member was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("b.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("decode_stream_GBps"), std::string::npos) << e.what();
  }
  EXPECT_THROW(best_of_rounds({}, {}), InvalidArgument);
}

// The command, as sim/validate.sh runs it: files in, the best and one file per round out.
TEST(SimCalibrateRounds, CalibrateRoundsWritesTheBestAndEachRound) {
  Options o;
  const auto rounds = three_rounds(true);
  for (size_t i = 0; i < rounds.size(); ++i) {
    const std::string f = test::temp_path("cal_r" + std::to_string(i + 1) + ".json");
    write_calibration_fields(rounds[i], f);
    o.rounds += (i ? "," : "") + f;
  }
  o.out = test::temp_path("calibration.json");
  const std::string r2 = test::temp_path("calibration_round2.json");  // removed at the end too
  for (int i : {1, 3}) test::temp_path("calibration_round" + std::to_string(i) + ".json");
  ASSERT_EQ(cmd_calibrate(o), 0);
  EXPECT_DOUBLE_EQ(as_map(read_calibration_fields(o.out)).at("cache_reduce_GBps"), 39);
  EXPECT_DOUBLE_EQ(as_map(read_calibration_fields(r2)).at("cache_reduce_GBps"), 24);
  // (the JSON writer keeps 6 significant digits)
  EXPECT_NEAR(as_map(read_calibration_fields(r2)).at("reuse_capacity_bytes"), 3 * M, 1e-5 * M);
  o.rounds += "," + test::temp_path("missing.json");
  EXPECT_THROW(cmd_calibrate(o), InvalidArgument);
}

}  // namespace
