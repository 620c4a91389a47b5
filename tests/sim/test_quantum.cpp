// The resolve quantum (CallConfig::resolve_ns, Network::end_instant) against the exact model on
// whole calls of the cm384 preset: uniform and hot traffic, both algorithms and operations.
//
// The quantum is an approximation: rates are recomputed at most once per quantum, and the
// changes in between get their new rates back-dated to the mean time of the changes (engine.cpp,
// Network::backdate). The bound asserted here, on every size the unit test can afford: every
// rank's finish time within 1% of the exact call's makespan for quanta up to 50 ns, 2% at
// 100 ns (applying the rates late, as the quantum first did, missed these by 2-5x).
//
// UBEP_SIM_QUANTUM_SIZES="64x128,256x128" (ranks x tokens per rank) measures bigger sizes too
// (minutes: the exact run is the slow one), which is how docs/sim/MODEL.md's table was made.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "sim/call.hpp"

using namespace ubep;
using namespace ubep::sim;

namespace {

std::vector<std::pair<int, int>> sizes() {
  std::vector<std::pair<int, int>> out = {{16, 32}, {32, 32}};
  const char* env = std::getenv("UBEP_SIM_QUANTUM_SIZES");
  if (env == nullptr) return out;
  std::string s = env;
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(at, end - at);
    const size_t x = item.find('x');
    if (x != std::string::npos)
      out.emplace_back(std::stoi(item.substr(0, x)), std::stoi(item.substr(x + 1)));
    at = end + 1;
  }
  return out;
}

struct Error {
  double worst = 0;     // max over ranks of |finish - exact finish| / exact makespan
  double makespan = 0;  // (makespan - exact makespan) / exact makespan, signed
};

Error compare(const CallResult& exact, const CallResult& coarse) {
  Error e;
  for (size_t r = 0; r < exact.finish_ns.size(); ++r)
    e.worst =
        std::max(e.worst, std::abs(coarse.finish_ns[r] - exact.finish_ns[r]) / exact.makespan_ns);
  e.makespan = (coarse.makespan_ns - exact.makespan_ns) / exact.makespan_ns;
  return e;
}

}  // namespace

TEST(MaxMin, ResolveQuantumErrorIsBounded) {
  const std::vector<int> quanta = {10, 50, 100};
  for (const auto& [ranks, tokens] : sizes()) {
    const Preset p = make_preset("cm384", ranks);
    std::vector<double> worst(quanta.size(), 0), span(quanta.size(), 0);
    for (int hot : {0, 8}) {
      const Traffic t = draw_traffic(ranks, 8 * ranks, 8, tokens, hot, 4.0, 11);
      for (Algo a : {Algo::kUbep, Algo::kBsp})
        for (Op op : {Op::kDispatch, Op::kCombine}) {
          CallConfig cfg;
          cfg.algo = a;
          cfg.op = op;
          const CallResult exact = simulate_call(p, cfg, t);
          for (size_t i = 0; i < quanta.size(); ++i) {
            cfg.resolve_ns = quanta[i];
            const CallResult coarse = simulate_call(p, cfg, t);
            EXPECT_LT(coarse.resolves, exact.resolves);
            const Error e = compare(exact, coarse);
            worst[i] = std::max(worst[i], e.worst);
            if (std::abs(e.makespan) > std::abs(span[i])) span[i] = e.makespan;
            EXPECT_LT(e.worst, quanta[i] <= 50 ? 0.01 : 0.02)
                << ranks << "x" << tokens << " hot " << hot << " " << algo_name(a) << " "
                << op_name(op) << " quantum " << quanta[i];
          }
        }
    }
    for (size_t i = 0; i < quanta.size(); ++i)
      std::printf(
          "%d x %d, resolve quantum %d ns: largest finish-time error %.3g of the "
          "makespan, largest makespan error %+.3g\n",
          ranks, tokens, quanta[i], worst[i], span[i]);
  }
}
