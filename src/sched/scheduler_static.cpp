// The static policies of the hop-aware scheduler (naive and column-major; ubep/scheduler.hpp) and
// the piece floor that column-major's and balanced's slices respect: at least min_piece_bytes
// (per-piece fixed costs), but never so large that a worker's share of the call's rows makes
// fewer than kMinPiecesPerWorker pieces (a worker's last piece lands, and is consumed, at its
// end: the receiver's pipeline drains for one piece, so a piece stays a small part of a worker's
// work).
#include <algorithm>
#include <utility>

#include "ubep/scheduler.hpp"

namespace ubep::sched {

void Scheduler::set_piece_floor() {
  int64_t total = 0;
  for (const Unit& u : units_) total += u.rows;
  const int64_t by_bytes = (options_.min_piece_bytes + row_bytes_ - 1) / row_bytes_;  // ceil
  const int64_t by_share = total / (static_cast<int64_t>(options_.workers) * kMinPiecesPerWorker);
  min_piece_rows_ = std::max<int64_t>(1, std::min(by_bytes, by_share));
}

int64_t Scheduler::max_pieces(int64_t rows) const {
  return std::max<int64_t>(1, rows / min_piece_rows_);
}

// CANN-EP-like: the unit id space [0, U) (every destination or expert, empty or not, as a
// static kernel sees it) is cut into W contiguous runs; each unit goes whole to its run's
// worker. A worker thus serves a few neighbouring ranks: all near or all far, and all of a hot
// expert's rows.
void Scheduler::plan_naive() {
  const int64_t W = options_.workers;
  const int64_t U = static_cast<int64_t>(topology_.ranks()) * std::max(units_per_rank_, 1);
  pieces_.clear();
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& u = units_[i];
    pieces_.push_back({static_cast<int32_t>(i), static_cast<int32_t>(u.index * W / U), 0, u.rows,
                       issue_ns(u, u.rows)});
  }
}

// UBEP's (worker x expert) remap, column-major: worker w takes slice w of the token sequence
// for every destination, instead of every token for a run of destinations. The scheduler sees
// counts, not token ids, so a unit's n rows stand for rows spread evenly over the sequence:
// slice s holds rows [n*s/W, n*(s+1)/W), rotated by the unit id (slice s of unit u -> worker
// (s + u) mod W) so that the remainders do not all fall on the first workers. A unit with too
// few rows for W slices of the piece floor is cut into the k pieces it fills: piece j holds rows
// [n j / k, n (j + 1) / k), the rows of W-slices up to ceil((j + 1) W / k) - 1, and goes to the
// worker of that last slice (with k = n, one row per piece, this is each row's own slice: the
// plans without a floor). Measured in ubep-sim (cm384 EP64, docs/SCHEDULING.md): giving such
// pieces to the least-loaded worker instead balanced the rows better but ran up to 22% slower
// (BS 256 dispatch), the rotation spreading a unit's pieces over the workers as the slices do.
void Scheduler::plan_column_major() {
  const int64_t W = options_.workers;
  pieces_.clear();
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& u = units_[i];
    auto add = [&](int64_t s, int64_t b, int64_t e) {
      pieces_.push_back({static_cast<int32_t>(i), static_cast<int32_t>((s + u.index) % W), b, e,
                         issue_ns(u, e - b)});
    };
    const int64_t k = std::min(W, max_pieces(u.rows));
    if (k == W) {
      for (int64_t s = 0; s < W; ++s) add(s, u.rows * s / W, u.rows * (s + 1) / W);
    } else {
      // O(k) per unit, not O(W): only the last W-slice of each piece is visited.
      for (int64_t j = 0; j < k; ++j)
        add(((j + 1) * W + k - 1) / k - 1, u.rows * j / k, u.rows * (j + 1) / k);
    }
  }
}

}  // namespace ubep::sched
