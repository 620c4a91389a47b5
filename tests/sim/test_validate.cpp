// ubep-sim validate: one row per (case, algo, op) with the measured and predicted medians and
// whether `calibrate` timed the shape; the local preset's core sharing; the calibration file;
// the calibrated shapes' rates from ubep-bench runs of them (calibrate --measured).
#include <gtest/gtest.h>

#include "temp_files.hpp"

#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "sim/calibrate_bench.hpp"
#include "sim/call.hpp"
#include "sim/experiments.hpp"
#include "sim/json_read.hpp"
#include "ubep/error.hpp"

using namespace ubep;
using namespace ubep::sim;

namespace {

// The process id in the name: ctest runs this binary's tests as parallel processes (and other
// checkouts run them at the same time), which wrote and read each other's files in /tmp.
std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ubep::sim::test::temp_path(name);
  std::ofstream(path) << text;
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A calibration with round numbers: every rate 10 GB/s per core, 2 cores.
std::string calibration(bool with_cores) {
  std::string s = "{";
  for (const char* shape : {"decode", "prefill"}) {
    const std::string n = shape;
    s += "\"" + n + "_bytes\": " + (n == "decode" ? "1.468e7" : "1.174e8") + ", \"" + n +
         "_copy_GBps\": 10, \"" + n + "_stream_GBps\": 10, \"" + n + "_reduce_GBps\": 10, \"" + n +
         "_staged_reduce_GBps\": 10, ";
  }
  s += "\"handoff_ns\": 100, \"row_bytes\": 14336";
  if (with_cores) s += ", \"cores\": 2";
  return write_file(with_cores ? "cal2.json" : "cal0.json", s + "}");
}

std::string bench_json(const std::string& name, int ranks, int tokens, const char* layout,
                       int bsp_dispatch_us = 1000) {
  return write_file(
      name,
      std::string("{\"config\": {\"workload\": \"decode\", \"group\": \"mpi\", \"ranks\": ") +
          std::to_string(ranks) + ", \"tokens\": " + std::to_string(tokens) +
          ", \"hidden\": 7168, \"topk\": 8, \"experts\": 256, \"dtype\": \"bf16\", "
          "\"layout\": \"" +
          layout +
          "\", \"routing\": \"uniform\", \"iters\": 5, \"warmup\": 1, \"workers\": -1},\n"
          " \"results\": [\n"
          // Rows as ubep-bench writes them: the dtype between op and median_us.
          "  {\"impl\": \"bsp\", \"op\": \"dispatch\", \"dtype\": \"bf16\", \"median_us\": " +
          std::to_string(bsp_dispatch_us) +
          ", \"p99_us\": 1},\n"
          "  {\"impl\": \"ubep\", \"op\": \"combine\", \"dtype\": \"bf16\", \"median_us\": 2000, "
          "\"p99_us\": 1},\n"
          "  {\"impl\": \"bound\", \"op\": \"dispatch\", \"median_us\": 5, \"kernel\": "
          "\"memcpy\"}\n]}\n");
}

TEST(SimValidate, OneRowPerMeasuredCallWithCalibrationFlag) {
  Options o;
  o.calibration = calibration(true);
  o.measured = bench_json("seen.json", 2, 128, "latency") + "," +
               bench_json("unseen.json", 2, 32, "latency");
  o.json = ubep::sim::test::temp_path("validate.json");
  ASSERT_EQ(cmd_validate(o), 0);
  const std::string j = read_file(o.json);
  // Two measured (algo, op) pairs per file: bsp dispatch and ubep combine; bound is not a case.
  size_t rows = 0;
  for (size_t p = j.find("\"measured_us\""); p != std::string::npos;
       p = j.find("\"measured_us\"", p + 1))
    ++rows;
  EXPECT_EQ(rows, 4u);
  EXPECT_NE(j.find("\"case\":\"mpi 2r 128t h7168 top8 latency\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"measured_us\":2000"), std::string::npos) << j;
  EXPECT_NE(j.find("\"calibrated_cases\":2"), std::string::npos) << j;
  EXPECT_NE(j.find("\"unseen_cases\":2"), std::string::npos) << j;
  // The calibrated decode shape is flagged, the 32-token one is not.
  const size_t seen = j.find("128t"), unseen = j.find("32t");
  ASSERT_NE(seen, std::string::npos);
  ASSERT_NE(unseen, std::string::npos);
  EXPECT_NE(j.find("\"used_for_calibration\":true", seen), std::string::npos);
  EXPECT_LT(j.find("\"used_for_calibration\":true", seen), unseen);
  EXPECT_NE(j.find("\"used_for_calibration\":false", unseen), std::string::npos);
}

// Repeats of one shape are one case; its measured value is the least disturbed run's median.
TEST(SimValidate, RepeatsOfAShapeAreOneCaseAtTheLeastDisturbedRun) {
  Options o;
  o.calibration = calibration(true);
  o.measured = bench_json("r1.json", 2, 64, "latency", 1000) + "," +
               bench_json("r2.json", 2, 64, "latency", 9000) + "," +
               bench_json("r3.json", 2, 64, "latency", 2000);
  o.json = ubep::sim::test::temp_path("validate_repeats.json");
  ASSERT_EQ(cmd_validate(o), 0);
  const std::string j = read_file(o.json);
  EXPECT_NE(j.find("\"unseen_cases\":2"), std::string::npos) << j;  // bsp dispatch, ubep combine
  EXPECT_NE(j.find("\"measured_us\":1000,\"runs\":3,\"measured_median_of_runs_us\":2000,"
                   "\"measured_max_us\":9000"),
            std::string::npos)
      << j;
}

TEST(SimValidate, NeedsMeasuredFiles) {
  Options o;
  o.calibration = calibration(true);
  EXPECT_THROW(cmd_validate(o), InvalidArgument);
  o.measured = ubep::sim::test::temp_path("does-not-exist.json");
  EXPECT_THROW(cmd_validate(o), InvalidArgument);
  // A file without result rows (another format) is an error, never "0 of 0 within 25%".
  o.measured = write_file("no-rows.json",
                          "{\"config\": {\"workload\": \"decode\", \"group\": \"mpi\", "
                          "\"ranks\": 2, \"tokens\": 128, \"hidden\": 7168, \"topk\": 8, "
                          "\"experts\": 256, \"dtype\": \"bf16\", \"layout\": \"latency\"},"
                          " \"results\": [{\"impl\": \"ubep\", \"median\": 3}]}");
  EXPECT_THROW(cmd_validate(o), InvalidArgument);
}

// The sync-ablation rows of ubep-bench --sync fused,stop-and-wait are not the call the model
// describes: only the fused row counts, wherever it sits in the file.
TEST(SimValidate, OnlyFusedSyncRowsCount) {
  Options o;
  o.calibration = calibration(true);
  o.measured = write_file(
      "sync.json",
      "{\"config\": {\"workload\": \"decode\", \"group\": \"mpi\", \"ranks\": 2, \"tokens\": 32, "
      "\"hidden\": 7168, \"topk\": 8, \"experts\": 256, \"dtype\": \"bf16\", \"layout\": "
      "\"latency\"},\n \"results\": [\n"
      "  {\"impl\": \"ubep\", \"op\": \"combine\", \"dtype\": \"bf16\", \"median_us\": 2000, "
      "\"sync\": \"fused\", \"stages_us\": {\"wait\": 1}},\n"
      "  {\"impl\": \"ubep\", \"op\": \"combine\", \"dtype\": \"bf16\", \"median_us\": 7777, "
      "\"sync\": \"stop-and-wait\", \"stages_us\": {\"wait\": 1}}\n]}\n");
  o.json = ubep::sim::test::temp_path("validate_sync.json");
  ASSERT_EQ(cmd_validate(o), 0);
  const std::string j = read_file(o.json);
  EXPECT_NE(j.find("\"measured_us\":2000,"), std::string::npos) << j;
  EXPECT_EQ(j.find("7777"), std::string::npos) << j;
}

// Every JSON input goes through the library's strict reader: a malformed file is an error naming
// the file, line and column (a pattern would have found the keys and read on).
TEST(SimValidate, MalformedFilesNameLineAndColumn) {
  auto message = [](const Options& o) {
    try {
      cmd_validate(o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Options o;
  o.calibration = calibration(true);
  o.measured =
      write_file("trailing.json", "{\"config\": {\"group\": \"mpi\",},\n \"results\": []}");
  EXPECT_NE(message(o).find("trailing.json:1:"), std::string::npos) << message(o);
  o.measured = bench_json("ok.json", 2, 32, "latency");
  o.calibration = write_file("bad-cal.json", "{\"handoff_ns\": 100,\n \"handoff_ns\": 7}");
  EXPECT_NE(message(o).find("bad-cal.json:2:"), std::string::npos) << message(o);
  o.calibration = write_file("str-cal.json", "{\"handoff_ns\": \"fast\"}");
  EXPECT_NE(message(o).find("\"handoff_ns\" must be a number"), std::string::npos) << message(o);
}

// More ranks than cores: each rank gets cores / ranks of a core, so every rate scales by it and
// a bandwidth-bound call takes ranks / cores times as long per rank.
TEST(SimValidate, RanksBeyondTheCoresShareThem) {
  const std::string cal = calibration(true);
  CallConfig cc;
  cc.op = Op::kCombine;
  cc.algo = Algo::kUbep;
  const Traffic t2 = draw_traffic(2, 256, 8, 128, 0, 1.0, 1);
  const Traffic t4 = draw_traffic(4, 256, 8, 128, 0, 1.0, 1);  // same rows per rank
  const Preset p2 = make_preset("local", 2, cal), p4 = make_preset("local", 4, cal);
  EXPECT_DOUBLE_EQ(effective_preset(p2, cc, t2).cost.core_share, 1.0);
  const Preset e4 = effective_preset(p4, cc, t4);
  EXPECT_DOUBLE_EQ(e4.cost.core_share, 0.5);
  EXPECT_DOUBLE_EQ(e4.cost.reduce_GBps, 5.0);
  const double us2 = simulate_call(p2, cc, t2).makespan_ns;
  const double us4 = simulate_call(p4, cc, t4).makespan_ns;
  EXPECT_NEAR(us4 / us2, 2.0, 0.3);
  // A calibration written before cores were recorded: every rank has a core.
  const Preset old4 = make_preset("local", 4, calibration(false));
  EXPECT_DOUBLE_EQ(effective_preset(old4, cc, t4).cost.core_share, 1.0);
}

// ---- The calibrated shapes' rates from ubep-bench runs of those shapes (sim/calibrate_bench.hpp),
// and the separation that keeps `validate` a test of predictions: no unseen shape's run may
// reach the model.

struct BenchRun {
  int tokens = 128;
  const char* layout = "latency";
  int ranks = 2;
  double bsp_dispatch = 2000, ubep_dispatch = 1800, bsp_combine = 6000, ubep_combine = 1700;
  double send_rank0 = 3000, send_rank1 = 3500;  // bsp combine's row send per rank
  double bytes = 1.468e7;
};

// A ubep-bench --json file as the bench writes it (the fields the rates need, and others).
std::string bench_file(const std::string& name, const BenchRun& r) {
  auto row = [](const char* impl, const char* op, double us, double bytes,
                const std::string& more) {
    std::ostringstream s;
    s << "{\"impl\": \"" << impl << "\", \"op\": \"" << op << "\", \"dtype\": \"bf16\", "
      << "\"median_us\": " << us << ", \"p99_us\": " << 2 * us << ", \"bytes_per_rank\": " << bytes
      << more << "}";
    return s.str();
  };
  std::ostringstream send;
  send << ", \"stages_us\": {\"row send\": " << (r.send_rank0 + r.send_rank1) / 2
       << ", \"reduce\": 1}, \"ranks\": [{\"rank\": 0, \"stages_us\": {\"row send\": "
       << r.send_rank0
       << ", \"reduce\": 1}}, {\"rank\": 1, \"stages_us\": {\"row send\": " << r.send_rank1
       << ", \"reduce\": 1}}]";
  std::ostringstream s;
  s << "{\"config\": {\"workload\": \"decode\", \"group\": \"mpi\", \"ranks\": " << r.ranks
    << ", \"tokens\": " << r.tokens << ", \"hidden\": 7168, \"topk\": 8, \"experts\": 256, "
    << "\"dtype\": \"bf16\", \"layout\": \"" << r.layout << "\"},\n \"results\": [\n  "
    << row("bsp", "dispatch", r.bsp_dispatch, r.bytes, "") << ",\n  "
    << row("bsp", "combine", r.bsp_combine, r.bytes, send.str()) << ",\n  "
    << row("ubep", "dispatch", r.ubep_dispatch, r.bytes, "") << ",\n  "
    << row("ubep", "combine", r.ubep_combine, r.bytes, "") << "\n]}\n";
  return write_file(name, s.str());
}

double number(const std::string& path, const std::string& key) {
  const JsonValue doc = read_json_file(path, "test");
  const JsonValue* v = number_member(doc, key, path);
  return v ? v->number : -1;
}

TEST(SimCalibrateBench, OnlyTheCalibratedShapesAreNamed) {
  EXPECT_EQ(calibrated_shape_name(2, 128, 7168, 8, 256, "bf16", "latency"), "decode");
  EXPECT_EQ(calibrated_shape_name(2, 4096, 7168, 8, 256, "bf16", "throughput"), "prefill");
  // The small call: 2 MiB of rows per rank, 18 tokens x 8 rows of 14336 B (2,064,384 B).
  EXPECT_EQ(cache_call_tokens(), 18);
  EXPECT_EQ(calibrated_shape_name(2, 18, 7168, 8, 256, "bf16", "latency"), "cache");
  EXPECT_EQ(calibrated_shape_name(2, 18, 7168, 8, 256, "bf16", "throughput"), "");
  EXPECT_EQ(calibrated_shape_name(2, 16, 7168, 8, 256, "bf16", "latency"), "");
  EXPECT_EQ(calibrated_shape_name(2, 128, 7168, 8, 256, "bf16", "throughput"), "");
  EXPECT_EQ(calibrated_shape_name(2, 32, 7168, 8, 256, "bf16", "latency"), "");
  EXPECT_EQ(calibrated_shape_name(4, 128, 7168, 8, 256, "bf16", "latency"), "");
  EXPECT_EQ(calibrated_shape_name(2, 128, 4096, 8, 256, "bf16", "latency"), "");
  EXPECT_EQ(calibrated_shape_name(2, 128, 7168, 4, 256, "bf16", "latency"), "");
  EXPECT_EQ(calibrated_shape_name(2, 128, 7168, 8, 256, "fp32", "latency"), "");
}

// Each time is the least disturbed run's; the row send is the slowest rank's in the run whose
// bsp combine was taken; the rates are bytes over those times (the same arithmetic as
// `calibrate`'s, written out here independently).
TEST(SimCalibrateBench, RatesAreBytesOverTheLeastDisturbedRunsTimes) {
  BenchRun a, b;
  b.bsp_dispatch = 1500;  // a faster bsp placement than either ubep one: the stream rate's
  b.ubep_dispatch = 2500;
  b.bsp_combine = 5000;  // run b's combine is taken, with run b's slowest row send
  b.send_rank0 = 2900;
  b.send_rank1 = 2000;
  a.ubep_combine = 1600;
  const std::vector<BenchShapeTimes> t =
      shape_times_from_bench({bench_file("a.json", a), bench_file("b.json", b)});
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].shape, "decode");
  EXPECT_EQ(t[0].runs, 2);
  EXPECT_DOUBLE_EQ(t[0].times.bsp_dispatch_us, 1500);
  EXPECT_DOUBLE_EQ(t[0].times.ubep_dispatch_us, 1800);
  EXPECT_DOUBLE_EQ(t[0].times.bsp_combine_us, 5000);
  EXPECT_DOUBLE_EQ(t[0].times.bsp_combine_send_us, 2900);
  EXPECT_DOUBLE_EQ(t[0].times.ubep_combine_us, 1600);

  const std::string cal = calibration(true), out = write_file("cal-bench.json", "");
  write_calibration_with_bench_rates(cal, t, out);
  const double B = 1.468e7;  // bytes per ns = GB/s
  EXPECT_NEAR(number(out, "decode_stream_GBps"), B / 1500e3, 1e-4);
  EXPECT_NEAR(number(out, "decode_reduce_GBps"), B / 1600e3, 1e-4);
  EXPECT_NEAR(number(out, "decode_copy_GBps"), B / 2900e3, 1e-4);
  EXPECT_NEAR(number(out, "decode_staged_reduce_GBps"), B / 2100e3, 1e-4);
  EXPECT_DOUBLE_EQ(number(out, "decode_rates_from_bench_runs"), 2);
  // Shapes without runs and the machine figures stay calibrate's.
  EXPECT_DOUBLE_EQ(number(out, "prefill_stream_GBps"), 10);
  EXPECT_DOUBLE_EQ(number(out, "handoff_ns"), 100);
  EXPECT_DOUBLE_EQ(number(out, "cores"), 2);
  EXPECT_NO_THROW(make_preset("local", 2, out));
}

// The separation: a run of any other shape is refused, naming the file, even among calibrated
// ones (it would otherwise set the rates its own prediction is judged with).
TEST(SimCalibrateBench, AnUnseenShapesRunIsRefused) {
  BenchRun unseen;
  unseen.tokens = 32;
  const std::string seen = bench_file("seen.json", BenchRun{}),
                    bad = bench_file("t32.json", unseen);
  try {
    shape_times_from_bench({seen, bad});
    ADD_FAILURE() << "an unseen shape's run was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("t32.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a run of a calibrated shape"), std::string::npos);
  }
  BenchRun four;
  four.ranks = 4;
  EXPECT_THROW(shape_times_from_bench({bench_file("r4.json", four)}), InvalidArgument);
  // A run without bsp's row send stage cannot give the copy rate: an error, not a zero rate.
  const std::string no_send = write_file(
      "nosend.json",
      "{\"config\": {\"group\": \"mpi\", \"ranks\": 2, \"tokens\": 128, \"hidden\": 7168, "
      "\"topk\": 8, \"experts\": 256, \"dtype\": \"bf16\", \"layout\": \"latency\"}, \"results\": "
      "[{\"impl\": \"bsp\", \"op\": \"dispatch\", \"median_us\": 1}, {\"impl\": \"bsp\", \"op\": "
      "\"combine\", \"median_us\": 1}, {\"impl\": \"ubep\", \"op\": \"dispatch\", \"median_us\": "
      "1, "
      "\"bytes_per_rank\": 5}, {\"impl\": \"ubep\", \"op\": \"combine\", \"median_us\": 1}]}");
  EXPECT_THROW(shape_times_from_bench({no_send}), InvalidArgument);
}

// End to end, as sim/validate.sh runs it: the prediction of an unseen shape moves with the
// calibrated shape's runs and not at all with its own measurement.
TEST(SimCalibrateBench, UnseenPredictionsDoNotDependOnUnseenMeasurements) {
  auto predicted = [](double decode_dispatch_us, double unseen_dispatch_us) {
    BenchRun d;
    d.bsp_dispatch = d.ubep_dispatch = decode_dispatch_us;
    const std::string cal = calibration(true), out = write_file("cal-e2e.json", "");
    write_calibration_with_bench_rates(cal, shape_times_from_bench({bench_file("d.json", d)}), out);
    BenchRun u;
    u.tokens = 256;  // 29 MB per rank: a large call, at the calibrated shapes' rates
    u.bsp_dispatch = u.ubep_dispatch = unseen_dispatch_us;
    Options o;
    o.calibration = out;
    o.measured = bench_file("d.json", d) + "," + bench_file("u.json", u);
    o.json = write_file("validate-e2e.json", "");
    EXPECT_EQ(cmd_validate(o), 0);
    const JsonValue doc = read_json_file(o.json, "validate");
    for (const JsonValue& row : doc.find("rows")->array)
      if (row.find("tokens")->number == 256 && row.find("algo")->text == "ubep" &&
          row.find("op")->text == "dispatch")
        return row.find("predicted_us")->number;
    ADD_FAILURE() << "no unseen ubep dispatch row";
    return 0.0;
  };
  const double base = predicted(2000, 500);
  EXPECT_GT(base, 0);
  EXPECT_DOUBLE_EQ(predicted(2000, 900), base);  // the unseen run's own time: no effect
  EXPECT_GT(predicted(4000, 500), 1.2 * base);   // the calibrated run's time: the rates move
}

// --round-calibrations (sim/validate.sh): a row's least disturbed run is predicted with the
// calibration of its own round, i.e. exactly what --calibration with that round's file alone
// predicts; the unseen run's own times pick the round (the least disturbed) and nothing else.
TEST(SimValidate, EachRowIsPredictedWithTheCalibrationOfItsLeastDisturbedRound) {
  auto round_calibration = [](double decode_dispatch_us, const std::string& name) {
    BenchRun d;
    d.bsp_dispatch = d.ubep_dispatch = decode_dispatch_us;
    const std::string out = write_file(name, "");
    write_calibration_with_bench_rates(
        calibration(true), shape_times_from_bench({bench_file(name + "-decode.json", d)}), out);
    return out;
  };
  const std::string c1 = round_calibration(2000, "round1.json"),
                    c2 = round_calibration(4000, "round2.json");
  struct Row {
    double measured = 0, predicted = 0, round = -1;
  };
  auto ubep_dispatch = [](const Options& o) {
    EXPECT_EQ(cmd_validate(o), 0);
    const JsonValue doc = read_json_file(o.json, "validate");
    for (const JsonValue& row : doc.find("rows")->array)
      if (row.find("algo")->text == "ubep" && row.find("op")->text == "dispatch") {
        const JsonValue* round = row.find("round");
        return Row{row.find("measured_us")->number, row.find("predicted_us")->number,
                   round ? round->number : -1};
      }
    ADD_FAILURE() << "no ubep dispatch row";
    return Row{};
  };
  auto unseen = [](double ubep_dispatch_us, const std::string& name) {
    BenchRun u;
    u.tokens = 256;
    u.ubep_dispatch = ubep_dispatch_us;
    return bench_file(name, u);
  };
  // The references: one calibration, one run (the path without rounds).
  Options one;
  one.json = write_file("validate-rounds-ref.json", "");
  one.measured = unseen(700, "ref.json");
  one.calibration = c1;
  const double by_c1 = ubep_dispatch(one).predicted;
  one.calibration = c2;
  const double by_c2 = ubep_dispatch(one).predicted;
  ASSERT_GT(by_c2, 1.2 * by_c1);  // decode's placement twice as slow: the rounds differ

  Options o;
  o.calibration = c1;
  o.round_calibrations = c1 + "," + c2;
  o.json = write_file("validate-rounds.json", "");
  o.measured = unseen(900, "u_r1.json") + "," + unseen(700, "u_r2.json");
  Row r = ubep_dispatch(o);
  EXPECT_DOUBLE_EQ(r.measured, 700);
  EXPECT_DOUBLE_EQ(r.round, 2);
  EXPECT_DOUBLE_EQ(r.predicted, by_c2);
  // Another time in the same round, still its least disturbed: the same prediction.
  o.measured = unseen(900, "u_r1.json") + "," + unseen(650, "u_r2.json");
  EXPECT_DOUBLE_EQ(ubep_dispatch(o).predicted, by_c2);
  // Round 1 least disturbed: round 1's calibration.
  o.measured = unseen(500, "u_r1.json") + "," + unseen(700, "u_r2.json");
  r = ubep_dispatch(o);
  EXPECT_DOUBLE_EQ(r.measured, 500);
  EXPECT_DOUBLE_EQ(r.round, 1);
  EXPECT_DOUBLE_EQ(r.predicted, by_c1);
  // Without round calibrations, --calibration for every run, as before.
  o.round_calibrations.clear();
  o.measured = unseen(900, "u_r1.json") + "," + unseen(700, "u_r2.json");
  EXPECT_DOUBLE_EQ(ubep_dispatch(o).predicted, by_c1);
  // A run of no round, or of a round without a calibration: an error naming the file.
  o.round_calibrations = c1 + "," + c2;
  for (const std::string& bad : {unseen(700, "u.json"), unseen(700, "u_r3.json")}) {
    o.measured = unseen(900, "u_r1.json") + "," + bad;
    try {
      cmd_validate(o);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(SimValidate, TheRoundOfAFileIsTheNumberAfterItsLastUnderscoreR) {
  EXPECT_EQ(round_of_file("docs/sim/v/tokens32_r3.json"), 3);
  EXPECT_EQ(round_of_file("decode_r12.json"), 12);
  EXPECT_EQ(round_of_file("cache_r1_r2.json"), 2);
  EXPECT_EQ(round_of_file("dir_r4/tokens32.json"), 0);
  EXPECT_EQ(round_of_file("tokens32_r.json"), 0);
  EXPECT_EQ(round_of_file("tokens32_r3.json.bak"), 0);
  EXPECT_EQ(round_of_file("tokens32_x3.json"), 0);
  EXPECT_EQ(round_of_file("r3.json"), 0);
  EXPECT_EQ(round_of_file("_r3.json"), 3);
  EXPECT_EQ(round_of_file("a_r9999999.json"), 0);  // not a round number
}

}  // namespace
