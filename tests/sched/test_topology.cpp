// Topology model: presets, HxR, JSON files (good and bad), discovery, and the cost and
// link-sharing functions on hand-computed cases.
#include <gtest/gtest.h>

#include "expect_invalid.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ubep/error.hpp"
#include "ubep/topology.hpp"

namespace ubep::sched {
namespace {

using ubep::test::expect_invalid;

std::string write_temp(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "ubep_sched_tests";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path) << text;
  return path.string();
}

TEST(Topology, Cm384PlacesSixteenDiesPerOneHopDomain) {
  const Topology t = cm384(64);
  ASSERT_EQ(t.num_levels(), 3);
  EXPECT_EQ(t.level_between(5, 5), 0);
  EXPECT_EQ(t.level_between(0, 15), 1);
  EXPECT_EQ(t.level_between(16, 31), 1);
  EXPECT_EQ(t.level_between(15, 16), 2);
  EXPECT_EQ(t.level_between(0, 63), 2);
  // The paper's figures.
  EXPECT_EQ(t.latency_ns(0, 0), 218);
  EXPECT_EQ(t.latency_ns(0, 1), 929);
  EXPECT_EQ(t.latency_ns(0, 40), 2500);
  EXPECT_EQ(t.bandwidth_gbps(0, 40), 392);
  for (int a = 0; a < 64; ++a)
    for (int b = 0; b < 64; ++b) EXPECT_EQ(t.level_between(a, b), t.level_between(b, a));
}

TEST(Topology, PresetsRejectRankCountsTheyCannotHold) {
  expect_invalid([] { cm384(769); }, {"cm384", "769"});
  expect_invalid([] { cm384(0); }, {"cm384", "0"});
  expect_invalid([] { nvl72(73); }, {"nvl72", "73"});
  expect_invalid([] { h800(12); }, {"h800", "12"});
  EXPECT_EQ(nvl72(72).level_between(0, 71), 1);
  const Topology h = h800(16);
  EXPECT_EQ(h.level_between(0, 7), 1);
  EXPECT_EQ(h.level_between(7, 8), 2);
  EXPECT_EQ(h.level(2).name, "ib");
}

TEST(Topology, HostsByRanksAndParse) {
  const Topology t = parse_topology("2x3", 6);
  EXPECT_EQ(t.ranks(), 6);
  EXPECT_EQ(t.level_between(0, 2), 1);
  EXPECT_EQ(t.level_between(2, 3), 2);
  EXPECT_EQ(parse_topology("cm384", 32).name(), "cm384");
  EXPECT_EQ(parse_topology("nvl72", 8).name(), "nvl72");
  EXPECT_EQ(parse_topology("h800", 8).name(), "h800");
  expect_invalid([] { parse_topology("2x2", 8); }, {"2x2", "4", "8"});
  expect_invalid([] { parse_topology("0x4", 0); }, {"ranks must be >= 1"});
  expect_invalid([] { parse_topology("0x4", 4); }, {"0x4"});
  expect_invalid([] { parse_topology("superpod", 4); }, {"superpod", "cm384"});
  expect_invalid([] { parse_topology("/no/such/file.json", 4); }, {"/no/such/file.json"});
}

TEST(Topology, ConstructorNamesBadValues) {
  expect_invalid([] { Topology("t", {{"self", 1, 1}}, 2); }, {"at least 2 levels", "1"});
  expect_invalid([] { Topology("t", {{"self", 1, 1}, {"net", 1, -3}}, 2); }, {"net", "-3"});
  expect_invalid([] { Topology("t", {{"self", -2, 1}, {"net", 1, 1}}, 2); }, {"self", "-2"});
  expect_invalid(
      [] {
        Topology("t", {{"a", 1, 1}, {"b", 1, 1}, {"c", 1, 1}}, 4, {{0, 0, 1}});
      },
      {"'b'", "3", "4"});
  // Ranks 0 and 1 share a 'b' domain but not a 'c' domain: not nested.
  expect_invalid(
      [] {
        Topology("t", {{"a", 1, 1}, {"b", 1, 1}, {"c", 1, 1}, {"d", 1, 1}}, 4,
                 {{0, 0, 1, 1}, {0, 1, 1, 1}});
      },
      {"nest", "'b'", "'c'"});
  const Topology t("t", {{"a", 1, 1}, {"b", 1, 1}}, 3);
  expect_invalid([&] { t.level_between(0, 3); }, {"rank 3"});
}

TEST(CostModel, HandComputedTransfers) {
  const Topology t = cm384(32);
  // 392000 bytes at 392 GB/s = 1000 ns, plus the two-hop latency.
  EXPECT_DOUBLE_EQ(t.transfer_ns(0, 16, 392000), 2500 + 1000);
  EXPECT_DOUBLE_EQ(t.transfer_ns(0, 1, 392000), 929 + 1000);
  EXPECT_DOUBLE_EQ(t.transfer_ns(3, 3, 1600), 218 + 1);
  EXPECT_DOUBLE_EQ(t.transfer_ns(0, 16, 0), 2500);
  expect_invalid([&] { t.transfer_ns(0, 1, -5); }, {"-5"});
}

TEST(CostModel, ConcurrentFlowsShareTheLink) {
  std::vector<double> out(2);
  // Equal flows split 10 GB/s: 1000 B each at 5 GB/s = 200 ns, then 50 ns of flight.
  const Flow equal[] = {{50, 1000}, {50, 1000}};
  concurrent_finish_ns(equal, 10, 0, out);
  EXPECT_NEAR(out[0], 250, 1e-9);
  EXPECT_NEAR(out[1], 250, 1e-9);
  // 1000 B and 3000 B: both at 5 GB/s until t = 200 (the small one is out), the big one has
  // 2000 B left and the whole 10 GB/s: out at 400.
  const Flow unequal[] = {{50, 1000}, {0, 3000}};
  concurrent_finish_ns(unequal, 10, 0, out);
  EXPECT_NEAR(out[0], 250, 1e-9);
  EXPECT_NEAR(out[1], 400, 1e-9);
  // A 2 GB/s cap per flow: the link is not the limit any more.
  concurrent_finish_ns(unequal, 10, 2, out);
  EXPECT_NEAR(out[0], 550, 1e-9);
  EXPECT_NEAR(out[1], 1500, 1e-9);
  // A flow without bytes is its latency.
  const Flow empty[] = {{70, 0}};
  std::vector<double> one(1);
  concurrent_finish_ns(empty, 10, 0, one);
  EXPECT_DOUBLE_EQ(one[0], 70);
  expect_invalid([&] { concurrent_finish_ns(equal, 0, 0, out); }, {"0"});
  expect_invalid([&] { concurrent_finish_ns(equal, 10, 0, one); }, {"1", "2"});
}

TEST(Json, ReadsGroupSizeAndDomainOf) {
  const std::string path = write_temp("good.json", R"({
    "name": "two-racks",
    "levels": [
      {"name": "self", "latency_ns": 100, "bandwidth_gbps": 20},
      {"name": "board", "latency_ns": 400, "bandwidth_gbps": 200, "group_size": 2},
      {"name": "rack", "latency_ns": 900, "bandwidth_gbps": 100, "domain_of": [0,0,0,0,1,1,1,1]},
      {"name": "net", "latency_ns": 5e3, "bandwidth_gbps": 25.5}
    ]
  })");
  const Topology t = from_json(path);
  EXPECT_EQ(t.name(), "two-racks");
  EXPECT_EQ(t.ranks(), 8);
  EXPECT_EQ(t.level_between(0, 1), 1);
  EXPECT_EQ(t.level_between(1, 2), 2);
  EXPECT_EQ(t.level_between(3, 4), 3);
  EXPECT_EQ(t.level(3).latency_ns, 5000);
  EXPECT_EQ(t.level(3).bandwidth_gbps, 25.5);
  EXPECT_EQ(parse_topology(path, 8).ranks(), 8);
  expect_invalid([&] { parse_topology(path, 4); }, {"8 ranks", "4"});

  // group_size only: the rank count comes from the caller; the name from the file name.
  const std::string p2 = write_temp("pairs.json", R"({"levels": [
      {"name": "self", "latency_ns": 1, "bandwidth_gbps": 1},
      {"name": "pair", "latency_ns": 2, "bandwidth_gbps": 1, "group_size": 2},
      {"name": "all", "latency_ns": 3, "bandwidth_gbps": 1}]})");
  const Topology t2 = from_json(p2, 6);
  EXPECT_EQ(t2.name(), "pairs");
  EXPECT_EQ(t2.level_between(4, 5), 1);
  EXPECT_EQ(t2.level_between(3, 4), 2);
  expect_invalid([&] { from_json(p2); }, {"rank count"});
}

TEST(Json, BadFilesGiveClearErrors) {
  const std::string lv = R"({"name": "self", "latency_ns": 1, "bandwidth_gbps": 1},
      {"name": "all", "latency_ns": 3, "bandwidth_gbps": 1})";
  struct Case {
    const char* name;
    std::string text;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"syntax", "{\"levels\": [" + lv + "],}", {"syntax.json:", ":", "quoted key"}},
      {"trailing", "{\"levels\": [" + lv + "]} x", {"after the JSON value"}},
      {"unknown_key", "{\"levels\": [" + lv + "], \"lvls\": 1}", {"unknown key", "lvls"}},
      {"duplicate", "{\"levels\": [" + lv + "], \"levels\": []}", {"duplicate key", "levels"}},
      {"missing_levels", "{\"ranks\": 2}", {"missing key", "levels"}},
      {"levels_type", "{\"levels\": 3}", {"levels", "an array", "a number"}},
      {"one_level",
       R"({"levels": [{"name": "s", "latency_ns": 1, "bandwidth_gbps": 1}]})",
       {"at least 2 levels", "1"}},
      {"bad_bw",
       R"({"levels": [{"name": "s", "latency_ns": 1, "bandwidth_gbps": 1},
        {"name": "all", "latency_ns": 3, "bandwidth_gbps": -4.5}]})",
       {"bandwidth_gbps", "-4.5", ":2:"}},
      {"bad_lat_type",
       R"({"levels": [{"name": "s", "latency_ns": "fast", "bandwidth_gbps": 1},
        {"name": "all", "latency_ns": 3, "bandwidth_gbps": 1}]})",
       {"latency_ns", "a number", "fast"}},
      {"ranks_float", "{\"ranks\": 2.5, \"levels\": [" + lv + "]}", {"ranks", "2.5"}},
      {"edge_group",
       R"({"levels": [{"name": "s", "latency_ns": 1, "bandwidth_gbps": 1, "group_size": 2},
        {"name": "all", "latency_ns": 3, "bandwidth_gbps": 1}]})",
       {"unknown key", "group_size", "same-rank"}},
      {"both_placements",
       R"({"ranks": 4, "levels": [{"name": "s", "latency_ns": 1, "bandwidth_gbps": 1},
        {"name": "m", "latency_ns": 1, "bandwidth_gbps": 1, "group_size": 2, "domain_of": [0,0,1,1]},
        {"name": "all", "latency_ns": 3, "bandwidth_gbps": 1}]})",
       {"exactly one", "'m'"}},
      {"domain_len",
       R"({"ranks": 4, "levels": [{"name": "s", "latency_ns": 1, "bandwidth_gbps": 1},
        {"name": "m", "latency_ns": 1, "bandwidth_gbps": 1, "domain_of": [0,0,1]},
        {"name": "all", "latency_ns": 3, "bandwidth_gbps": 1}]})",
       {"places 3 ranks", "4"}},
      {"domain_neg",
       R"({"levels": [{"name": "s", "latency_ns": 1, "bandwidth_gbps": 1},
        {"name": "m", "latency_ns": 1, "bandwidth_gbps": 1, "domain_of": [0,-1]},
        {"name": "all", "latency_ns": 3, "bandwidth_gbps": 1}]})",
       {"domain_of[1]", "-1"}},
      {"unterminated", R"({"levels": [{"name": "s)", {"unterminated string"}},
      {"empty", "", {"end of input"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = write_temp(std::string(c.name) + ".json", c.text);
    try {
      from_json(path, 0);
      ADD_FAILURE() << "no InvalidArgument thrown";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const std::string& p : c.parts)
        EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
    }
  }
  expect_invalid([] { from_json("/no/such/topology.json"); },
                 {"cannot open", "/no/such/topology.json"});
}

TEST(Discover, HostsFromTheCallerNumaFromTheMachine) {
  const std::vector<int> host_of = {0, 0, 1, 1};
  const Topology t = discover(host_of);
  ASSERT_EQ(t.num_levels(), 4);
  EXPECT_EQ(t.level_between(0, 0), 0);
  EXPECT_GE(t.level_between(0, 1), 1);
  EXPECT_LE(t.level_between(0, 1), 2);
  EXPECT_EQ(t.level_between(1, 2), 3);
  EXPECT_GE(discover_numa_nodes(), 1);
  EXPECT_GE(discover_sockets(), 1);
  DiscoverOptions o;
  o.numa_of = {0, 0, 0, 0};
  EXPECT_EQ(discover(host_of, o).level_between(0, 1), 1);
  o.numa_of = {0, 0, 0, 999};
  expect_invalid([&] { discover(host_of, o); }, {"999", "rank 3"});
  expect_invalid([] { discover(std::vector<int>{0, 2, 2}); }, {"dense", "host 1"});
  expect_invalid([] { discover(std::vector<int>{0, -1}); }, {"-1", "rank 1"});
  expect_invalid([] { discover(std::vector<int>{}); }, {"at least one rank"});
}

}  // namespace
}  // namespace ubep::sched
