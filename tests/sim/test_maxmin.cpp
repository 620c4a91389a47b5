// The engine's incremental max-min solver against a from-scratch one (maxmin_reference.hpp) on
// random flow sets: every finish time must agree to rounding.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "maxmin_reference.hpp"
#include "sim/engine.hpp"

using namespace ubep::sim;
using ubep::sim::reference::RefFlow;

namespace {

std::vector<double> engine_finish(const std::vector<double>& capacity,
                                  const std::vector<RefFlow>& flows) {
  EventQueue q;
  Network net(q);
  for (double c : capacity) net.add_link(c);
  std::vector<double> finish(flows.size(), -1);
  for (size_t i = 0; i < flows.size(); ++i)
    q.at(flows[i].start, [&, i] {
      net.start_flow(flows[i].path, flows[i].bytes, 0, [&, i] { finish[i] = q.now(); });
    });
  q.run();
  return finish;
}

}  // namespace

TEST(MaxMin, IncrementalSolverMatchesFromScratch) {
  std::mt19937_64 rng(28);
  for (int set = 0; set < 60; ++set) {
    const int links = 2 + static_cast<int>(rng() % 10);
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<double> capacity;
    for (int l = 0; l < links; ++l) capacity.push_back(1.0 + static_cast<double>(rng() % 20));
    std::vector<RefFlow> flows(static_cast<size_t>(n));
    for (auto& f : flows) {
      const int hops = 1 + static_cast<int>(rng() % std::min(4, links));
      while (static_cast<int>(f.path.size()) < hops) {
        const int l = static_cast<int>(rng() % static_cast<uint64_t>(links));
        if (std::find(f.path.begin(), f.path.end(), l) == f.path.end()) f.path.push_back(l);
      }
      f.bytes = 1.0 + static_cast<double>(rng() % 100);
      f.start = static_cast<double>(rng() % 4) * 5.0;  // shared instants: batched resolves
    }
    const auto want = reference::reference_finish(capacity, flows);
    const auto got = engine_finish(capacity, flows);
    for (size_t i = 0; i < flows.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-7 * want[i]) << "set " << set << " flow " << i;
  }
}
