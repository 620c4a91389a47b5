// `ubep-sim sched-sweep`: the scheduling ablation over a grid of hot-expert loads (issue 30).
// For every (EP, hot experts, hot weight) point it simulates UBEP's dispatch with each policy
// (all workers send, as in `sched`) and reports the plan's predicted makespan, the simulated
// slowest sender and the simulated dispatch, and whether balanced beats both static policies.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "sim/experiments.hpp"
#include "sim/json.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

namespace {

struct PolicyRun {
  double planned_us = 0, sender_us = 0, dispatch_us = 0;
};

PolicyRun run_policy(const Preset& p, const Options& o, const Traffic& t, sched::Policy policy) {
  Options op = o;
  op.ubep_policy = policy;
  const CallResult r = simulate_call(p, call_config(op, Algo::kUbep, Op::kDispatch), t);
  return {r.planned_slowest_ns / 1e3, r.slowest_sender_ns / 1e3, r.makespan_ns / 1e3};
}

// --points "hot:weight,...": the points to run (a long EP256 sweep resumed or split).
std::vector<std::pair<int, double>> parse_points(const std::string& list) {
  std::vector<std::pair<int, double>> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, end - at);
    int hot = -1;
    double w = 0;
    char tail = 0;
    UBEP_CHECK_ARG(std::sscanf(item.c_str(), "%d:%lf%c", &hot, &w, &tail) == 2 && hot >= 0 && w > 0,
                   "flag --points: '", item, "' is not hot:weight (e.g. 8:2)");
    out.emplace_back(hot, w);
    at = end + 1;
  }
  return out;
}

}  // namespace

int cmd_sched_sweep(const Options& o) {
  const std::vector<int> ranks = o.ranks.empty() ? std::vector<int>{64, 256} : o.ranks;
  const int B = o.batch.empty() ? 128 : o.batch[0];
  // hot 0 is one point (the weight does not matter); then every (hot, weight) pair.
  std::vector<std::pair<int, double>> loads = {{0, 1.0}};
  for (int hot : {8, 32})
    for (double w : {2.0, 4.0, 8.0}) loads.emplace_back(hot, w);
  if (!o.points.empty()) loads = parse_points(o.points);
  const sched::Policy policies[] = {sched::Policy::kNaive, sched::Policy::kColumnMajor,
                                    sched::Policy::kBalanced};
  Json j;
  j.begin_object()
      .kv("experiment", "sched_sweep")
      .kv("preset", o.preset)
      .kv("batch", B)
      .key("rows")
      .begin_array();
  std::printf("%5s %4s %5s | %9s %9s %9s | %9s %9s %9s | %10s %8s %8s\n", "EP", "hot", "wt",
              "naive_us", "colmaj_us", "bal_us", "bal_plan", "bal_send", "bal_vs_nv", "bal_best",
              "plan_err", "send_err");
  const int total = static_cast<int>(ranks.size() * loads.size());
  int done = 0, wins = 0, within = 0;
  for (int R : ranks) {
    Preset p = make_preset(o.preset, R, o.calibration);
    p.cost.ubep_reorder_workers = 0;  // the paper's ablation: every worker sends
    for (auto [hot, w] : loads) {
      progress(o, ++done, total, detail::concat("EP", R, " hot ", hot, " weight ", w));
      const Traffic t = draw_traffic(R, o.experts, o.topk, B, hot, w, o.seed);
      PolicyRun run[3];
      for (int i = 0; i < 3; ++i) run[i] = run_policy(p, o, t, policies[i]);
      const PolicyRun& bal = run[2];
      // A relative tolerance of 1e-9 only absorbs floating-point noise between equal plans.
      const bool best = bal.dispatch_us <= run[0].dispatch_us * (1 + 1e-9) &&
                        bal.dispatch_us <= run[1].dispatch_us * (1 + 1e-9);
      const double plan_err = (bal.planned_us / bal.dispatch_us - 1) * 100;
      const double send_err = (bal.planned_us / bal.sender_us - 1) * 100;
      wins += best;
      within += std::abs(plan_err) <= 20;
      std::printf(
          "%5d %4d %5.1f | %9.2f %9.2f %9.2f | %9.2f %9.2f %8.1f%% | %10s %7.1f%% %7.1f%%\n", R,
          hot, w, run[0].dispatch_us, run[1].dispatch_us, bal.dispatch_us, bal.planned_us,
          bal.sender_us, (bal.dispatch_us / run[0].dispatch_us - 1) * 100, best ? "yes" : "NO",
          plan_err, send_err);
      std::fflush(stdout);
      j.begin_object().kv("ranks", R).kv("hot", hot).kv("hot_weight", w);
      for (int i = 0; i < 3; ++i) {
        const std::string n = sched::policy_name(policies[i]);
        j.kv(n + "_planned_us", run[i].planned_us)
            .kv(n + "_sender_us", run[i].sender_us)
            .kv(n + "_dispatch_us", run[i].dispatch_us);
      }
      j.kv("balanced_best", best ? 1 : 0).kv("plan_error_pct", plan_err).end_object();
    }
  }
  j.end_array().end_object();
  std::printf(
      "# balanced <= naive and <= column_major at %d of %d points; plan within 20%% of "
      "the simulated dispatch at %d of %d\n",
      wins, total, within, total);
  if (!o.json.empty()) j.write(o.json);
  return 0;
}

}  // namespace ubep::sim
