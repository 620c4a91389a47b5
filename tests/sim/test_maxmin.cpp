// The engine's incremental max-min solver against a from-scratch one (maxmin_reference.hpp) on
// random flow sets: every finish time must agree to rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "maxmin_reference.hpp"
#include "sim/engine.hpp"

using namespace ubep;
using namespace ubep::sim;
using ubep::sim::reference::RefFlow;

namespace {

// homes > 0: flow i asks for id i % homes (engine.hpp: an id is a label, so the finish times
// must not move by a bit; busy homes fall back to the free ids).
std::vector<double> engine_finish(const std::vector<double>& capacity,
                                  const std::vector<RefFlow>& flows, int homes = 0,
                                  uint64_t* trace = nullptr) {
  EventQueue q;
  Network net(q);
  for (double c : capacity) net.add_link(c);
  if (homes > 0) net.reserve_homes(homes);
  std::vector<double> finish(flows.size(), -1);
  for (size_t i = 0; i < flows.size(); ++i)
    q.at(flows[i].start, [&, i] {
      net.start_flow(
          flows[i].path, flows[i].bytes, 0, [&, i] { finish[i] = q.now(); },
          homes > 0 ? static_cast<int>(i) % homes : -1);
    });
  q.run();
  if (trace) *trace = net.trace();
  return finish;
}

// Random link capacities 1..20 and a random path of 1-4 distinct links: the draws both
// randomized tests share, in the order they make them.
std::vector<double> random_capacities(std::mt19937_64& rng, int links) {
  std::vector<double> capacity;
  for (int l = 0; l < links; ++l) capacity.push_back(1.0 + static_cast<double>(rng() % 20));
  return capacity;
}
std::vector<int> random_path(std::mt19937_64& rng, int links) {
  std::vector<int> path;
  const int hops = 1 + static_cast<int>(rng() % std::min(4, links));
  while (static_cast<int>(path.size()) < hops) {
    const int l = static_cast<int>(rng() % static_cast<uint64_t>(links));
    if (std::find(path.begin(), path.end(), l) == path.end()) path.push_back(l);
  }
  return path;
}

}  // namespace

TEST(MaxMin, IncrementalSolverMatchesFromScratch) {
  std::mt19937_64 rng(28);
  for (int set = 0; set < 60; ++set) {
    const int links = 2 + static_cast<int>(rng() % 10);
    const int n = 1 + static_cast<int>(rng() % 40);
    const std::vector<double> capacity = random_capacities(rng, links);
    std::vector<RefFlow> flows(static_cast<size_t>(n));
    for (auto& f : flows) {
      f.path = random_path(rng, links);
      f.bytes = 1.0 + static_cast<double>(rng() % 100);
      f.start = static_cast<double>(rng() % 4) * 5.0;  // shared instants: batched resolves
    }
    const auto want = reference::reference_finish(capacity, flows);
    const auto got = engine_finish(capacity, flows);
    for (size_t i = 0; i < flows.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-7 * want[i]) << "set " << set << " flow " << i;
  }
}

// Worker-shaped sets: every flow crosses an engine link (usually its alone, sometimes shared by
// two flows, so links turn single-flow and back during the run: the solver then treats them as
// caps on one flow's rate, or walks them) and one or two ports; the engines sometimes bind. Every
// finish time must match the from-scratch solver, and every link's bytes the flows crossing it.
TEST(MaxMin, SingleFlowLinksMatchFromScratch) {
  std::mt19937_64 rng(2828);
  for (int set = 0; set < 60; ++set) {
    const int ports = 2 + static_cast<int>(rng() % 6), engines = 4 + static_cast<int>(rng() % 12);
    std::vector<double> capacity;
    for (int l = 0; l < ports; ++l) capacity.push_back(10.0 + static_cast<double>(rng() % 30));
    for (int e = 0; e < engines; ++e) capacity.push_back(1.0 + static_cast<double>(rng() % 8));
    const int n = 2 + static_cast<int>(rng() % 30);
    std::vector<RefFlow> flows(static_cast<size_t>(n));
    std::vector<double> want_bytes(capacity.size(), 0.0);
    for (auto& f : flows) {
      f.path.push_back(ports + static_cast<int>(rng() % static_cast<uint64_t>(engines)));
      const int hops = static_cast<int>(rng() % 3);  // 0: the engine alone
      while (static_cast<int>(f.path.size()) < 1 + hops) {
        const int l = static_cast<int>(rng() % static_cast<uint64_t>(ports));
        if (std::find(f.path.begin(), f.path.end(), l) == f.path.end()) f.path.push_back(l);
      }
      f.bytes = 1.0 + static_cast<double>(rng() % 200);
      f.start = static_cast<double>(rng() % 12) * 3.0;
      for (int l : f.path) want_bytes[static_cast<size_t>(l)] += f.bytes;
    }
    const auto want = reference::reference_finish(capacity, flows);
    EventQueue q;
    Network net(q);
    for (double c : capacity) net.add_link(c);
    std::vector<double> got(flows.size(), -1);
    for (size_t i = 0; i < flows.size(); ++i)
      q.at(flows[i].start, [&, i] {
        net.start_flow(flows[i].path, flows[i].bytes, 0, [&, i] { got[i] = q.now(); });
      });
    q.run();
    for (size_t i = 0; i < flows.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-7 * want[i]) << "set " << set << " flow " << i;
    for (int l = 0; l < net.link_count(); ++l)
      ASSERT_NEAR(net.link_bytes(l), want_bytes[static_cast<size_t>(l)],
                  1e-6 * (1 + want_bytes[static_cast<size_t>(l)]))
          << "set " << set << " link " << l;
  }
}

// Churn: flows start at many instants on a few shared links, so rates change at nearly every
// event, flows speed up again and again (each time their one pending finish check moves earlier
// in the event queue's heap, in place) and finished flows' ids are reused while other flows'
// checks are pending. Every finish time must still match the from-scratch solver.
TEST(MaxMin, RescheduledChecksUnderChurnMatchFromScratch) {
  std::mt19937_64 rng(282828);
  for (int set = 0; set < 20; ++set) {
    const int links = 3 + static_cast<int>(rng() % 4);
    std::vector<double> capacity;
    for (int l = 0; l < links; ++l) capacity.push_back(2.0 + static_cast<double>(rng() % 10));
    std::vector<RefFlow> flows(150 + rng() % 100);
    for (auto& f : flows) {
      const int hops = 1 + static_cast<int>(rng() % 2);
      while (static_cast<int>(f.path.size()) < hops) {
        const int l = static_cast<int>(rng() % static_cast<uint64_t>(links));
        if (std::find(f.path.begin(), f.path.end(), l) == f.path.end()) f.path.push_back(l);
      }
      f.bytes = 1.0 + static_cast<double>(rng() % 50);
      f.start = static_cast<double>(rng() % 400) * 0.25;
    }
    const auto want = reference::reference_finish(capacity, flows);
    const auto got = engine_finish(capacity, flows);
    for (size_t i = 0; i < flows.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-7 * want[i]) << "set " << set << " flow " << i;
  }
}

// Flow ids are labels: giving flows home ids (some shared, so that busy homes fall back to free
// ids) changes no finish time, to the bit.
TEST(MaxMin, HomeIdsChangeNothing) {
  std::mt19937_64 rng(29);
  int differing = 0;
  for (int set = 0; set < 40; ++set) {
    const int links = 2 + static_cast<int>(rng() % 10);
    const int n = 1 + static_cast<int>(rng() % 60);
    const std::vector<double> capacity = random_capacities(rng, links);
    std::vector<RefFlow> flows(static_cast<size_t>(n));
    for (auto& f : flows) {
      f.path = random_path(rng, links);
      f.bytes = 1.0 + static_cast<double>(rng() % 100) / 7.0;
      f.start = static_cast<double>(rng() % 8) * 1.5;
    }
    uint64_t trace_free = 0, trace_homes = 0;
    const auto free_ids = engine_finish(capacity, flows, 0, &trace_free);
    const int homes = 1 + static_cast<int>(rng() % static_cast<uint64_t>(n));
    const auto home_ids = engine_finish(capacity, flows, homes, &trace_homes);
    differing += homes < n ? 1 : 0;
    ASSERT_EQ(trace_free, trace_homes) << "set " << set;
    for (size_t i = 0; i < flows.size(); ++i)
      ASSERT_EQ(free_ids[i], home_ids[i]) << "set " << set << " flow " << i;
  }
  EXPECT_GT(differing, 20);  // most sets have more flows than homes: the fallback is exercised
}
