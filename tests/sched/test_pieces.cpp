// The piece floor (SchedulerOptions::min_piece_bytes, capped by kMinPiecesPerWorker): no policy
// cuts a unit into pieces below it, a floor of one row is column-major's plan of before (an
// independent reference), and the item counts it saves, by hand.
#include <gtest/gtest.h>

#include "expect_invalid.hpp"

#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ubep/error.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::sched {
namespace {

TEST(Pieces, HandCountedItems) {
  // cm384, 64 ranks x 4 experts, 48 workers, rows of 14336 B (7168 bf16): the byte floor of
  // 64 KiB is ceil(65536 / 14336) = 5 rows; the share cap is (rows of the call) / (48 x 8).
  const Topology topo = cm384(64);
  SchedulerOptions opt{48, Policy::kColumnMajor};
  Scheduler floored(topo, opt);
  opt.min_piece_bytes = 0;
  Scheduler per_row(topo, opt);
  struct Want {
    int64_t rows_per_expert;
    size_t items;      // with the floor
    int64_t min_rows;  // smallest item
  };
  // 4 rows per expert (EP64 BS128 top-8 on average): 1,024 rows, cap 1024 / 384 = 2 rows, so
  // two pieces per expert: 512 items instead of 1,024. 16 rows: cap 10, floor 5, 16 / 5 = 3
  // pieces (5, 5, 6): 768 instead of 4,096. 240 = 48 x 5 rows: W slices of 5, as without the
  // floor. 239: 47 pieces of 5 or 6. 1 row: one piece, as without the floor.
  for (const Want& w : std::vector<Want>{
           {4, 512, 2}, {16, 768, 5}, {240, 48 * 256, 5}, {239, 47 * 256, 5}, {1, 256, 1}}) {
    const std::vector<int64_t> rows(256, w.rows_per_expert);
    const Plan p = floored.plan(SendWork{0, 4, rows, 14336});
    EXPECT_EQ(p.items.size(), w.items) << w.rows_per_expert << " rows per expert";
    for (const PlanItem& it : p.items) EXPECT_GE(it.rows(), w.min_rows) << w.rows_per_expert;
    const Plan q = per_row.plan(SendWork{0, 4, rows, 14336});
    EXPECT_EQ(q.items.size(), 256u * static_cast<size_t>(std::min<int64_t>(w.rows_per_expert, 48)));
  }
}

// Column-major without a floor, written out independently: a unit of n >= W rows in W slices
// [n s / W, n (s + 1) / W), slice s on worker (s + unit id) mod W; a unit of n < W rows one row
// per piece, row j on the worker of the W-slice holding it.
std::vector<std::tuple<int64_t, int64_t, int64_t, int>> per_row_reference(
    const std::vector<int64_t>& rows, int W) {
  std::vector<std::tuple<int64_t, int64_t, int64_t, int>> out;
  for (size_t u = 0; u < rows.size(); ++u) {
    const int64_t n = rows[u];
    for (int64_t s = 0; s < W; ++s) {
      const int64_t b = n * s / W, e = n * (s + 1) / W;
      if (b < e)
        out.emplace_back(static_cast<int64_t>(u), b, e,
                         static_cast<int>((s + static_cast<int64_t>(u)) % W));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Pieces, NoPieceBelowTheFloorAndNoFloorIsTheOldPlan) {
  std::mt19937_64 g(20261202);
  auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(g() % static_cast<uint64_t>(hi - lo + 1));
  };
  for (int iter = 0; iter < 300; ++iter) {
    const Topology topo =
        pick(0, 1) ? cm384(static_cast<int>(pick(2, 96)))
                   : hosts_by_ranks(static_cast<int>(pick(1, 4)), static_cast<int>(pick(1, 8)));
    const int per_rank = static_cast<int>(pick(0, 4));
    const size_t units =
        static_cast<size_t>(topo.ranks()) * static_cast<size_t>(std::max(per_rank, 1));
    std::vector<int64_t> rows(units);
    int64_t total = 0;
    for (auto& n : rows) {
      n = pick(0, 3) == 0 ? 0 : (pick(0, 20) == 0 ? pick(50, 2000) : pick(1, 30));
      total += n;
    }
    SchedulerOptions opt{static_cast<int>(pick(1, 64)), Policy::kNaive};
    opt.min_piece_bytes = pick(0, 3) == 0 ? 0 : pick(1, 200000);
    const int64_t row_bytes = pick(0, 1) ? 14336 : pick(1, 5000);
    const int64_t floor_rows =
        std::max<int64_t>(1, std::min((opt.min_piece_bytes + row_bytes - 1) / row_bytes,
                                      total / (opt.workers * kMinPiecesPerWorker)));
    const auto src = static_cast<int>(pick(0, topo.ranks() - 1));
    Scheduler sched(topo, opt);
    SCOPED_TRACE("case " + std::to_string(iter) + ": " + topo.describe() + ", " +
                 std::to_string(opt.workers) + " workers, floor " +
                 std::to_string(opt.min_piece_bytes) + " B, rows of " + std::to_string(row_bytes));
    for (Policy p : {Policy::kNaive, Policy::kColumnMajor, Policy::kBalanced}) {
      sched.set_policy(p);
      const Plan plan = sched.plan(SendWork{src, per_rank, rows, row_bytes});
      std::vector<int64_t> covered(units, 0);
      std::vector<std::tuple<int64_t, int64_t, int64_t, int>> got;
      for (int w = 0; w < plan.workers; ++w)
        for (const PlanItem& it : plan.worker_items(w)) {
          const auto u = static_cast<size_t>(it.expert >= 0 ? it.expert : it.dest_rank);
          covered[u] += it.rows();
          EXPECT_GE(it.rows(), std::min(rows[u], floor_rows)) << policy_name(p);
          got.emplace_back(static_cast<int64_t>(u), it.row_begin, it.row_end, w);
        }
      EXPECT_EQ(covered, rows) << policy_name(p);
      if (p == Policy::kColumnMajor && floor_rows == 1) {
        std::sort(got.begin(), got.end());
        EXPECT_EQ(got, per_row_reference(rows, opt.workers));
      }
    }
  }
}

TEST(Pieces, NegativeFloorNamesTheValue) {
  SchedulerOptions opt{4, Policy::kColumnMajor};
  opt.min_piece_bytes = -3;
  test::expect_invalid([&] { Scheduler(hosts_by_ranks(1, 2), opt); }, {"min_piece_bytes", "-3"});
}

}  // namespace
}  // namespace ubep::sched
