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
  // Rank 0, two workers, rows of 100 B: 10 rows to rank 1, 10 rows to rank 2. Each unit's issue
  // time is 1000 B / (10 GB/s / 2) = 200 ns; the source's own send time is 400 / 2 = 200 ns.
  // Rank 1 receives 10 rows in all: floor 1000 B / 10 GB/s = 100 ns, not receiver-bound.
  // Rank 2 receives 50 rows (four other sources send it 40): floor 500 ns > 1.1 x 200 ns, so it
  // is receiver-bound: this source's 1000 B into it take 500 ns of its worker.
  const std::vector<int64_t> rows = {0, 10, 10};
  const std::vector<int64_t> recv = {0, 10, 50};
  Scheduler sched(three_ranks(), {2, Policy::kBalanced});
  const Plan plan = sched.plan(SendWork{0, 0, rows, 100, recv});
  ASSERT_EQ(plan.items.size(), 2u) << plan.describe();
  for (const PlanItem& it : plan.items) {
    EXPECT_EQ(it.receiver_bound, it.dest_rank == 2);
    EXPECT_DOUBLE_EQ(it.issue_ns, it.dest_rank == 2 ? 500 : 200);
    EXPECT_DOUBLE_EQ(it.finish_ns, it.dest_rank == 2 ? 1500 : 1200);
  }
  for (int w = 0; w < 2; ++w) EXPECT_EQ(plan.worker_items(w).size(), 1u) << "one unit each";
  EXPECT_DOUBLE_EQ(plan.slowest_ns, 1500);
  EXPECT_DOUBLE_EQ(plan.receiver_floor_ns, 1500);

  // Column-major cuts both units in two 5-row halves, one per worker. Rank 2's traffic is then
  // held by k = 2 workers that share this source's part of its port: each half takes
  // max(100, 2 x 500 x 500 / 1000) = 500 ns. Each worker issues rank 1's half (100 ns, lands at
  // 1100) then rank 2's (lands at 600 + 1000): 1600 ns, slower than balanced.
  sched.set_policy(Policy::kColumnMajor);
  const Plan cm = sched.plan(SendWork{0, 0, rows, 100, recv});
  ASSERT_EQ(cm.items.size(), 4u) << cm.describe();
  EXPECT_DOUBLE_EQ(cm.slowest_ns, 1600);
  for (const PlanItem& it : cm.items) EXPECT_DOUBLE_EQ(it.issue_ns, it.dest_rank == 2 ? 500 : 100);

  // Without receive totals: the sender-only model, 200 + 1000 ns.
  sched.set_policy(Policy::kBalanced);
  const Plan blind = sched.plan(SendWork{0, 0, rows, 100});
  EXPECT_DOUBLE_EQ(blind.slowest_ns, 1200);
  EXPECT_DOUBLE_EQ(blind.receiver_floor_ns, 0);
}

TEST(Receivers, OneWorkerHoldsAHotDestination) {
  // cm384, 32 ranks, 48 workers, one expert per rank, 64 rows to every destination; rank 5's
  // port receives 4x the others'. Balanced keeps rank 5's traffic on one worker and issues it
  // first there; column-major spreads it over every worker.
  const int R = 32;
  std::vector<int64_t> rows(R, 64), recv(R, 64 * R);
  recv[5] = 4 * 64 * R;
  Scheduler sched(cm384(R), {48, Policy::kBalanced});
  const Plan plan = sched.plan(SendWork{0, 1, rows, 14336, recv});
  int holders = 0;
  for (int w = 0; w < plan.workers; ++w) {
    const auto items = plan.worker_items(w);
    const bool holds = std::any_of(items.begin(), items.end(),
                                   [](const PlanItem& it) { return it.dest_rank == 5; });
    holders += holds;
    if (holds) EXPECT_EQ(items.front().dest_rank, 5) << "hot destination not first";
  }
  EXPECT_EQ(holders, 1) << plan.describe();
  // Its floor: 4 x 64 x 32 rows x 14336 B / 392 GB/s, plus the farther level's latency.
  const double floor = 4.0 * 64 * R * 14336 / 392;
  const Level& lv = cm384(R).level(cm384(R).level_between(0, 5));
  EXPECT_DOUBLE_EQ(plan.receiver_floor_ns, floor + lv.latency_ns);
  EXPECT_NEAR(plan.slowest_ns, floor + lv.latency_ns, 1e-9 * floor);
  sched.set_policy(Policy::kColumnMajor);
  EXPECT_GT(sched.plan(SendWork{0, 1, rows, 14336, recv}).slowest_ns, plan.slowest_ns);
}

// Random inputs: every plan respects the receivers' floors (whatever the assignment, the workers
// holding a receiver-bound destination spend floor_d on it between them, and one of them at
// least floor_d); balanced is never slower than naive or column-major under the model; and
// when no destination is receiver-bound, plans equal those without receive totals.
TEST(Receivers, FloorHoldsAndBalancedStaysBest) {
  std::mt19937_64 g(20261202);
  int bound_cases = 0;
  for (int iter = 0; iter < 200; ++iter) {
    const int R = 2 + static_cast<int>(g() % 80), W = 1 + static_cast<int>(g() % 48);
    const int per_rank = static_cast<int>(g() % 3);
    const size_t units = static_cast<size_t>(R) * static_cast<size_t>(std::max(per_rank, 1));
    std::vector<int64_t> rows(units);
    for (auto& n : rows) n = static_cast<int64_t>(g() % 4 == 0 ? 0 : g() % 30);
    const int src = static_cast<int>(g() % static_cast<uint64_t>(R));
    // Receive totals: this source's rows plus the other sources', some destinations hot.
    std::vector<int64_t> recv(static_cast<size_t>(R), 0);
    const bool skew = g() % 2 == 0;
    for (size_t u = 0; u < units; ++u) {
      const size_t d = u / static_cast<size_t>(std::max(per_rank, 1));
      const int64_t others = (R - 1) * (skew && d % 7 == 3 ? 60 : 10);
      recv[d] += rows[u] + (d == 0 || rows[u] > 0 ? others : 0) / std::max(per_rank, 1);
    }
    SCOPED_TRACE("case " + std::to_string(iter) + ": " + std::to_string(R) + " ranks, " +
                 std::to_string(W) + " workers, src " + std::to_string(src));
    Scheduler sched(cm384(R), {W, Policy::kNaive});
    const SendWork work{src, per_rank, rows, 14336, recv};
    double slowest[3] = {};
    for (Policy p : {Policy::kNaive, Policy::kColumnMajor, Policy::kBalanced}) {
      sched.set_policy(p);
      const Plan plan = sched.plan(work);
      EXPECT_GE(plan.slowest_ns * (1 + 1e-12), plan.receiver_floor_ns) << plan.describe();
      slowest[static_cast<int>(p)] = plan.slowest_ns;
      bound_cases += p == Policy::kBalanced && plan.receiver_floor_ns > 0;
      const Plan blind = sched.plan(SendWork{src, per_rank, rows, 14336});
      EXPECT_LE(blind.slowest_ns, plan.slowest_ns * (1 + 1e-12));
      if (plan.receiver_floor_ns == 0) {
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
