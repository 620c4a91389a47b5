// Where an op's time goes, per rank and per phase: each stage's time split into waiting on a peer
// (CallStats::stage_wait_us, measured by the library's bounded waits) and the rest -- this rank's
// own copying, reducing and bookkeeping -- and the skew between the ranks' starts of a call.
//
// Why the skew matters: a call's time is its slowest rank's, and a rank that starts first waits
// in its receive for the rows of a rank that starts later. The bench starts every op after a
// start barrier, so the skew is how unevenly the ranks leave it (and get their core); the
// bound's copies never wait on a peer, so skew is a cost the calls pay and the bound does not.
// Medians, not means: on this shared VM one preempted call in fifty moves a mean by more than
// the effect being looked for.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench.hpp"

namespace ubep::tools {

namespace {

double percentile_of(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, i > 0 ? i - 1 : 0)];
}
double median(const std::vector<double>& v) { return percentile_of(v, 0.5); }
double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// Every rank's vector (all the same length `n`), rank after rank.
std::vector<double> gather(Group& g, const std::vector<double>& mine, size_t n) {
  std::vector<double> all(n * static_cast<size_t>(g.size()));
  if (n > 0) g.allgather(mine.data(), all.data(), n * sizeof(double));
  return all;
}

}  // namespace

void OpBreakdown::add(const CallStats* stats, std::chrono::steady_clock::time_point start) {
  start_us_.push_back(std::chrono::duration<double, std::micro>(start.time_since_epoch()).count());
  if (!stats) return;
  waits_ = waits_ && stats->stage_wait_us.size() == stats->stage_us.size();
  for (size_t i = 0; i < stats->stage_us.size(); ++i) {
    const std::string name = stats->stage_us[i].first;
    if (!us_.count(name)) order_.push_back(name);
    us_[name].push_back(stats->stage_us[i].second);
    wait_[name].push_back(i < stats->stage_wait_us.size() ? stats->stage_wait_us[i] : 0.0);
  }
}

void OpBreakdown::finish(Group& g, const std::vector<double>& durations, BenchRow* row) const {
  for (const std::string& n : order_) row->stages.emplace_back(n, mean(us_.at(n)));
  // Per rank: the same stages in the same order on every rank (the same algorithm), else none.
  const int R = g.size();
  const size_t n = order_.size();
  const int shape[2] = {static_cast<int>(n), waits_ ? 1 : 0};
  std::vector<int> shapes(2 * static_cast<size_t>(R));
  g.allgather(shape, shapes.data(), sizeof shape);
  bool same = true, all_wait = true;
  for (int r = 0; r < R; ++r) {
    same = same && shapes[2 * static_cast<size_t>(r)] == shape[0];
    all_wait = all_wait && shapes[2 * static_cast<size_t>(r) + 1] == 1;
  }
  std::vector<double> mine(3 * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const std::vector<double>& us = us_.at(order_[i]);
    const std::vector<double>& wait = wait_.at(order_[i]);
    std::vector<double> work(us.size());
    for (size_t k = 0; k < us.size(); ++k) work[k] = us[k] - wait[k];
    mine[i] = median(us);
    mine[n + i] = median(wait);
    mine[2 * n + i] = median(work);
  }
  // Every rank takes the same branch (`shapes` is the same everywhere), so the sizes match.
  const std::vector<double> phases = same ? gather(g, mine, 3 * n) : std::vector<double>();
  // Starts and durations of every call on every rank: the skew, and the call without it.
  const size_t c = start_us_.size();
  std::vector<double> times(2 * c);
  for (size_t i = 0; i < c; ++i) {
    times[i] = start_us_[i];
    times[c + i] = i < durations.size() ? durations[i] : 0;
  }
  const std::vector<double> all = gather(g, times, 2 * c);
  auto at = [&](int r, size_t i) { return all[static_cast<size_t>(r) * 2 * c + i]; };
  std::vector<double> skew(c), from_last(c);
  std::vector<std::vector<double>> late(static_cast<size_t>(R)), op(static_cast<size_t>(R));
  for (size_t i = 0; i < c; ++i) {
    double first = at(0, i), last = first, end = first + at(0, c + i);
    for (int r = 1; r < R; ++r) {
      first = std::min(first, at(r, i));
      last = std::max(last, at(r, i));
      end = std::max(end, at(r, i) + at(r, c + i));
    }
    skew[i] = last - first;
    from_last[i] = end - last;
    for (int r = 0; r < R; ++r) {
      late[static_cast<size_t>(r)].push_back(at(r, i) - first);
      op[static_cast<size_t>(r)].push_back(at(r, c + i));
    }
  }
  // Start times compare only on one clock: one host (CLOCK_MONOTONIC is per machine).
  const bool one_clock = g.single_host() && c > 0;
  if (one_clock) {
    row->skew_median_us = median(skew);
    row->skew_p99_us = percentile_of(skew, 0.99);
    row->from_last_start_us = median(from_last);
  }
  row->per_rank.assign(static_cast<size_t>(R), {});
  for (int r = 0; r < R; ++r) {
    BenchRow::RankPhases& p = row->per_rank[static_cast<size_t>(r)];
    p.op_us = median(op[static_cast<size_t>(r)]);
    if (one_clock) p.late_us = median(late[static_cast<size_t>(r)]);
    if (!same) continue;
    const double* base = &phases[static_cast<size_t>(r) * 3 * n];
    p.stage_us.assign(base, base + n);
    if (all_wait) {
      p.wait_us.assign(base + n, base + 2 * n);
      p.work_us.assign(base + 2 * n, base + 3 * n);
    }
  }
}

void print_breakdown(const BenchRow& r) {
  if (r.per_rank.empty()) return;
  const std::string name = r.impl + (r.variant.empty() ? "" : "(" + r.variant + ")");
  std::printf(
      "%s %s by rank (medians, us; stage: own work + wait on a peer; late: start after "
      "the earliest rank):\n",
      name.c_str(), r.op.c_str());
  for (size_t k = 0; k < r.per_rank.size(); ++k) {
    const BenchRow::RankPhases& p = r.per_rank[k];
    std::printf("  rank %zu: late %.1f | op %.1f", k, p.late_us, p.op_us);
    for (size_t i = 0; i < p.stage_us.size() && i < r.stages.size(); ++i) {
      std::printf(" | %s %.1f", r.stages[i].first.c_str(), p.stage_us[i]);
      if (i < p.wait_us.size()) std::printf(" (work %.1f, wait %.1f)", p.work_us[i], p.wait_us[i]);
    }
    std::printf("\n");
  }
  if (r.skew_median_us > 0 || r.from_last_start_us > 0)
    std::printf(
        "  start skew (latest - earliest rank): median %.1f us, p99 %.1f us; from the "
        "latest start to the latest end: median %.1f us (the op, slowest rank: %.1f us)\n",
        r.skew_median_us, r.skew_p99_us, r.from_last_start_us, r.median_us);
}

}  // namespace ubep::tools
