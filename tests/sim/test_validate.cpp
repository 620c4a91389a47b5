// ubep-sim validate: one row per (case, algo, op) with the measured and predicted medians and
// whether `calibrate` timed the shape; the local preset's core sharing; the calibration file.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "sim/call.hpp"
#include "sim/experiments.hpp"
#include "ubep/error.hpp"

using namespace ubep;
using namespace ubep::sim;

namespace {

// The process id in the name: ctest runs this binary's tests as parallel processes (and other
// checkouts run them at the same time), which wrote and read each other's files in /tmp.
std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + std::to_string(getpid()) + "-" + name;
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
  o.json = testing::TempDir() + "validate.json";
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
  o.json = testing::TempDir() + "validate_repeats.json";
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
  o.measured = testing::TempDir() + "does-not-exist.json";
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
  o.json = testing::TempDir() + "validate_sync.json";
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

}  // namespace
