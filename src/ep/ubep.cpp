// The ubep algorithm: decomposed, barrier-free dispatch and combine.
//
// Roles, run concurrently by the rank's WorkerTeam (member 0 is the caller):
//  * count sender (member 0): one count record to every destination first -- counts travel with
//    the data, never in a round of their own;
//  * offset role (member 0): for each destination, waits for the count records of the lower
//    ranks there and computes where this rank's rows go, then raises a point-to-point signal
//    (offsets_ready) for that destination -- the one real dependency, no barrier;
//  * token senders (all members): write their slice of each destination's rows straight into
//    the final place of the receiver's output (one copy) and complete each with its epoch tag;
//  * receiver (member 0 of the receiving rank): waits for the count records, computes the
//    per-expert counts (prefix sum), then waits for every expected row's tag. Nothing is copied
//    on the receive side: the reorder of the staged design is done by the senders' placement.
// Combine: the expert side marks each row of its combine input complete (tag per row; zero-copy
// when the experts wrote into combine_buffer()); each owner reads the rows of its tokens in place
// from the expert ranks and reduces them in the fixed order (ascending rank or ascending k).
//
// Why no buffer is ever cleaned and a fast rank can never overwrite what a slow rank reads:
// call n uses half n%2 of every window. A rank S writes into R's half n%2 during call n only
// after finishing call n-1, whose dispatch waited for R's count record of call n-1; R writes that
// record at the start of its call n-1, after R finished every use of call n-2 -- the last call
// that used half n%2 (R's dispatch outputs and its combine, which S reads in place, included).
// So when S writes R's half n%2, R is done with it; and R's dispatch outputs of call n stay
// intact until R itself starts call n+1. Tags differ between calls of the same half, so stale
// data is never mistaken for new. This needs each rank to finish its calls in order, which the
// Buffer enforces (one outstanding split-phase call, combine only for the last dispatch).

#include "core/stage_timer.hpp"
#include "ep/algo_context.hpp"
#include "ep/algorithm.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::ep {

namespace {

// [begin, end) of member m's share of n items split into `members` equal slices.
inline void slice(int64_t n, int m, int members, int64_t* begin, int64_t* end) {
  *begin = n * m / members;
  *end = n * (m + 1) / members;
}

// Waits until the count records of sources [from, upto) are at `dest` (on the caller's thread
// the cross-host relay keeps running meanwhile, so proxied records can appear).
void wait_counts(const AlgoContext& c, int dest, int upto, bool caller, int from = 0) {
  for (int s = from; s < upto; ++s)
    if (!c.call.masked(s))
      c.waiter.wait_for([&] { return c.win.count_arrived(dest, s); }, caller,
                      [&] {
                        return detail::concat("count record of rank ", s, " at rank ", dest,
                                              " (epoch tag ", c.win.tag(), ")");
                      });
}

// The hop-aware send plan (BufferConfig::schedule): only ubep's senders follow one.
std::unique_ptr<sched::Scheduler> make_scheduler(const AlgoContext& c) {
  const BufferConfig& cfg = c.cfg;
  if (cfg.research.schedule == SendSchedule::kEqualSlices) return nullptr;
  sched::Topology topo = cfg.research.topology.empty() ? sched::discover(c.group)
                                              : sched::parse_topology(cfg.research.topology, c.ranks());
  UBEP_CHECK_ARG(topo.ranks() == c.ranks(), "topology '", cfg.research.topology, "' has ", topo.ranks(),
                 " ranks, the group ", c.ranks());
  const sched::Policy policy = cfg.research.schedule == SendSchedule::kNaive ? sched::Policy::kNaive
                               : cfg.research.schedule == SendSchedule::kColumnMajor
                                   ? sched::Policy::kColumnMajor
                                   : sched::Policy::kBalanced;
  return std::make_unique<sched::Scheduler>(std::move(topo),
                                            sched::SchedulerOptions{c.dp.members(), policy});
}

class Ubep final : public Algorithm {
 public:
  explicit Ubep(const AlgoContext& c) : c_(c), scheduler_(make_scheduler(c)) {
    if (scheduler_) plan_rows_.resize(static_cast<size_t>(c.ranks()));
  }
  bool split_phase() const override { return true; }
  void dispatch_send(const DispatchArgs& a) override;
  void dispatch_recv() override;
  std::array<int64_t, 2> wait_recv_range(int s, int e) override;
  void combine_send(const CombineArgs& a) override;
  void combine_recv() override;

 private:
  AlgoContext c_;
  std::unique_ptr<sched::Scheduler> scheduler_;  // when cfg.research.schedule plans the send work
  sched::Plan plan_;
  std::vector<int64_t> plan_rows_;  // [R] rows per destination handed to the scheduler
};

void Ubep::dispatch_send(const DispatchArgs& /*a: read through call.source*/) {
  const AlgoContext& c = c_;
  CallState& call = c.call;
  const Routing& routing = call.routing;
  StageTimer timer(c.stats);
  const int members = c.dp.members();
  // The offset role (member 0, one writer) signals the other senders that the offsets for a
  // destination are computed (CallState::signal_offsets: release/acquire, rank-local).
  const uint64_t signal = call.next_send_generation();
  if (scheduler_) {
    // Plan (destination, row slice) items per worker for this call's routing; cross-host rows
    // go through the relay and are not part of the workers' plan.
    for (int d = 0; d < c.ranks(); ++d)
      plan_rows_[static_cast<size_t>(d)] =
          c.same_host(d) ? routing.dest_rows[static_cast<size_t>(d)] : 0;
    scheduler_->plan({c.rank(), 0, plan_rows_, static_cast<int64_t>(c.row_bytes())}, plan_);
  }
  auto wait_offsets = [&](int d) {
    wait_until([&] { return call.offsets_signalled(d, signal); }, c.waiter.policy(),
               [&] { return detail::concat("offsets for rank ", d); });
  };
  c.dp.run_roles([&](int m) {
    if (m == 0) {
      if (c.relay) c.relay->start_dispatch();  // remote hosts first: their data has furthest to go
      for (int k = 1; k <= c.ranks(); ++k) {
        const int d = (c.rank() + k) % c.ranks();
        if (!c.reach(d)) continue;
        c.win.publish_count(d, c.rank(), routing.dest_rows[static_cast<size_t>(d)], routing.topk,
                            call.shape(),
                            &routing.dest_expert_rows[static_cast<size_t>(d * c.local_experts())]);
      }
    }
    if (scheduler_) {
      if (m == 0) {
        for (int k = 1; k <= c.ranks(); ++k) {
          const int d = (c.rank() + k) % c.ranks();
          if (!c.reach(d)) continue;
          if (call.offsets_need_counts()) wait_counts(c, d, c.rank(), true);
          call.compute_offsets(c.win, d);
          call.signal_offsets(d, signal);
        }
      }
      for (const sched::PlanItem& item : plan_.worker_items(m)) {
        wait_offsets(item.dest_rank);
        for (int64_t i = item.row_begin; i < item.row_end; ++i)
          call.send_rows(c.win, item.dest_rank, i, [&](Tag* t) { c.win.complete(t); });
      }
      return;
    }
    // Destinations in rotated order, starting after ourselves, so senders spread over receivers.
    for (int k = 1; k <= c.ranks(); ++k) {
      const int d = (c.rank() + k) % c.ranks();
      if (!c.reach(d)) continue;  // reached through the relay
      if (m == 0) {
        if (call.offsets_need_counts()) wait_counts(c, d, c.rank(), true);
        call.compute_offsets(c.win, d);
        call.signal_offsets(d, signal);
      } else {
        wait_offsets(d);
      }
      int64_t i0, i1;
      slice(routing.dest_rows[static_cast<size_t>(d)], m, members, &i0, &i1);
      for (int64_t i = i0; i < i1; ++i)
        call.send_rows(c.win, d, i, [&](Tag* t) { c.win.complete(t); });
    }
  });
  // Across hosts, leave only once the messages this rank relays have arrived and their count
  // records are written: that depends only on the other ranks' sends, and keeps the transport
  // progressing while a split-phase caller computes (the relay is idle between the phases).
  if (c.relay)
    c.waiter.wait_for([&] { return c.relay->counts_forwarded(); }, true,
                      [] { return std::string("relayed messages"); });
  timer.lap("send");
}

void Ubep::dispatch_recv() {
  const AlgoContext& c = c_;
  const double send_us = c.stats.stage_us.empty() ? 0.0 : c.stats.stage_us.back().second;
  StageTimer timer(c.stats);
  wait_counts(c, c.rank(), c.ranks(), true);
  c.call.receive_counts(c.win);
  timer.lap("counts + prefix sum");
  // A peer made a different call (layout or placement): its rows, and with compact placement
  // the offsets of every rank above it, follow another arithmetic, so rows this rank expects
  // may never come. Wait for none; HostEngine names the peer (InvalidArgument) once this phase
  // returns, without breaking the buffer. Every rank publishes its count records first, so
  // every rank of the call sees the difference at once. Safe to leave rows of this call
  // unread, or still in flight: they all land in half n%2 (in bounds: a count record never
  // exceeds T rows per source), which no rank reuses before call n+2, and this rank starts
  // call n+2 only after call n+1's dispatch saw every peer's count record of call n+1 --
  // published after that peer's call-n sends were done. Call n's epoch tag differs from call
  // n+2's, so nothing of it is taken for new data (the argument at the top of this file).
  if (c.call.shape_mismatch() >= 0) {
    if (c.relay)
      c.waiter.wait_for([&] { return c.relay->progress(); }, true,
                        [] { return std::string("relay forwarding"); });
    return;
  }
  c.call.for_each_expected_row(c.win, [&](const Tag* tag, int64_t row) {
    c.waiter.wait_for(
        [&] { return c.win.arrived(tag); }, true,
        [&] { return detail::concat("dispatch row ", row, " (epoch tag ", c.win.tag(), ")"); });
  });
  // A relay leaves only when what it relays is forwarded and its own sends are done.
  if (c.relay)
    c.waiter.wait_for([&] { return c.relay->progress(); }, true,
                      [] { return std::string("relay forwarding"); });
  c.stats.stage_us.insert(c.stats.stage_us.begin(), {"send", send_us});
  timer.lap("receive");
}

// The receive hook: only the count records the range depends on (source s's alone with
// per-source placement) and the range's own rows are waited for, so a late rank delays only
// the ranges it sends. dispatch_recv later waits for the rest (rows already seen return at once).
std::array<int64_t, 2> Ubep::wait_recv_range(int s, int e) {
  const AlgoContext& c = c_;
  wait_counts(c, c.rank(), s + 1, true, c.call.first_range_source(s));
  const std::array<int64_t, 2> range = c.call.range_from_counts(c.win, e, s);
  const bool latency = c.call.layout == Layout::kLatency;
  const Tag* tags = c.win.at<Tag>(c.rank(), latency ? c.win.map().lat_tag : c.win.map().tp_tag) +
                    (latency ? e * c.call.RT() : 0);
  for (int64_t p = range[0]; p < range[0] + range[1]; ++p)
    c.waiter.wait_for([&] { return c.win.arrived(tags + p); }, true,
                      [&] {
                        return detail::concat("dispatch row ", p, " from rank ", s, " (epoch tag ",
                                              c.win.tag(), ")");
                      });
  return range;
}

void Ubep::combine_send(const CombineArgs& a) {
  const AlgoContext& c = c_;
  StageTimer timer(c.stats);
  const int members = c.dp.members();
  char* comb = c.win.at<char>(c.rank(), c.win.map().comb_x);
  Tag* tags = c.win.at<Tag>(c.rank(), c.win.map().comb_tag);
  const bool zero_copy = a.x.data == comb && !a.compacted;
  c.dp.run_roles([&](int m) {
    c.call.for_each_output_row(m, members, [&](int64_t row, int64_t packed) {
      const int64_t from = a.compacted ? packed : row;
      if (!zero_copy)  // plain stores: the owners read these rows right away
        c.win.put_row(
            comb + static_cast<size_t>(row) * c.row_bytes(),
            static_cast<const char*>(a.x.data) + static_cast<size_t>(from) * c.row_bytes(), false);
      c.win.complete(tags + row);
    });
  });
  if (c.relay) c.relay->start_combine();
  timer.lap("send");
}

void Ubep::combine_recv() {
  const AlgoContext& c = c_;
  const CallState& call = c.call;
  const Routing& routing = call.routing;
  const int members = c.dp.members();
  const double send_us = c.stats.stage_us.empty() ? 0.0 : c.stats.stage_us.back().second;
  StageTimer timer(c.stats);
  const int El = c.local_experts();
  auto locate = [&](int64_t tok, int j, bool caller) -> const char* {
    int r;
    int64_t pos;
    if (call.layout == Layout::kThroughput) {
      r = j;
      pos = call.row_offset_at[static_cast<size_t>(r)] + routing.slot_at(tok, r);
    } else {
      const size_t tk = static_cast<size_t>(tok * routing.topk + j);
      const int e = routing.topk_idx[tk];
      r = e / El;
      pos = (e % El) * c.call.RT() + call.expert_offset_at[static_cast<size_t>(r * El + e % El)] +
            routing.expert_slot[tk];
    }
    const Tag* tag = c.win.at<Tag>(r, c.win.map().comb_tag) + pos;
    c.waiter.wait_for([&] { return c.win.arrived(tag); }, caller,
                      [&] {
                        return detail::concat("combine row of token ", tok, " at rank ", r,
                                              " (epoch tag ", c.win.tag(), ")");
                      });
    return c.win.at<char>(r, c.win.map().comb_x) + static_cast<size_t>(pos) * c.row_bytes();
  };
  if (c.relay) {
    // Across hosts the caller's thread alone drives the transport, so it reduces alone too.
    for (int64_t t = 0; t < routing.num_tokens; ++t)
      c.reducer.reduce(t, c.reducer.acc(0),
                       [&](int64_t tok, int j) { return locate(tok, j, true); });
    c.waiter.wait_for([&] { return c.relay->combine_done(); }, true,
                      [] { return std::string("relay partials"); });
  } else {
    c.dp.run_roles([&](int m) {
      float* acc = c.reducer.acc(m);
      int64_t t0, t1;
      slice(routing.num_tokens, m, members, &t0, &t1);
      for (int64_t t = t0; t < t1; ++t)
        c.reducer.reduce(t, acc, [&](int64_t tok, int j) { return locate(tok, j, false); });
    });
  }
  c.stats.stage_us.insert(c.stats.stage_us.begin(), {"send", send_us});
  timer.lap("receive + reduce");
}

}  // namespace

std::unique_ptr<Algorithm> make_ubep(const AlgoContext& c) { return std::make_unique<Ubep>(c); }

}  // namespace ubep::ep
