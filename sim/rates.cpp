// Two-stream memory costs of the local preset (rates.hpp).
#include "sim/rates.hpp"

#include <algorithm>
#include <cmath>

namespace ubep::sim {

TwoStreamCost solve_two_stream(double f1, double s1, double t1_ns, double f2, double s2,
                               double t2_ns) {
  // Cramer's rule on [f1 s1; f2 s2] [x y]' = [t1 t2]'.
  const double det = f1 * s2 - f2 * s1;
  TwoStreamCost c;
  if (!(std::abs(det) > 1e-9 * std::abs(f1 * s2))) return c;
  c.first_ns_per_byte = (t1_ns * s2 - t2_ns * s1) / det;
  c.second_ns_per_byte = (f1 * t2_ns - f2 * t1_ns) / det;
  c.valid = std::isfinite(c.first_ns_per_byte) && std::isfinite(c.second_ns_per_byte) &&
            c.first_ns_per_byte > 0 && c.second_ns_per_byte > 0;
  return c;
}

double source_read_bytes(double distinct_source_bytes, double copied_bytes, double l2_bytes) {
  return distinct_source_bytes <= l2_bytes ? distinct_source_bytes : copied_bytes;
}

double resident_rate(const std::vector<std::pair<double, double>>& curve) {
  if (curve.empty()) return 0;
  std::vector<double> small;
  for (size_t i = 0; i < curve.size() && i < 3; ++i) small.push_back(curve[i].second);
  std::sort(small.begin(), small.end());
  return small[small.size() / 2];
}

double resident_capacity(const std::vector<std::pair<double, double>>& curve) {
  if (curve.empty()) return 0;
  const double in_cache = resident_rate(curve);
  double cap = 0;
  for (const auto& [bytes, rate] : curve) {
    if (rate < 0.9 * in_cache) break;  // the first size that misses ends the resident range
    cap = bytes;
  }
  return cap;
}

double resident_share(double capacity, double small_bytes, double large_bytes, double bytes) {
  if (bytes <= small_bytes) return 1;
  if (bytes >= large_bytes) return 0;
  auto held = [&](double b) { return b <= capacity ? 1.0 : capacity / b; };
  const double span = held(small_bytes) - held(large_bytes);
  if (!(span > 1e-12)) return std::log(large_bytes / bytes) / std::log(large_bytes / small_bytes);
  return std::clamp((held(bytes) - held(large_bytes)) / span, 0.0, 1.0);
}

double blend_rate(double cached, double cache_GBps, double own_GBps) {
  if (cache_GBps <= 0) return own_GBps;
  if (own_GBps <= 0) return cache_GBps;
  return 1 / (cached / cache_GBps + (1 - cached) / own_GBps);
}

double oversubscribed_ratio(const std::vector<std::pair<int, double>>& measured, int ranks,
                            int cores) {
  if (cores <= 0 || ranks <= cores) return 1.0;
  const double fair = static_cast<double>(ranks) / cores;
  const double rounds = std::ceil(fair);
  // The measured makespan of cores + 1 threads says which the scheduler does: nearer to whole
  // rounds (2 for 3 threads on 2 cores) than to fair sharing (1.5), rounds for every R.
  for (const auto& [r, x] : measured) {
    if (r != cores + 1 || x <= 0) continue;
    const double f1 = static_cast<double>(r) / cores, r1 = std::ceil(f1);
    return std::abs(x - r1) < std::abs(x - f1) ? rounds : fair;
  }
  return fair;
}

double log_interpolate(std::vector<std::pair<double, double>> points, double x) {
  std::sort(points.begin(), points.end());
  if (points.empty()) return 0;
  if (x <= points.front().first) return points.front().second;
  for (size_t i = 1; i < points.size(); ++i) {
    const auto& [x0, y0] = points[i - 1];
    const auto& [x1, y1] = points[i];
    if (x <= x1) return y0 + std::log(x / x0) / std::log(x1 / x0) * (y1 - y0);
  }
  return points.back().second;
}

double two_stream_rate(const TwoStreamCost& cost, double first_bytes, double second_bytes) {
  const double ns = first_bytes * cost.first_ns_per_byte + second_bytes * cost.second_ns_per_byte;
  return ns > 0 ? first_bytes / ns : 0;
}

}  // namespace ubep::sim
