// The receiver term of the scheduler's cost model (issue 30): hand-computed plans, the floor
// every plan respects, and that without receive totals (or with no receiver-bound destination)
// plans are exactly those of the sender-only model.
#include <gtest/gtest.h>

#include "expect_invalid.hpp"

#include <algorithm>
#include <random>
#include <vector>

#include "ubep/scheduler.hpp"

namespace ubep::sched {
namespace {

using ubep::test::expect_invalid;

// Three ranks, every pair one level apart: self 100 ns 10 GB/s, net 1000 ns 10 GB/s.
Topology three_ranks() { return Topology("t3", {{"self", 100, 10}, {"net", 1000, 10}}, 3); }

TEST(Receivers, HandComputedPlan) {
  // Rank 0, two workers, rows of 100 B: 10 rows to rank 1, 10 rows to rank 2. A whole unit's
  // issue time is 1000 B / (10 GB/s / 2) = 200 ns; the source's own send time is 400 / 2 =
  // 200 ns. Rank 1 receives 10 rows in all: floor 1000 B / 10 GB/s = 100 ns, not
  // receiver-bound. Rank 2 receives 50 rows (other sources send it 40): floor 500 ns >
  // 1.1 x 200 ns, receiver-bound: this source's 1000 B into it get at most 1000 B / 500 ns.
  const std::vector<int64_t> rows = {0, 10, 10};
  const std::vector<int64_t> recv = {0, 10, 50};
  Scheduler sched(three_ranks(), {2, Policy::kColumnMajor});
  // Column-major: each worker gets 5 rows of each unit. Rank 1's half: 100 ns. Rank 2's half:
  // max(100, 500 x 500 / 1000) = 250 ns. A worker spends 350 ns and lands its last item at
  // 350 + 1000, but no plan lands before rank 2's port drained: 500 + 1000 ns.
  const Plan cm = sched.plan(SendWork{0, 0, rows, 100, recv});
  ASSERT_EQ(cm.items.size(), 4u) << cm.describe();
  for (const PlanItem& it : cm.items) {
    EXPECT_EQ(it.receiver_bound, it.dest_rank == 2);
    EXPECT_DOUBLE_EQ(it.issue_ns, it.dest_rank == 2 ? 250 : 100);
  }
  for (int w = 0; w < 2; ++w) EXPECT_DOUBLE_EQ(cm.worker_cost_ns[static_cast<size_t>(w)], 1350);
  EXPECT_DOUBLE_EQ(cm.receiver_floor_ns, 1500);
  EXPECT_DOUBLE_EQ(cm.slowest_ns, 1500);

  // Balanced: unsplit LPT puts each unit on its own worker; rank 2's whole unit holds its worker
  // max(200, 500) = 500 ns and lands at 1500, the floor. Column-major (its first candidate)
  // is as good, so it stays, in its own order.
  sched.set_policy(Policy::kBalanced);
  const Plan bal = sched.plan(SendWork{0, 0, rows, 100, recv});
  EXPECT_DOUBLE_EQ(bal.slowest_ns, 1500);
  EXPECT_EQ(bal.items.size(), 4u) << bal.describe();

  // Without receive totals: the sender-only model, 200 + 1000 ns.
  const Plan blind = sched.plan(SendWork{0, 0, rows, 100});
  EXPECT_DOUBLE_EQ(blind.slowest_ns, 1200);
  EXPECT_DOUBLE_EQ(blind.receiver_floor_ns, 0);
}

TEST(Receivers, HotPortSetsTheFloor) {
  // cm384, 32 ranks, 48 workers, one expert per rank, 64 rows to every destination; rank 5's
  // port receives 4x the others'. Its floor, 4 x 64 x 32 rows x 14336 B / 392 GB/s plus the
  // latency to it, is above what the sender alone needs (32 x 64 rows x 14336 B / 392 GB/s):
  // every policy's plan is charged the floor, and the sender-only plan is below it.
  const int R = 32;
  std::vector<int64_t> rows(R, 64), recv(R, 64 * R);
  recv[5] = 4 * 64 * R;
  const Topology topo = cm384(R);
  const double floor = 4.0 * 64 * R * 14336 / 392 + topo.latency_ns(0, 5);
  Scheduler sched(topo, {48, Policy::kBalanced});
  for (Policy p : {Policy::kNaive, Policy::kColumnMajor, Policy::kBalanced}) {
    sched.set_policy(p);
    const Plan plan = sched.plan(SendWork{0, 1, rows, 14336, recv});
    EXPECT_DOUBLE_EQ(plan.receiver_floor_ns, floor) << policy_name(p);
    EXPECT_GE(plan.slowest_ns, floor);
    int bound = 0;
    for (const PlanItem& it : plan.items) bound += it.receiver_bound;
    EXPECT_GT(bound, 0);
    for (const PlanItem& it : plan.items) EXPECT_EQ(it.receiver_bound, it.dest_rank == 5);
  }
  sched.set_policy(Policy::kBalanced);
  EXPECT_LT(sched.plan(SendWork{0, 1, rows, 14336}).slowest_ns, floor);
}

// Random inputs: the floor reported is the one computed here from the receive totals; balanced
// is never slower than naive or column-major under the model; receive totals never make a plan
// cheaper; and when no destination is receiver-bound, plans equal those without totals.
TEST(Receivers, FloorMatchesTotalsAndBalancedStaysBest) {
  std::mt19937_64 g(20261202);
  int bound_cases = 0;
  for (int iter = 0; iter < 200; ++iter) {
    const int R = 2 + static_cast<int>(g() % 80), W = 1 + static_cast<int>(g() % 48);
    const int per_rank = static_cast<int>(g() % 3);
    const int per = std::max(per_rank, 1);
    const size_t units = static_cast<size_t>(R) * static_cast<size_t>(per);
    std::vector<int64_t> rows(units);
    for (auto& n : rows) n = static_cast<int64_t>(g() % 4 == 0 ? 0 : g() % 30);
    const int src = static_cast<int>(g() % static_cast<uint64_t>(R));
    std::vector<int64_t> recv(static_cast<size_t>(R), 0);
    const bool skew = g() % 2 == 0;
    for (size_t u = 0; u < units; ++u) {
      const size_t d = u / static_cast<size_t>(per);
      recv[d] += rows[u] + (R - 1) * (skew && d % 7 == 3 ? 60 : 10) / per;
    }
    const Topology topo = cm384(R);
    // The floor by hand: own send time = sum of rows x bytes / bandwidth over units; a remote
    // destination is bound when recv x bytes / bandwidth > 1.1 x that.
    double send = 0, expect_floor = 0;
    for (size_t u = 0; u < units; ++u)
      send += static_cast<double>(rows[u]) * 14336 /
              topo.bandwidth_gbps(src, static_cast<int>(u / static_cast<size_t>(per)));
    for (int d = 0; d < R; ++d) {
      int64_t own = 0;
      for (int e = 0; e < per; ++e) own += rows[static_cast<size_t>(d * per + e)];
      const double f =
          static_cast<double>(recv[static_cast<size_t>(d)]) * 14336 / topo.bandwidth_gbps(src, d);
      if (d != src && own > 0 && f > kReceiverMargin * send)
        expect_floor = std::max(expect_floor, f + topo.latency_ns(src, d));
    }
    SCOPED_TRACE("case " + std::to_string(iter) + ": " + std::to_string(R) + " ranks, " +
                 std::to_string(W) + " workers, src " + std::to_string(src));
    Scheduler sched(topo, {W, Policy::kNaive});
    const SendWork work{src, per_rank, rows, 14336, recv};
    double slowest[3] = {};
    for (Policy p : {Policy::kNaive, Policy::kColumnMajor, Policy::kBalanced}) {
      sched.set_policy(p);
      const Plan plan = sched.plan(work);
      EXPECT_NEAR(plan.receiver_floor_ns, expect_floor, 1e-9 * expect_floor);
      EXPECT_GE(plan.slowest_ns, plan.receiver_floor_ns);
      slowest[static_cast<int>(p)] = plan.slowest_ns;
      bound_cases += p == Policy::kBalanced && expect_floor > 0;
      const Plan blind = sched.plan(SendWork{src, per_rank, rows, 14336});
      EXPECT_LE(blind.slowest_ns, plan.slowest_ns * (1 + 1e-12));
      if (expect_floor == 0) {
        ASSERT_EQ(plan.items.size(), blind.items.size());
        for (size_t i = 0; i < plan.items.size(); ++i) {
          EXPECT_EQ(plan.items[i].expert, blind.items[i].expert);
          EXPECT_EQ(plan.items[i].dest_rank, blind.items[i].dest_rank);
          EXPECT_EQ(plan.items[i].row_begin, blind.items[i].row_begin);
        }
        EXPECT_DOUBLE_EQ(plan.slowest_ns, blind.slowest_ns);
      }
    }
    const double eps = 1e-9 * slowest[2];
    EXPECT_LE(slowest[2], slowest[0] + eps);
    EXPECT_LE(slowest[2], slowest[1] + eps);
  }
  EXPECT_GT(bound_cases, 40) << "too few receiver-bound cases to test the receiver term";
}

// Ports share per flow (scheduler_receivers.cpp), by hand under the fluid model: rank 0, one
// worker at 10 GB/s, four experts of rank 2 with 10 rows of 100 B each (4000 B); rank 2 receives
// 200 rows in all, so its port drains in 2000 ns (receiver-bound: this source alone needs 400).
// The worker sends the four units one after another, one flow where it has four units.
//  * naive: every source runs it and serialises alike, so the peers' flows into rank 2 shrink
//    with this one's and it keeps its proportional share, 4000 B over 2000 ns: the last byte
//    leaves at 2000 ns and lands at 3000 (the floor plus latency);
//  * column-major and balanced: the peers are taken to keep a flow per unit, so one flow of
//    four gets a quarter of that share: 8000 ns, landing at 9000.
TEST(Receivers, NaivePlansKeepTheProportionalShareAtAHotPort) {
  std::vector<int64_t> rows(12, 0);
  for (int e = 8; e < 12; ++e) rows[static_cast<size_t>(e)] = 10;
  const std::vector<int64_t> recv = {0, 0, 200};
  SchedulerOptions o{1, Policy::kNaive};
  o.worker_gbps = 10;
  Scheduler sched(three_ranks(), o);
  for (Policy p : {Policy::kNaive, Policy::kColumnMajor, Policy::kBalanced}) {
    sched.set_policy(p);
    const Plan plan = sched.plan(SendWork{0, 4, rows, 100, recv});
    ASSERT_EQ(plan.items.size(), 4u) << plan.describe();
    EXPECT_DOUBLE_EQ(plan.receiver_floor_ns, 3000) << policy_name(p);
    EXPECT_NEAR(plan.slowest_ns, p == Policy::kNaive ? 3000 : 9000, 1e-6) << policy_name(p);
  }
}

TEST(Receivers, BadTotalsNameTheValue) {
  Scheduler sched(three_ranks(), {2, Policy::kBalanced});
  const std::vector<int64_t> rows = {0, 10, 10};
  const std::vector<int64_t> short_recv = {0, 10};
  const std::vector<int64_t> low = {0, 10, 4};
  expect_invalid(
      [&] {
        sched.plan(SendWork{0, 0, rows, 100, short_recv});
      },
      {"recv_rows has 2", "3"});
  expect_invalid([&] { sched.plan(SendWork{0, 0, rows, 100, low}); }, {"recv_rows[2] = 4", "10"});
}

}  // namespace
}  // namespace ubep::sched
