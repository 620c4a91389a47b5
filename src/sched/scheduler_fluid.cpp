// Work-conserving links in the hop-aware scheduler's cost model (issue 30; SchedulerOptions::
// worker_gbps). The fixed 1/W shares charge a worker that holds a few more rows than the others
// its whole excess at 1/W of the link, while on a real port the other workers finish and the
// link serves the straggler at up to its own engine's rate. Under those shares column-major's
// uneven row counts (a unit's rows fall on workers by the rotation, not by load) looked up to
// 20% worse than LPT packings that ubep-sim ran 1-6% slower (EXPERIMENTS.md section 3).
#include <algorithm>

#include "fluid.hpp"
#include "ubep/error.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::sched {

void Scheduler::init_fluid_links() {
  UBEP_CHECK_ARG(options_.worker_gbps >= 0, "scheduler: worker_gbps must be >= 0 (0 = fixed ",
                 "shares), got ", options_.worker_gbps);
  UBEP_CHECK_ARG(options_.consume_row_ns >= 0, "scheduler: consume_row_ns must be >= 0, got ",
                 options_.consume_row_ns);
  const int L = topology_.num_levels();
  const auto& map = options_.link_of_level;
  UBEP_CHECK_ARG(map.empty() || static_cast<int>(map.size()) == L, "scheduler: link_of_level has ",
                 map.size(), " entries, expected one per level (", L, ") or none");
  // Link 0 is level 0's; level l >= 1 uses link 1 + link_of_level[l] (or its own, l).
  fluid_links_.assign(1, topology_.level(0).bandwidth_gbps);
  for (int l = 1; l < L; ++l) {
    const int link = map.empty() ? l : 1 + map[static_cast<size_t>(l)];
    UBEP_CHECK_ARG(link >= 1 && link <= L, "scheduler: link_of_level[", l, "] = ", link - 1,
                   " is out of range [0, ", L, ")");
    if (static_cast<size_t>(link) >= fluid_links_.size())
      fluid_links_.resize(static_cast<size_t>(link) + 1, 0.0);
    auto& bw = fluid_links_[static_cast<size_t>(link)];
    bw = std::max(bw, topology_.level(l).bandwidth_gbps);
  }
  // A link no level uses keeps a positive bandwidth for fluid_finish's argument check.
  for (double& bw : fluid_links_)
    if (bw <= 0) bw = 1;
}

double Scheduler::fluid_span(bool credit) {
  const auto W = static_cast<size_t>(options_.workers);
  const auto& map = options_.link_of_level;
  std::vector<detail::FluidItem> items(pieces_.size());
  std::vector<detail::FluidGroup> groups;
  if (any_bound_) set_flow_share();
  if (any_bound_ && credit) {
    group_of_.assign(static_cast<size_t>(topology_.ranks()), -1);
    for (int32_t d : bound_dests_) {
      group_of_[static_cast<size_t>(d)] = static_cast<int32_t>(groups.size());
      groups.push_back({own_bytes_[static_cast<size_t>(d)],
                        floor_ns_[static_cast<size_t>(d)] / flow_share_[static_cast<size_t>(d)]});
    }
  }
  fluid_begin_.assign(W + 1, 0);
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    const Unit& u = units_[static_cast<size_t>(p.unit)];
    const auto lv = static_cast<size_t>(u.level);
    detail::FluidItem& it = items[i];
    it.link = lv == 0 ? 0 : (map.empty() ? u.level : 1 + map[lv]);
    it.latency_ns = topology_.levels()[lv].latency_ns +
                    static_cast<double>(p.row_end - p.row_begin) * options_.consume_row_ns;
    it.bytes = static_cast<double>(p.row_end - p.row_begin) * static_cast<double>(row_bytes_);
    // A receiver-bound destination delivers this source's bytes no faster than the envelope
    // own_d * t / floor_d, shared by all of this source's workers sending there (fluid.hpp).
    // Without credit (the bound from below on what the port lends): each item at most own_d /
    // floor_d, as if this source's items to d crossed its port one after another.
    if (any_bound_ && bound(u)) {
      const auto d = static_cast<size_t>(u.dest_rank);
      if (credit)
        it.group = group_of_[d];
      else
        it.cap_gbps = own_bytes_[d] * flow_share_[d] / floor_ns_[d];
    }
    ++fluid_begin_[static_cast<size_t>(p.worker) + 1];
  }
  for (size_t w = 0; w < W; ++w) fluid_begin_[w + 1] += fluid_begin_[w];
  fluid_finish_.assign(W, 0.0);
  detail::fluid_finish(items, fluid_begin_, fluid_links_, options_.worker_gbps, fluid_finish_,
                       groups);
  return std::max(max_floor_ns_, *std::max_element(fluid_finish_.begin(), fluid_finish_.end()));
}

double Scheduler::candidate_span(bool receivers_first, bool far_first) {
  if (!fluid()) return makespan(receivers_first);
  order_pieces(far_first, receivers_first);
  no_credit_span_ = any_bound_ ? fluid_span(false) : 0;
  return fluid_span(true);
}

}  // namespace ubep::sched
