// An independent fluid simulator for the engine's tests: the max-min rates are solved from
// scratch (naive progressive filling, no heap, no increments) at every start and finish.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

namespace ubep::sim::reference {

struct RefFlow {
  std::vector<int> path;
  double bytes = 0;
  double start = 0;
};

// Max-min rates of the flows in `active` (indices into flows).
inline std::vector<double> maxmin_rates(const std::vector<double>& capacity,
                                        const std::vector<RefFlow>& flows,
                                        const std::vector<int>& active) {
  std::vector<double> rate(flows.size(), 0.0), residual = capacity;
  std::vector<bool> frozen(flows.size(), false);
  size_t left = active.size();
  while (left > 0) {
    double level = std::numeric_limits<double>::infinity();
    int bottleneck = -1;
    for (size_t l = 0; l < capacity.size(); ++l) {
      int n = 0;
      for (int i : active)
        if (!frozen[static_cast<size_t>(i)] &&
            std::count(flows[static_cast<size_t>(i)].path.begin(),
                       flows[static_cast<size_t>(i)].path.end(), static_cast<int>(l)))
          ++n;
      if (n > 0 && residual[l] / n < level) {
        level = residual[l] / n;
        bottleneck = static_cast<int>(l);
      }
    }
    for (int i : active) {
      const auto& p = flows[static_cast<size_t>(i)].path;
      if (frozen[static_cast<size_t>(i)] || !std::count(p.begin(), p.end(), bottleneck)) continue;
      frozen[static_cast<size_t>(i)] = true;
      rate[static_cast<size_t>(i)] = level;
      for (int l : p) residual[static_cast<size_t>(l)] -= level;
      --left;
    }
  }
  return rate;
}

// Finish time of every flow.
inline std::vector<double> reference_finish(const std::vector<double>& capacity,
                                            const std::vector<RefFlow>& flows) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> remaining(flows.size()), finish(flows.size(), inf);
  for (size_t i = 0; i < flows.size(); ++i) remaining[i] = flows[i].bytes;
  std::vector<bool> started(flows.size(), false);
  double now = 0;
  for (;;) {
    std::vector<int> active;
    double next_start = inf;
    for (size_t i = 0; i < flows.size(); ++i) {
      if (finish[i] < inf) continue;
      if (flows[i].start <= now) {
        active.push_back(static_cast<int>(i));
      } else {
        next_start = std::min(next_start, flows[i].start);
      }
    }
    if (active.empty() && next_start == inf) break;
    const auto rate = maxmin_rates(capacity, flows, active);
    double step = next_start - now;
    for (int i : active)
      step = std::min(step, remaining[static_cast<size_t>(i)] / rate[static_cast<size_t>(i)]);
    for (int i : active) {
      auto& rem = remaining[static_cast<size_t>(i)];
      rem -= rate[static_cast<size_t>(i)] * step;
      if (rem <= 1e-9 * flows[static_cast<size_t>(i)].bytes)
        finish[static_cast<size_t>(i)] = now + step;
    }
    now += step;
  }
  return finish;
}

}  // namespace ubep::sim::reference
