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
  units_to_.assign(ranks, 0);
  double total = 0;
  for (const Unit& u : units_) {
    ++units_to_[static_cast<size_t>(u.dest_rank)];
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

// A port shares its bandwidth max-min fairly per flow (per concurrent transfer), not per source
// in proportion to its bytes, as the envelope assumes. A source whose units to d are each sent by
// their own worker keeps as many flows into d as it has units there (column-major cuts them
// further); a plan that puts several of them on one worker sends them one after another, one
// flow, and its share of d's port shrinks with it. Measured in ubep-sim (EP64, 32 hot experts at
// weight 2, four experts per rank): one source whose balanced plan put each hot rank's four
// expert units on one worker (the grouped LPT candidate), while every other source ran
// column-major, made the call 0.9% slower than all-column-major (64.80 vs 64.25 us) although the
// envelope put that plan 6% ahead; its last bytes reached the hot ports after the others had
// drained. At EP256 (one expert per rank) grouping serialises nothing and won 6.7%. So a plan
// with f_d flows (distinct workers) to d and u_d units there gets min(1, f_d / u_d) of the
// envelope's slope. count_flows needs pieces_ grouped by worker (candidate_span and emit order
// them so before the fluid model runs).
// That ratio compares this source with peers that keep a flow per unit, which is what
// column-major and balanced (which mostly keeps column-major) leave them. Naive is one policy
// every rank runs on statistically the same work, and it serialises a rank's units on one or two
// workers at every source alike, so the peers' flows into d shrink with this source's and its
// share is the proportional one: the ratio is 1. Before, naive plans were put at 3.2-3.8x their
// simulated EP64 hot-point dispatch (EXPERIMENTS.md section 3). Column-major keeps the ratio, so
// balanced compares its candidates and column-major's plan under the same assumption (balanced
// never above column-major, test_plan_sharing).
void Scheduler::count_flows(std::vector<int32_t>& out) const {
  const auto ranks = static_cast<size_t>(topology_.ranks());
  out.assign(ranks, 0);
  std::vector<int32_t> last(ranks, -1);
  for (const Piece& p : pieces_) {
    const auto d = static_cast<size_t>(units_[static_cast<size_t>(p.unit)].dest_rank);
    if (last[d] == p.worker) continue;
    last[d] = p.worker;
    ++out[d];
  }
}

void Scheduler::set_flow_share() {
  flow_share_.assign(static_cast<size_t>(topology_.ranks()), 1.0);
  if (options_.policy == Policy::kNaive) return;  // every peer serialises alike
  count_flows(flows_);
  for (int32_t d : bound_dests_) {
    const auto i = static_cast<size_t>(d);
    if (units_to_[i] > flows_[i] && flows_[i] > 0)
      flow_share_[i] = static_cast<double>(flows_[i]) / units_to_[i];
  }
}

}  // namespace ubep::sched
