// The scheduler's work-conserving cost model (SchedulerOptions::worker_gbps, issue 30) against
// ubep-sim's max-min network engine as the independent reference: every plan's predicted finish
// per worker equals what the engine computes for the same flows, and balanced is never worse
// than naive or column-major under that model (the sweep's criterion, at the planner's level).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "sim/call.hpp"
#include "sim/engine.hpp"
#include "sim/machine.hpp"
#include "ubep/error.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::sim {
namespace {

using sched::Plan;
using sched::PlanItem;
using sched::Policy;
using sched::SchedulerOptions;
using sched::SendWork;
using sched::Topology;

struct Case {
  Topology topology;
  SchedulerOptions options;
  std::vector<int64_t> rows, recv;
  int src = 0;
  int per_rank = 0;
  int64_t row_bytes = 0;
  SendWork work() const { return {src, per_rank, rows, row_bytes, recv}; }
};

// A random cm384 or h800 case: skewed rows, with or without receive totals (some hot ports),
// one link per level or cm384's shared UB port.
Case random_case(std::mt19937_64& g) {
  auto pick = [&](int lo, int hi) {
    return static_cast<int>(lo + g() % static_cast<uint64_t>(hi - lo + 1));
  };
  const bool cm = pick(0, 1) == 1;
  Case c{cm ? sched::cm384(pick(2, 40)) : sched::h800(8 * pick(1, 4)), {}, {}, {}, 0, 0, 0};
  const int R = c.topology.ranks();
  c.options.workers = pick(1, 24);
  c.options.worker_gbps = pick(0, 1) ? 33.3 : 400.0 / pick(1, 20);
  c.options.consume_row_ns = pick(0, 1) ? 0.0 : 20 + 14336 / 33.3;
  if (cm && pick(0, 1)) c.options.link_of_level = {0, 0, 0};  // ub1 and ub2 share one port
  c.per_rank = pick(0, 1) ? pick(1, 4) : 0;
  c.src = pick(0, R - 1);
  c.row_bytes = pick(0, 1) ? 14336 : 7168;
  c.rows.resize(static_cast<size_t>(R) * static_cast<size_t>(std::max(c.per_rank, 1)));
  for (auto& n : c.rows) n = pick(0, 3) == 0 ? 0 : (pick(0, 9) == 0 ? pick(20, 200) : pick(1, 8));
  if (pick(0, 2) > 0) {
    c.recv.assign(static_cast<size_t>(R), 0);
    const size_t per = static_cast<size_t>(std::max(c.per_rank, 1));
    for (size_t u = 0; u < c.rows.size(); ++u) c.recv[u / per] += c.rows[u];
    for (auto& n : c.recv) n += pick(0, 4) == 0 ? pick(200, 3000) : pick(0, 40);
  }
  return c;
}

// The plan's workers run through sim::Network: each worker's item is one flow through its
// engine (worker_gbps), the source's port of the item's level and, for a receiver-bound item,
// a link of its own at this source's share of the receiver's port (own_d / floor_d, as the
// scheduler charges it). The next item starts when the previous one's bytes are out; an item
// lands its level's latency later, and is complete once its receiver consumed its rows.
std::vector<double> engine_finish(const Case& c, const Plan& plan) {
  EventQueue q;
  Network net(q);
  const Topology& t = c.topology;
  const int L = t.num_levels();
  std::vector<int> port(static_cast<size_t>(L));
  std::vector<double> port_bw(static_cast<size_t>(L) + 1, 0.0);
  for (int l = 0; l < L; ++l) {
    port[static_cast<size_t>(l)] =
        l == 0 ? 0 : 1 + (c.options.link_of_level.empty() ? l - 1 : c.options.link_of_level[l]);
    auto& bw = port_bw[static_cast<size_t>(port[static_cast<size_t>(l)])];
    bw = std::max(bw, t.level(l).bandwidth_gbps);
  }
  std::vector<int> port_link;
  for (double bw : port_bw) port_link.push_back(net.add_link(bw > 0 ? bw : 1));
  // Receiver caps: the scheduler's floors, recomputed here from the plan's flags and totals.
  std::vector<double> own(static_cast<size_t>(t.ranks()), 0.0);
  for (const PlanItem& it : plan.items) own[static_cast<size_t>(it.dest_rank)] += it.bytes;
  std::vector<double> finish(static_cast<size_t>(plan.workers), 0.0);
  std::vector<size_t> next(static_cast<size_t>(plan.workers));
  std::function<void(int)> issue = [&](int w) {
    const auto i = next[static_cast<size_t>(w)]++;
    if (i >= static_cast<size_t>(plan.worker_begin[static_cast<size_t>(w) + 1])) return;
    const PlanItem& it = plan.items[i];
    std::vector<int> path = {net.add_link(c.options.worker_gbps),
                             port_link[static_cast<size_t>(port[static_cast<size_t>(it.level)])]};
    if (it.receiver_bound) {
      const auto d = static_cast<size_t>(it.dest_rank);
      const double floor = static_cast<double>(c.recv[d]) * static_cast<double>(c.row_bytes) /
                           t.level(it.level).bandwidth_gbps;
      path.push_back(net.add_link(own[d] / floor));
    }
    const double lat = it.latency_ns + static_cast<double>(it.rows()) * c.options.consume_row_ns;
    net.start_flow(path, it.bytes, 0, [&, w, lat] {
      auto& f = finish[static_cast<size_t>(w)];
      f = std::max(f, q.now() + lat);
      issue(w);
    });
  };
  for (int w = 0; w < plan.workers; ++w) {
    next[static_cast<size_t>(w)] = static_cast<size_t>(plan.worker_begin[static_cast<size_t>(w)]);
    q.at(0, [&, w] { issue(w); });
  }
  q.run();
  return finish;
}

TEST(PlanSharing, PredictedFinishMatchesTheMaxMinEngine) {
  std::mt19937_64 g(30);
  int bound_cases = 0;
  for (int iter = 0; iter < 60; ++iter) {
    const Case c = random_case(g);
    sched::Scheduler s(c.topology, c.options);
    for (Policy p : {Policy::kNaive, Policy::kColumnMajor, Policy::kBalanced}) {
      s.set_policy(p);
      const Plan plan = s.plan(c.work());
      bound_cases += std::any_of(plan.items.begin(), plan.items.end(),
                                 [](const PlanItem& it) { return it.receiver_bound; });
      const std::vector<double> ref = engine_finish(c, plan);
      double slowest = plan.receiver_floor_ns;
      for (int w = 0; w < plan.workers; ++w) {
        const double got = plan.worker_cost_ns[static_cast<size_t>(w)];
        EXPECT_NEAR(got, ref[static_cast<size_t>(w)], 1e-6 * ref[static_cast<size_t>(w)] + 1e-6)
            << "case " << iter << " " << sched::policy_name(p) << " worker " << w << "\n"
            << plan.describe();
        slowest = std::max(slowest, ref[static_cast<size_t>(w)]);
      }
      EXPECT_NEAR(plan.slowest_ns, slowest, 1e-6 * slowest);
    }
  }
  EXPECT_GT(bound_cases, 0);  // the receiver caps were exercised
}

TEST(PlanSharing, BalancedIsNeverWorseThanTheStaticPolicies) {
  std::mt19937_64 g(31);
  for (int iter = 0; iter < 100; ++iter) {
    const Case c = random_case(g);
    sched::Scheduler s(c.topology, c.options);
    double span[3];
    int i = 0;
    for (Policy p : {Policy::kNaive, Policy::kColumnMajor, Policy::kBalanced}) {
      s.set_policy(p);
      span[i++] = s.plan(c.work()).slowest_ns;
    }
    EXPECT_LE(span[2], span[0] * (1 + 1e-9)) << "case " << iter << ": balanced above naive";
    EXPECT_LE(span[2], span[1] * (1 + 1e-9)) << "case " << iter << ": balanced above column-major";
  }
}

// The sweep point where balanced lost before this model (`ubep-sim sched-sweep`: EP64, BS 128,
// uniform routing, every worker sending): with fixed shares balanced picked an LPT plan that the
// simulation ran 1.6% slower than column-major's (52.27 vs 51.47 us); with the ports modelled as
// they are it is not slower.
TEST(PlanSharing, BalancedNotSlowerThanColumnMajorInTheSimulation) {
  Preset p = make_preset("cm384", 64);
  p.cost.ubep_reorder_workers = 0;
  const Traffic t = draw_traffic(64, 256, 8, 128, 0, 1.0, 1);
  CallConfig cfg;
  cfg.resolve_ns = 10;
  double us[2];
  for (int i = 0; i < 2; ++i) {
    cfg.policy = i ? Policy::kBalanced : Policy::kColumnMajor;
    us[i] = simulate_call(p, cfg, t).makespan_ns / 1e3;
  }
  EXPECT_LE(us[1], us[0] * (1 + 1e-9)) << "balanced " << us[1] << " us, column-major " << us[0];
}

TEST(PlanSharing, BadLinkMapNamesTheValue) {
  SchedulerOptions o{4, Policy::kBalanced, 10.0, {0, 5, 0}};
  EXPECT_THROW(sched::Scheduler(sched::cm384(8), o), InvalidArgument);
  o.link_of_level = {0, 0};
  EXPECT_THROW(sched::Scheduler(sched::cm384(8), o), InvalidArgument);
  o.link_of_level = {};
  o.worker_gbps = -1;
  EXPECT_THROW(sched::Scheduler(sched::cm384(8), o), InvalidArgument);
  o.worker_gbps = 10;
  o.consume_row_ns = -5;
  EXPECT_THROW(sched::Scheduler(sched::cm384(8), o), InvalidArgument);
}

}  // namespace
}  // namespace ubep::sim
