// --repeat N: the whole comparison N times (main.cpp rotates the implementations' order between
// runs), summarised over the runs. One run's medians move by 10-30% with this VM's load; the
// median of N runs' medians, with the range beside it, shows what a single run cannot: whether a
// difference is larger than the spread. Every ratio is taken inside its run first (an op over
// the bound measured in the same run), then summarised.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>

#include "bench.hpp"

namespace ubep::tools {

namespace {

struct Spread {
  double median = 0, lo = 0, hi = 0;
};
Spread spread(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.lo = v.front();
  s.hi = v.back();
  return s;
}

bool timed_op(const BenchRow& r) { return r.op == "dispatch" || r.op == "combine"; }
bool is_bound(const BenchRow& r) { return r.impl.rfind("bound", 0) == 0; }
std::string name_of(const BenchRow& r) {
  return r.impl + (r.variant.empty() || is_bound(r) ? "" : "(" + r.variant + ")");
}
// Key of a row across runs: a bound's variant is the kernel that won, which may change.
std::tuple<std::string, std::string, std::string> key_of(const BenchRow& r) {
  return {r.dtype, name_of(r), r.op};
}

const BenchRow* find(const std::vector<BenchRow>& run, const std::string& dtype,
                     const std::string& name, const std::string& op) {
  for (const BenchRow& r : run)
    if (r.dtype == dtype && name_of(r) == name && r.op == op) return &r;
  return nullptr;
}

void print_ratio(const char* what, const std::vector<double>& per_run) {
  if (per_run.empty()) return;
  const Spread s = spread(per_run);
  std::printf("  %-58s %6.3f  [%.3f-%.3f]  n=%zu\n", what, s.median, s.lo, s.hi, per_run.size());
}

}  // namespace

std::vector<BenchRow> summarize_runs(const std::vector<std::vector<BenchRow>>& runs) {
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<const BenchRow*>> by_key;
  std::vector<std::tuple<std::string, std::string, std::string>> order;
  for (const auto& run : runs)
    for (const BenchRow& r : run) {
      auto k = key_of(r);
      if (!by_key.count(k)) order.push_back(k);
      by_key[k].push_back(&r);
    }
  std::vector<BenchRow> out;
  for (const auto& k : order) {
    const auto& rs = by_key[k];
    std::vector<double> med, p99, xb, xfb;
    for (const BenchRow* r : rs) {
      med.push_back(r->median_us);
      p99.push_back(r->p99_us);
      if (r->x_bound > 0) xb.push_back(r->x_bound);
      if (r->x_floor_bound > 0) xfb.push_back(r->x_floor_bound);
    }
    // The run whose median is the median (or next above it) stands for the rest of the fields.
    std::vector<const BenchRow*> sorted = rs;
    std::sort(sorted.begin(), sorted.end(),
              [](const BenchRow* a, const BenchRow* b) { return a->median_us < b->median_us; });
    BenchRow row = *sorted[sorted.size() / 2];
    const Spread m = spread(med), x = spread(xb);
    row.median_us = m.median;
    row.p99_us = spread(p99).median;
    row.gbps = row.median_us > 0 ? row.bytes / (row.median_us * 1e3) : 0;
    row.runs = static_cast<int>(rs.size());
    row.run_min_us = m.lo;
    row.run_max_us = m.hi;
    row.x_bound = x.median;
    row.x_bound_min = x.lo;
    row.x_bound_max = x.hi;
    row.x_floor_bound = spread(xfb).median;
    out.push_back(std::move(row));
  }
  return out;
}

void print_summary(const Group& g, const BenchOptions& o,
                   const std::vector<std::vector<BenchRow>>& runs,
                   const std::vector<BenchRow>& summary) {
  if (g.rank() != 0) return;
  std::printf(
      "\nubep-bench --repeat %zu: %s on %s(%d ranks); median of the runs' medians [range], and of "
      "each run's ratio to the bound measured in that run [range]\n",
      runs.size(), o.workload.c_str(), g.kind(), g.size());
  std::printf("%-9s %-22s %-9s %11s %21s %8s %17s %8s\n", "dtype", "impl", "op", "median_us",
              "[run range]", "x_bound", "[run range]", "x_fl+bd");
  for (const BenchRow& r : summary) {
    if (!timed_op(r)) continue;
    std::printf("%-9s %-22s %-9s %11.1f   [%8.1f-%8.1f]", r.dtype.c_str(), name_of(r).c_str(),
                r.op.c_str(), r.median_us, r.run_min_us, r.run_max_us);
    if (r.x_bound > 0)
      std::printf(" %7.3fx  [%6.3f-%6.3f]", r.x_bound, r.x_bound_min, r.x_bound_max);
    else
      std::printf(" %8s %17s", "-", "");
    if (r.x_floor_bound > 0) std::printf(" %7.3fx", r.x_floor_bound);
    std::printf("\n");
  }
  // Ratios that combine rows, each taken inside its run, then summarised.
  std::printf("ratios, each within its run (median [range] over the runs):\n");
  std::vector<std::string> dtypes, names;
  for (const BenchRow& r : summary) {
    if (!timed_op(r)) continue;
    if (std::find(dtypes.begin(), dtypes.end(), r.dtype) == dtypes.end()) dtypes.push_back(r.dtype);
    if (!is_bound(r) && std::find(names.begin(), names.end(), name_of(r)) == names.end())
      names.push_back(name_of(r));
  }
  for (const std::string& d : dtypes)
    for (const std::string& n : names) {
      std::vector<double> total, total_floor;
      for (const auto& run : runs) {
        const BenchRow *dd = find(run, d, n, "dispatch"), *dc = find(run, d, n, "combine"),
                       *bd = find(run, d, "bound", "dispatch"),
                       *bc = find(run, d, "bound", "combine"),
                       *fl = find(run, d, "floor", "roundtrip");
        if (!dd || !dc || !bd || !bc || bd->median_us + bc->median_us <= 0) continue;
        total.push_back((dd->median_us + dc->median_us) / (bd->median_us + bc->median_us));
        if (fl)
          total_floor.push_back((dd->median_us + dc->median_us) /
                                (bd->median_us + bc->median_us + 2 * fl->median_us));
      }
      print_ratio((d + " " + n + " dispatch+combine / bound").c_str(), total);
      print_ratio((d + " " + n + " dispatch+combine / (bound + 2 round trips)").c_str(),
                  total_floor);
    }
  for (const std::string& n : names) {
    for (const char* op : {"dispatch", "combine"}) {
      std::vector<double> ratio;
      for (const auto& run : runs) {
        const BenchRow *f = find(run, "fp8", n, op), *b = find(run, "bf16", n, op);
        if (f && b && b->median_us > 0) ratio.push_back(f->median_us / b->median_us);
      }
      print_ratio((n + " fp8 / bf16 " + op + " (same run)").c_str(), ratio);
    }
  }
  std::fflush(stdout);
}

}  // namespace ubep::tools
