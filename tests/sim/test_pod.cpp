// Pods beyond cm384: the ubmesh8k preset and a user's pod file (sim/pod.cpp), including the
// errors a bad file gets (each names the field and the value).
#include <gtest/gtest.h>

#include "temp_files.hpp"

#include <cstdio>
#include <fstream>
#include <string>

#include "sim/call.hpp"
#include "ubep/error.hpp"

using namespace ubep;
using namespace ubep::sim;

namespace {

std::string write_pod(const std::string& name, const std::string& text) {
  const std::string path = ubep::sim::test::temp_path(name);
  std::ofstream(path) << text;
  return path;
}

// cm384 as a pod file: dies, 16-die nodes on one UB switch tier, two tiers beyond; one UB port.
const char* kCm384Pod = R"({"name": "cm384-file", "ranks": 768, "levels": [
  {"name": "die", "latency_ns": 218, "bandwidth_gbps": 1600},
  {"name": "ub1", "latency_ns": 929, "bandwidth_gbps": 392, "group_size": 16},
  {"name": "ub2", "latency_ns": 2500, "bandwidth_gbps": 392}],
  "sim": {"ports": [0, 1, 1], "costs": "cm384"}})";

void expect_error(const std::string& text, std::initializer_list<const char*> words,
                  int ranks = 64) {
  const std::string path = write_pod("bad.json", text);
  try {
    make_preset(path, ranks);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const InvalidArgument& e) {
    for (const char* w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "'" << w << "' not in: " << e.what();
  }
}

std::string with(std::string text, const std::string& from, const std::string& to) {
  text.replace(text.find(from), from.size(), to);
  return text;
}

}  // namespace

TEST(SimPod, FileDescribingCm384SimulatesAsThePreset) {
  const std::string path = write_pod("cm384.json", kCm384Pod);
  const Preset file = make_preset(path, 32), preset = make_preset("cm384", 32);
  ASSERT_EQ(file.topology.ranks(), 32);
  for (int a = 0; a < 32; ++a)
    for (int b = 0; b < 32; ++b)
      ASSERT_EQ(file.topology.level_between(a, b), preset.topology.level_between(a, b));
  const Traffic t = draw_traffic(32, 64, 8, 16, 0, 4.0, 3);
  for (Algo algo : {Algo::kUbep, Algo::kBsp}) {
    CallConfig cfg;
    cfg.algo = algo;
    EXPECT_DOUBLE_EQ(simulate_call(file, cfg, t).makespan_ns,
                     simulate_call(preset, cfg, t).makespan_ns);
  }
}

TEST(SimPod, BadFilesNameTheFieldAndValue) {
  const std::string good = kCm384Pod;
  expect_error(
      with(good, R"("bandwidth_gbps": 392, "group_size")", R"("bandwidth_gbps": 0, "group_size")"),
      {"levels[1].bandwidth_gbps", "0"});
  expect_error(with(good, R"("group_size": 16)", R"("group_size": 5)"),
               {"levels[1].group_size", "5", "768"});
  expect_error(with(good, R"({"name": "ub1", "latency_ns": 929,)", R"({"name": "ub1",)"),
               {"levels[1]", "latency_ns"});
  expect_error(with(good, R"("levels": [)", R"("levelz": [)"), {"levelz"});
  expect_error(kCm384Pod, {"--ranks 1024", "\"ranks\": 768"}, 1024);
  expect_error(with(good, R"("ports": [0, 1, 1])", R"("ports": [0, 1])"),
               {"sim.ports", "3 levels"});
  expect_error(with(good, R"("ports": [0, 1, 1])", R"("ports": [0, 1, -2])"),
               {"sim.ports[2]", "-2"});
  expect_error(with(good, R"("costs": "cm384")", R"("costs": "tpu")"), {"sim.costs", "tpu"});
  expect_error(with(good, R"("costs": "cm384")", R"("cost": "cm384")"), {"sim.cost"});
  expect_error("{\"levels\": [", {"bad.json"});
}

TEST(SimPod, Ubmesh8kLabelsEveryLevelAndCoversTheWholePod) {
  const Preset p = make_preset("ubmesh8k", 8192);
  EXPECT_EQ(p.topology.ranks(), 8192);
  EXPECT_EQ(p.topology.level_between(0, 63), 1);   // one cabinet
  EXPECT_EQ(p.topology.level_between(63, 64), 2);  // next cabinet
  for (const char* key : {"pod", "level npu", "level cabinet", "level pod", "worker_GBps"}) {
    bool found = false;
    for (const auto& [k, v] : p.cost.sources)
      found = found || (k == key && (v.find("[SPEC") != std::string::npos ||
                                     v.find("[ASSUME") != std::string::npos));
    EXPECT_TRUE(found) << key << " has no [SPEC]/[ASSUME] source";
  }
  EXPECT_THROW(make_preset("ubmesh8k", 8193), InvalidArgument);
}
