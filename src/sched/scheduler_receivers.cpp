// Receiver term of the hop-aware scheduler's cost model (issue 30; the model is described in
// ubep/scheduler.hpp): which destinations' receiving ports cannot keep up with this source, and
// how long their traffic holds a worker.
#include <algorithm>

#include "ubep/error.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::sched {

void Scheduler::collect_receivers(const SendWork& work) {
  const auto ranks = static_cast<size_t>(topology_.ranks());
  for (int32_t d : bound_dests_) floor_ns_[static_cast<size_t>(d)] = 0;
  bound_dests_.clear();
  any_bound_ = false;
  max_floor_ns_ = 0;
  floor_ns_.resize(ranks, 0.0);
  if (work.recv_rows.empty()) return;
  UBEP_CHECK_ARG(work.recv_rows.size() == ranks, "scheduler: recv_rows has ", work.recv_rows.size(),
                 " entries, expected one per rank (", ranks, ")");
  own_bytes_.assign(ranks, 0.0);
  double total = 0;
  for (const Unit& u : units_) {
    own_bytes_[static_cast<size_t>(u.dest_rank)] +=
        static_cast<double>(u.rows) * static_cast<double>(row_bytes_);
    total += issue_ns(u, u.rows);
  }
  const double send_ns = total / options_.workers;  // this source's own time, perfectly spread
  group_ns_.resize(ranks, 0.0);
  for (size_t d = 0; d < ranks; ++d) {
    const int64_t n = work.recv_rows[d];
    UBEP_CHECK_ARG(
        n >= 0 && static_cast<double>(n) * static_cast<double>(row_bytes_) >= own_bytes_[d],
        "scheduler: recv_rows[", d, "] = ", n, " is below the ",
        own_bytes_[d] / static_cast<double>(row_bytes_), " rows this source sends there");
    const int level = topology_.level_between(src_rank_, static_cast<int>(d));
    if (level == 0 || own_bytes_[d] <= 0) continue;
    const double bw = topology_.levels()[static_cast<size_t>(level)].bandwidth_gbps;
    const double floor = static_cast<double>(n) * static_cast<double>(row_bytes_) / bw;
    if (floor <= kReceiverMargin * send_ns) continue;
    floor_ns_[d] = floor;
    group_ns_[d] = std::max(floor, own_bytes_[d] * options_.workers / bw);
    bound_dests_.push_back(static_cast<int32_t>(d));
    max_floor_ns_ =
        std::max(max_floor_ns_, floor + topology_.levels()[static_cast<size_t>(level)].latency_ns);
    any_bound_ = true;
  }
  group_worker_.resize(ranks, -1);
}

double Scheduler::piece_ns(const Piece& p) const {
  const Unit& u = units_[static_cast<size_t>(p.unit)];
  if (!any_bound_ || !bound(u)) return p.issue_ns;
  const auto d = static_cast<size_t>(u.dest_rank);
  const double bytes =
      static_cast<double>(p.row_end - p.row_begin) * static_cast<double>(row_bytes_);
  return std::max(p.issue_ns, floor_ns_[d] * bytes / own_bytes_[d]);
}

}  // namespace ubep::sched
