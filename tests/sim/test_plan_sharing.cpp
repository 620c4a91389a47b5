// The scheduler's work-conserving cost model (SchedulerOptions::worker_gbps, issue 30) against
// ubep-sim's max-min network engine as the independent reference: every plan's predicted finish
// per worker equals what the engine computes for the same flows, and balanced is never worse
// than naive or column-major under that model (the sweep's criterion, at the planner's level).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "sim/call.hpp"
#include "sim/engine.hpp"
#include "sim/machine.hpp"
#include "src/sched/fluid.hpp"
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

// Port of each level under the case's link map (0: level 0's own link).
int port_of(const Case& c, int level) {
  if (level == 0) return 0;
  return 1 + (c.options.link_of_level.empty() ? level - 1 : c.options.link_of_level[level]);
}

// The plan's workers run through sim::Network: each worker's item is one flow through its
// engine (worker_gbps) and the source's port of the item's level. The next item starts when the
// previous one's bytes are out; an item lands its level's latency later, and is complete once
// its receiver consumed its rows. No receivers: plans with receiver-bound items are checked
// against the time-stepped reference below.
std::vector<double> engine_finish(const Case& c, const Plan& plan) {
  EventQueue q;
  Network net(q);
  const Topology& t = c.topology;
  const int L = t.num_levels();
  std::vector<int> port(static_cast<size_t>(L));
  std::vector<double> port_bw(static_cast<size_t>(L) + 1, 0.0);
  for (int l = 0; l < L; ++l) {
    port[static_cast<size_t>(l)] = port_of(c, l);
    auto& bw = port_bw[static_cast<size_t>(port[static_cast<size_t>(l)])];
    bw = std::max(bw, t.level(l).bandwidth_gbps);
  }
  std::vector<int> port_link;
  for (double bw : port_bw) port_link.push_back(net.add_link(bw > 0 ? bw : 1));
  std::vector<double> finish(static_cast<size_t>(plan.workers), 0.0);
  std::vector<size_t> next(static_cast<size_t>(plan.workers));
  std::function<void(int)> issue = [&](int w) {
    const auto i = next[static_cast<size_t>(w)]++;
    if (i >= static_cast<size_t>(plan.worker_begin[static_cast<size_t>(w) + 1])) return;
    const PlanItem& it = plan.items[i];
    std::vector<int> path = {net.add_link(c.options.worker_gbps),
                             port_link[static_cast<size_t>(port[static_cast<size_t>(it.level)])]};
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

// Per destination rank: the distinct workers a plan sends to it over (its concurrent flows).
std::vector<int> flows_of(const Plan& plan, int ranks) {
  std::vector<int> n(static_cast<size_t>(ranks), 0);
  for (int w = 0; w < plan.workers; ++w) {
    std::vector<bool> seen(static_cast<size_t>(ranks), false);
    for (const PlanItem& it : plan.worker_items(w)) {
      const auto d = static_cast<size_t>(it.dest_rank);
      if (!seen[d]) ++n[d];
      seen[d] = true;
    }
  }
  return n;
}

// The share of each destination's envelope a plan gets (ports share per flow,
// src/sched/scheduler_receivers.cpp): its flows to d over the source's non-empty units there,
// at most 1; 1 for naive (every source runs it: the peers' flows shrink alike).
std::vector<double> flow_share(const Case& c, const Plan& plan) {
  const int R = c.topology.ranks();
  if (plan.policy == Policy::kNaive) return std::vector<double>(static_cast<size_t>(R), 1.0);
  const std::vector<int> flows = flows_of(plan, R);
  const size_t per = static_cast<size_t>(std::max(c.per_rank, 1));
  std::vector<int> units(static_cast<size_t>(R), 0);
  for (size_t u = 0; u < c.rows.size(); ++u) units[u / per] += c.rows[u] > 0;
  std::vector<double> share(static_cast<size_t>(R), 1.0);
  for (size_t d = 0; d < share.size(); ++d)
    if (flows[d] > 0 && flows[d] < units[d]) share[d] = static_cast<double>(flows[d]) / units[d];
  return share;
}

// Independent reference for receiver-bound plans: time steps of dt, rates by progressive filling
// over three kinds of constraint: each worker's engine (worker_gbps), the source's ports, and
// each receiver-bound destination's envelope (this source may have delivered at most
// own_d * min(1, share_d * t / floor_d) bytes into d by time t; floor_d recomputed from recv
// and the level's bandwidth, share_d from flow_share). An item's bytes finish inside a step at
// their exact rate; its worker then idles to the step's end, so the reference lags the exact
// answer by at most dt per item.
std::vector<double> stepped_finish(const Case& c, const Plan& plan, double dt,
                                   const std::vector<double>& share) {
  const Topology& t = c.topology;
  const auto W = static_cast<size_t>(plan.workers);
  const auto R = static_cast<size_t>(t.ranks());
  std::vector<double> port_bw;
  for (int l = 0; l < t.num_levels(); ++l) {
    const auto p = static_cast<size_t>(port_of(c, l));
    if (port_bw.size() <= p) port_bw.resize(p + 1, 0.0);
    port_bw[p] = std::max(port_bw[p], t.level(l).bandwidth_gbps);
  }
  std::vector<double> own(R, 0.0), floor(R, 0.0), sent(R, 0.0);
  for (const PlanItem& it : plan.items) {
    const auto d = static_cast<size_t>(it.dest_rank);
    own[d] += it.bytes;
    if (it.receiver_bound)
      floor[d] = static_cast<double>(c.recv[d]) * static_cast<double>(c.row_bytes) /
                 (t.level(it.level).bandwidth_gbps * share[d]);
  }
  std::vector<size_t> next(W);
  std::vector<double> left(W, 0.0), finish(W, 0.0), rate(W);
  std::vector<bool> frozen(W);
  for (size_t w = 0; w < W; ++w) next[w] = static_cast<size_t>(plan.worker_begin[w]);
  auto item_of = [&](size_t w) -> const PlanItem* {
    return next[w] < static_cast<size_t>(plan.worker_begin[w + 1]) ? &plan.items[next[w]] : nullptr;
  };
  for (size_t w = 0; w < W; ++w)
    if (const PlanItem* it = item_of(w)) left[w] = it->bytes;
  for (double now = 0;; now += dt) {
    // Items without bytes (none are planned, but be safe) and finished ones move on.
    bool any = false;
    for (size_t w = 0; w < W; ++w) any = any || item_of(w) != nullptr;
    if (!any) break;
    // Capacity left this step per port and per envelope (bytes per ns).
    std::vector<double> port_left = port_bw, env_left(R, std::numeric_limits<double>::infinity());
    for (size_t d = 0; d < R; ++d)
      if (floor[d] > 0)
        env_left[d] = std::max(0.0, own[d] * std::min(1.0, (now + dt) / floor[d]) - sent[d]) / dt;
    std::fill(rate.begin(), rate.end(), 0.0);
    for (size_t w = 0; w < W; ++w) frozen[w] = item_of(w) == nullptr;
    for (;;) {  // progressive filling: raise every unfrozen rate by the tightest equal step
      std::vector<int> on_port(port_bw.size(), 0), on_dest(R, 0);
      bool open = false;
      for (size_t w = 0; w < W; ++w) {
        if (frozen[w]) continue;
        open = true;
        const PlanItem& it = *item_of(w);
        ++on_port[static_cast<size_t>(port_of(c, it.level))];
        if (it.receiver_bound) ++on_dest[static_cast<size_t>(it.dest_rank)];
      }
      if (!open) break;
      double step = std::numeric_limits<double>::infinity();
      for (size_t w = 0; w < W; ++w) {
        if (frozen[w]) continue;
        const PlanItem& it = *item_of(w);
        const auto p = static_cast<size_t>(port_of(c, it.level));
        step = std::min({step, c.options.worker_gbps - rate[w], port_left[p] / on_port[p]});
        if (it.receiver_bound) {
          const auto d = static_cast<size_t>(it.dest_rank);
          step = std::min(step, env_left[d] / on_dest[d]);
        }
      }
      for (size_t w = 0; w < W; ++w) {
        if (frozen[w]) continue;
        const PlanItem& it = *item_of(w);
        rate[w] += step;
        port_left[static_cast<size_t>(port_of(c, it.level))] -= step;
        if (it.receiver_bound) env_left[static_cast<size_t>(it.dest_rank)] -= step;
      }
      for (size_t w = 0; w < W; ++w) {
        if (frozen[w]) continue;
        const PlanItem& it = *item_of(w);
        const double tol = 1e-12 * c.options.worker_gbps;
        frozen[w] = rate[w] >= c.options.worker_gbps - tol ||
                    port_left[static_cast<size_t>(port_of(c, it.level))] <= tol ||
                    (it.receiver_bound && env_left[static_cast<size_t>(it.dest_rank)] <= tol);
      }
    }
    for (size_t w = 0; w < W; ++w) {
      const PlanItem* it = item_of(w);
      if (it == nullptr) continue;
      const double moved = std::min(left[w], rate[w] * dt);
      if (it->receiver_bound) sent[static_cast<size_t>(it->dest_rank)] += moved;
      left[w] -= moved;
      if (left[w] <= 1e-9 * it->bytes) {
        const double end = now + (rate[w] > 0 ? moved / rate[w] : 0);
        finish[w] =
            std::max(finish[w], end + it->latency_ns +
                                    static_cast<double>(it->rows()) * c.options.consume_row_ns);
        ++next[w];
        if (const PlanItem* n = item_of(w)) left[w] = n->bytes;
      }
    }
  }
  return finish;
}

TEST(PlanSharing, PredictedFinishMatchesTheMaxMinEngine) {
  std::mt19937_64 g(30);
  int bound_cases = 0, fewer_flows = 0;
  for (int iter = 0; iter < 60; ++iter) {
    const Case c = random_case(g);
    sched::Scheduler s(c.topology, c.options);
    for (Policy p : {Policy::kNaive, Policy::kColumnMajor, Policy::kBalanced}) {
      s.set_policy(p);
      const Plan plan = s.plan(c.work());
      const std::vector<double> share = flow_share(c, plan);
      const bool bound = std::any_of(plan.items.begin(), plan.items.end(),
                                     [](const PlanItem& it) { return it.receiver_bound; });
      bound_cases += bound;
      // Plans with fewer flows than units to a bound destination (naive's: share 1 all the
      // same; the others': share below 1), counted apart from the share rule itself.
      const std::vector<int> flows = flows_of(plan, c.topology.ranks());
      const size_t per = static_cast<size_t>(std::max(c.per_rank, 1));
      std::vector<int> units(static_cast<size_t>(c.topology.ranks()), 0);
      for (size_t u = 0; u < c.rows.size(); ++u) units[u / per] += c.rows[u] > 0;
      for (const PlanItem& it : plan.items) {
        const auto d = static_cast<size_t>(it.dest_rank);
        if (it.receiver_bound && flows[d] < units[d]) {
          ++fewer_flows;
          break;
        }
      }
      // Receiver-bound plans: the stepped reference, within its step error (one dt per item).
      const double dt = plan.slowest_ns / 5000;
      const std::vector<double> ref =
          bound ? stepped_finish(c, plan, dt, share) : engine_finish(c, plan);
      double slowest = plan.receiver_floor_ns;
      for (int w = 0; w < plan.workers; ++w) {
        const double got = plan.worker_cost_ns[static_cast<size_t>(w)];
        // An item's end costs its worker up to dt and, through the shared port and envelopes,
        // every other worker up to as much: about one dt per item of the plan, doubled for the
        // envelope's own step (with 8x finer steps the largest gap fell from 1298 to 101 ns).
        const double slack = 2 * (static_cast<double>(plan.items.size()) + 1) * dt;
        const double tol = bound ? slack : 1e-6 * ref[static_cast<size_t>(w)] + 1e-6;
        EXPECT_NEAR(got, ref[static_cast<size_t>(w)], tol)
            << "case " << iter << " " << sched::policy_name(p) << " worker " << w << "\n"
            << plan.describe();
        slowest = std::max(slowest, ref[static_cast<size_t>(w)]);
      }
      const double slack = bound ? 2 * (static_cast<double>(plan.items.size()) + 1) * dt : 0;
      EXPECT_NEAR(plan.slowest_ns, slowest, slack + 1e-6 * slowest);  // (reference's slack)
    }
  }
  EXPECT_GT(bound_cases, 0);  // the receiver caps were exercised
  EXPECT_GT(fewer_flows, 0);  // and plans with fewer flows than units to a bound destination
}

// The receiver envelope by hand (src/sched/fluid.hpp): one 10 B/ns link; a receiver group of
// 1000 B over a 1000 ns floor (slope 1 B/ns). Worker B sends 500 B into it from t = 0: the
// envelope holds it at 1 B/ns, so it ends at 500 ns while worker A's 5000 B plain item takes the
// other 9 B/ns (4500 B by 500 ns), then 10 B/ns alone (done at 550 ns). A's 500 B into the group
// then finds 50 B of credit (envelope 550, delivered 500) and runs at 10 B/ns until it catches
// the envelope at 550 + 50 / 9 ns, then at 1 B/ns: done when the envelope reaches 1000 B, at
// 1000 ns. Under the former per-item cap (1 B/ns for every item) A would end at 1050 ns.
TEST(PlanSharing, ReceiverEnvelopeByHand) {
  using sched::detail::FluidGroup;
  using sched::detail::FluidItem;
  const std::vector<FluidItem> items = {
      {0, 0, 5000, 0, -1},
      {0, 0, 500, 0, 0},  // worker A
      {0, 0, 500, 0, 0},  // worker B
  };
  const std::vector<int32_t> begin = {0, 2, 3};
  const std::vector<double> links = {10};
  const std::vector<FluidGroup> groups = {{1000, 1000}};
  std::vector<double> out(2);
  sched::detail::fluid_finish(items, begin, links, 0, out, groups);
  EXPECT_NEAR(out[0], 1000, 1e-6);
  EXPECT_NEAR(out[1], 500, 1e-6);
  // Two workers in the group together share its slope: 500 B each at 0.5 B/ns.
  const std::vector<FluidItem> both = {{0, 0, 500, 0, 0}, {0, 0, 500, 0, 0}};
  const std::vector<int32_t> begin2 = {0, 1, 2};
  sched::detail::fluid_finish(both, begin2, links, 0, out, groups);
  EXPECT_NEAR(out[0], 1000, 1e-6);
  EXPECT_NEAR(out[1], 1000, 1e-6);
  // A group naming a missing index, or an empty group, names the value.
  const std::vector<FluidItem> bad = {{0, 0, 500, 0, 3}};
  const std::vector<int32_t> begin1 = {0, 1};
  std::vector<double> one(1);
  EXPECT_THROW(sched::detail::fluid_finish(bad, begin1, links, 0, one, groups), InvalidArgument);
  const std::vector<FluidGroup> empty = {{0, 1000}};
  EXPECT_THROW(sched::detail::fluid_finish(both, begin2, links, 0, out, empty), InvalidArgument);
}

TEST(PlanSharing, BalancedIsNeverWorseThanTheStaticPolicies) {
  std::mt19937_64 g(31);
  for (int iter = 0; iter < 100; ++iter) {
    const Case c = random_case(g);
    sched::Scheduler s(c.topology, c.options);
    double span[3];
    bool bound = false;
    int i = 0;
    for (Policy p : {Policy::kNaive, Policy::kColumnMajor, Policy::kBalanced}) {
      s.set_policy(p);
      const Plan plan = s.plan(c.work());
      span[i++] = plan.slowest_ns;
      bound = bound || std::any_of(plan.items.begin(), plan.items.end(),
                                   [](const PlanItem& it) { return it.receiver_bound; });
    }
    // With receiver-bound destinations balanced takes naive's plan only if it is also no worse
    // under the no-credit bound (scheduler.cpp, plan_balanced), so it may stay above naive under
    // the plan's own (envelope) figures; column-major is its starting point, never beaten.
    if (!bound) {
      EXPECT_LE(span[2], span[0] * (1 + 1e-9)) << "case " << iter << ": above naive";
    }
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
