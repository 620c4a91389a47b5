// Output of ubep-bench: the table, the JSON file and the scheduler's per-policy report.
#include <cstdio>
#include <fstream>
#include <map>

#include "bench.hpp"
#include "ubep/error.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::tools {

std::vector<PolicyRow> policy_report(Group& g, const BenchOptions& o) {
  std::vector<PolicyRow> out;
  if (o.topology.empty()) return out;
  // The same routing as run_bench's input (make_input's seed), without the token data.
  std::vector<int64_t> idx;
  std::vector<float> weights;
  make_routing(o.tokens, o.topk, o.experts, o.routing,
               o.seed * 131 + static_cast<uint64_t>(g.rank()), &idx, &weights);
  const sched::Topology topo = sched::parse_topology(o.topology, g.size());
  const int El = o.experts / g.size();
  // Latency layout: one unit per destination expert (the paper's (worker x expert) mapping);
  // throughput: one unit per destination rank.
  const bool per_expert = o.layout == Layout::kLatency;
  std::vector<int64_t> rows(
      per_expert ? static_cast<size_t>(o.experts) : static_cast<size_t>(g.size()), 0);
  for (int64_t t = 0; t < o.tokens; ++t) {
    std::vector<bool> seen(static_cast<size_t>(g.size()), false);
    for (int j = 0; j < o.topk; ++j) {
      const int64_t e = idx[static_cast<size_t>(t * o.topk + j)];
      if (e < 0) continue;
      if (per_expert)
        ++rows[static_cast<size_t>(e)];
      else if (!seen[static_cast<size_t>(e / El)]) {
        seen[static_cast<size_t>(e / El)] = true;
        ++rows[static_cast<size_t>(e / El)];
      }
    }
  }
  for (sched::Policy p :
       {sched::Policy::kNaive, sched::Policy::kColumnMajor, sched::Policy::kBalanced}) {
    sched::Scheduler s(topo, {o.plan_workers, p});
    const sched::Plan plan = s.plan({g.rank(), per_expert ? El : 0, rows,
                                     o.hidden * static_cast<int64_t>(dtype_size(o.dtype))});
    PolicyRow r;
    r.policy = sched::policy_name(p);
    r.slowest_us = mean_over_ranks(g, plan.slowest_ns / 1e3);
    r.mean_us = mean_over_ranks(g, plan.mean_ns / 1e3);
    r.imbalance = mean_over_ranks(g, plan.imbalance);
    out.push_back(r);
  }
  return out;
}

void print_policy_report(const Group& g, const BenchOptions& o,
                         const std::vector<PolicyRow>& rows) {
  if (g.rank() != 0 || rows.empty()) return;
  std::printf(
      "scheduler on topology %s, %d workers per rank, predicted send time (mean over ranks):\n",
      o.topology.c_str(), o.plan_workers);
  std::printf("  %-13s %12s %10s %18s\n", "policy", "slowest_us", "mean_us", "imbalance(max/mean)");
  for (const auto& r : rows)
    std::printf("  %-13s %12.2f %10.2f %18.3f\n", r.policy.c_str(), r.slowest_us, r.mean_us,
                r.imbalance);
}

void print_table(const Group& g, const BenchOptions& o, const std::vector<BenchRow>& rows) {
  if (g.rank() != 0) return;
  std::printf(
      "ubep-bench: %s on %s(%d ranks), tokens=%lld hidden=%lld topk=%d experts=%d %s layout=%s "
      "routing=%s iters=%d\n",
      o.workload.c_str(), g.kind(), g.size(), static_cast<long long>(o.tokens),
      static_cast<long long>(o.hidden), o.topk, o.experts,
      o.fp8_cast ? "fp8-cast" : dtype_name(o.dtype), layout_name(o.layout), o.routing.c_str(),
      o.iters);
  std::printf("%-22s %-9s %11s %11s %9s %10s %8s %9s\n", "impl", "op", "median_us", "p99_us",
              "GB/s", "MB/rank", "x_bound", "barriers");
  const BenchRow* floor = nullptr;
  const BenchRow* barrier = nullptr;
  for (const auto& r : rows) {
    if (r.impl == "floor") floor = &r;
    if (r.impl == "barrier") barrier = &r;
    if (r.impl == "floor" || r.impl == "barrier") continue;
    const std::string name = r.impl + (r.variant.empty() ? "" : "(" + r.variant + ")");
    std::printf("%-22s %-9s %11.1f %11.1f %9.2f %10.2f", name.c_str(), r.op.c_str(), r.median_us,
                r.p99_us, r.gbps, r.bytes / 1e6);
    if (r.x_bound > 0)
      std::printf(" %7.2fx", r.x_bound);
    else
      std::printf(" %8s", "-");
    if (r.op == "dispatch" && (r.impl == "bsp" || r.impl == "ubep"))
      std::printf(" %9.1f", r.barriers);
    std::printf("\n");
  }
  if (floor) {
    std::printf(
        "latency floor: one-cache-line flag round trip, ranks 0<->1: median %.2f us, p99 %.2f us;"
        " one all-to-all flag barrier (%d ranks): median %.2f us\n",
        floor->median_us, floor->p99_us, g.size(), barrier ? barrier->median_us : 0.0);
    std::printf("x (floor + bound), median / (round trip + bound of the op):");
    for (const auto& r : rows)
      if (r.x_floor_bound > 0 && r.impl.rfind("bound", 0) != 0)
        std::printf("  %s%s %s %.2fx", r.impl.c_str(),
                    r.variant.empty() ? "" : ("(" + r.variant + ")").c_str(), r.op.c_str(),
                    r.x_floor_bound);
    std::printf("\n");
  }
  // Dispatch + combine ratios against the baseline (medians).
  std::map<std::string, double> total;
  for (const auto& r : rows)
    if (r.op == "dispatch" || r.op == "combine")
      total[r.impl.rfind("bound", 0) == 0
                ? r.impl
                : r.impl + (r.variant.empty() ? "" : "(" + r.variant + ")")] += r.median_us;
  const std::string base = total.count("mpi") ? "mpi" : (total.count("a2a") ? "a2a" : "");
  std::printf("dispatch+combine median:");
  for (auto& [k, v] : total) {
    std::printf("  %s %.1f us", k.c_str(), v);
    if (!base.empty() && k != base) std::printf(" (%.2fx %s)", v / total[base], base.c_str());
    if (total.count("bound") && k != "bound") std::printf(" (%.2fx bound)", v / total["bound"]);
  }
  std::printf("\n");
  for (const auto& r : rows) {
    if (r.op != "dispatch" || r.expected_network_rows == 0 || (r.impl != "bsp" && r.impl != "ubep"))
      continue;
    std::printf(
        "%s dispatch across hosts (mean per rank per call): %.0f token rows (deduplicated volume "
        "computed from the routing: %.0f), %.2f MB\n",
        r.impl.c_str(), r.network_rows, r.expected_network_rows, r.network_bytes / 1e6);
  }
  for (const auto& r : rows) {
    if (r.impl != "bound" || r.candidates.empty()) continue;
    std::printf("bound %s candidates (median us):", r.op.c_str());
    for (auto& [n, us] : r.candidates) std::printf("  %s %.1f", n.c_str(), us);
    if (r.expert_step_us > 0) std::printf("  | after an expert step of %.1f", r.expert_step_us);
    std::printf("\n");
  }
  for (const auto& r : rows) {
    if (r.stages.empty() || (r.op != "dispatch" && r.op != "combine")) continue;
    std::printf("%s %s stages (mean us):",
                (r.impl + (r.variant.empty() ? "" : "(" + r.variant + ")")).c_str(), r.op.c_str());
    for (auto& [n, us] : r.stages) std::printf("  %s %.1f", n.c_str(), us);
    if (r.op == "dispatch" && r.expert_read_us > 0)
      std::printf("  | then the expert's read (median, outside the op) %.1f", r.expert_read_us);
    if (r.op == "combine" && r.caller_read_us > 0)
      std::printf("  | then the caller's read of y (median, outside the op) %.1f",
                  r.caller_read_us);
    std::printf("\n");
  }
  for (const auto& r : rows)
    if ((r.op == "dispatch" || r.op == "combine") && r.impl.rfind("bound", 0) != 0)
      print_breakdown(r);
  std::fflush(stdout);
}

namespace {
// "ranks": [{"rank", "late_us", "op_us", "stages_us", "wait_us", "work_us"}] (medians), the
// start skew and the op timed from the latest start.
void write_breakdown(std::ofstream& f, const BenchRow& r) {
  if (r.per_rank.empty()) return;
  f << ", \"skew_median_us\": " << r.skew_median_us << ", \"skew_p99_us\": " << r.skew_p99_us
    << ", \"from_last_start_us\": " << r.from_last_start_us << ", \"ranks\": [";
  for (size_t k = 0; k < r.per_rank.size(); ++k) {
    const BenchRow::RankPhases& p = r.per_rank[k];
    f << (k ? ", " : "") << "{\"rank\": " << k << ", \"late_us\": " << p.late_us
      << ", \"op_us\": " << p.op_us;
    auto stages = [&](const char* key, const std::vector<double>& v) {
      if (v.empty()) return;
      f << ", \"" << key << "\": {";
      for (size_t i = 0; i < v.size() && i < r.stages.size(); ++i)
        f << (i ? ", " : "") << "\"" << r.stages[i].first << "\": " << v[i];
      f << "}";
    };
    stages("stages_us", p.stage_us);
    stages("wait_us", p.wait_us);
    stages("work_us", p.work_us);
    f << "}";
  }
  f << "]";
}
std::string join_dtypes(const BenchOptions& o) {  // "bf16,fp8": every row carries its own
  std::string s;
  for (const std::string& d : o.dtypes) s += (s.empty() ? "" : ",") + d;
  return s.empty() ? dtype_name(o.dtype) : s;
}
}  // namespace

namespace {
// run >= 0: the row's run index (--repeat's run_results).
void write_row(std::ofstream& f, const BenchOptions& o, const BenchRow& r, int run = -1) {
  f << "{\"impl\": \"" << r.impl << "\", \"op\": \"" << r.op << "\", \"dtype\": \""
    << (r.dtype.empty() ? dtype_name(o.dtype) : r.dtype.c_str())
    << "\", \"median_us\": " << r.median_us << ", \"p99_us\": " << r.p99_us
    << ", \"gbps\": " << r.gbps << ", \"bytes_per_rank\": " << r.bytes;
  if (r.variant.rfind("late=", 0) == 0)  // the straggler run
    f << ", \"late_us\": " << r.variant.substr(5);
  else if (!r.variant.empty())
    f << (r.impl.rfind("bound", 0) == 0 ? ", \"kernel\": \"" : ", \"sync\": \"") << r.variant
      << "\"";
  if (r.x_bound > 0) f << ", \"x_bound\": " << r.x_bound;
  if (r.x_floor_bound > 0) f << ", \"x_floor_bound\": " << r.x_floor_bound;
  if (r.impl == "bsp" || r.impl == "ubep") f << ", \"barriers\": " << r.barriers;
  if (r.op == "dispatch" && r.expected_network_rows > 0)
    f << ", \"network_rows\": " << r.network_rows
      << ", \"expected_network_rows\": " << r.expected_network_rows
      << ", \"network_bytes\": " << r.network_bytes;
  if (r.expert_read_us > 0) f << ", \"expert_read_us\": " << r.expert_read_us;
  if (r.expert_step_us > 0) f << ", \"expert_step_us\": " << r.expert_step_us;
  if (r.caller_read_us > 0) f << ", \"caller_read_us\": " << r.caller_read_us;
  if (!r.stages.empty()) {
    f << ", \"stages_us\": {";
    for (size_t s = 0; s < r.stages.size(); ++s)
      f << (s ? ", " : "") << "\"" << r.stages[s].first << "\": " << r.stages[s].second;
    f << "}";
  }
  write_breakdown(f, r);
  if (r.runs > 0)
    f << ", \"runs\": " << r.runs << ", \"run_min_us\": " << r.run_min_us
      << ", \"run_max_us\": " << r.run_max_us << ", \"x_bound_min\": " << r.x_bound_min
      << ", \"x_bound_max\": " << r.x_bound_max;
  if (run >= 0) f << ", \"run\": " << run;
  if (!r.candidates.empty()) {
    f << ", \"candidates_us\": {";
    for (size_t s = 0; s < r.candidates.size(); ++s)
      f << (s ? ", " : "") << "\"" << r.candidates[s].first << "\": " << r.candidates[s].second;
    f << "}";
  }
  f << "}";
}
}  // namespace

void write_json(const Group& g, const BenchOptions& o, const std::vector<BenchRow>& rows,
                const std::vector<BenchRow>& run_rows) {
  if (g.rank() != 0 || o.json.empty()) return;
  std::ofstream f(o.json);
  if (!f) throw SystemError("cannot write " + o.json);
  f << "{\"config\": {\"workload\": \"" << o.workload << "\", \"group\": \"" << g.kind()
    << "\", \"ranks\": " << g.size() << ", \"tokens\": " << o.tokens << ", \"hidden\": " << o.hidden
    << ", \"topk\": " << o.topk << ", \"experts\": " << o.experts << ", \"dtype\": \""
    << join_dtypes(o) << "\", \"layout\": \"" << layout_name(o.layout) << "\", \"routing\": \""
    << o.routing << "\", \"iters\": " << o.iters << ", \"warmup\": " << o.warmup
    << ", \"repeat\": " << o.repeat << "},\n \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    f << (i ? ",\n  " : "\n  ");
    write_row(f, o, rows[i]);
  }
  f << "\n]";
  if (!run_rows.empty()) {  // --repeat: every run's rows, each with its run index
    f << ",\n \"run_results\": [";
    for (size_t i = 0; i < run_rows.size(); ++i) {
      f << (i ? ",\n  " : "\n  ");
      write_row(f, o, run_rows[i], run_rows[i].run);
    }
    f << "\n]";
  }
  f << "}\n";
}

}  // namespace ubep::tools
