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
#include "ep/host_engine.hpp"
#include "ep/relay.hpp"

namespace ubep::ep {

namespace {

// [begin, end) of member m's share of n items split into `members` equal slices.
inline void slice(int64_t n, int m, int members, int64_t* begin, int64_t* end) {
  *begin = n * m / members;
  *end = n * (m + 1) / members;
}

// Waits until the count records of sources [from, upto) are at `dest` (on the caller's thread
// the cross-host relay keeps running meanwhile, so proxied records can appear).
void wait_counts(HostEngine& b, int dest, int upto, bool caller, int from = 0) {
  for (int s = from; s < upto; ++s)
    b.wait_for([&] { return b.win.count_arrived(dest, s); }, caller,
               [&] {
                 return detail::concat("count record of rank ", s, " at rank ", dest,
                                       " (epoch tag ", b.win.tag(), ")");
               });
}

class Ubep final : public Algorithm {
 public:
  explicit Ubep(HostEngine& b) : b_(b) {}
  bool split_phase() const override { return true; }
  void dispatch_send(const DispatchArgs& a) override;
  void dispatch_recv() override;
  std::array<int64_t, 2> wait_recv_range(int s, int e) override;
  void combine_send(const CombineArgs& a) override;
  void combine_recv() override;

 private:
  HostEngine& b_;
};

void Ubep::dispatch_send(const DispatchArgs& /*a: read through call.source*/) {
  HostEngine& b = b_;
  CallState& call = b.call;
  const Routing& routing = call.routing;
  StageTimer timer(b.stats);
  const int members = b.dp->members();
  // The offset role (member 0, one writer) signals the other senders that the offsets for a
  // destination are computed (CallState::signal_offsets: release/acquire, rank-local).
  const uint64_t signal = call.next_send_generation();
  if (b.scheduler) {
    // Plan (destination, row slice) items per worker for this call's routing; cross-host rows
    // go through the relay and are not part of the workers' plan.
    for (int d = 0; d < b.ranks; ++d)
      b.plan_rows[static_cast<size_t>(d)] =
          b.same_host(d) ? routing.dest_rows[static_cast<size_t>(d)] : 0;
    b.scheduler->plan({b.rank, 0, b.plan_rows, static_cast<int64_t>(b.row_bytes())}, b.plan);
  }
  auto wait_offsets = [&](int d) {
    wait_until([&] { return call.offsets_signalled(d, signal); }, b.wait,
               [&] { return detail::concat("offsets for rank ", d); });
  };
  b.dp->run_roles([&](int m) {
    if (m == 0) {
      if (b.relay) b.relay->start_dispatch();  // remote hosts first: their data has furthest to go
      for (int k = 1; k <= b.ranks; ++k) {
        const int d = (b.rank + k) % b.ranks;
        if (!b.same_host(d)) continue;
        b.win.publish_count(d, b.rank, routing.dest_rows[static_cast<size_t>(d)], routing.topk,
                            call.shape(),
                            &routing.dest_expert_rows[static_cast<size_t>(d * b.local_experts)]);
      }
    }
    if (b.scheduler) {
      if (m == 0) {
        for (int k = 1; k <= b.ranks; ++k) {
          const int d = (b.rank + k) % b.ranks;
          if (!b.same_host(d)) continue;
          if (call.offsets_need_counts()) wait_counts(b, d, b.rank, true);
          call.compute_offsets(b.win, d);
          call.signal_offsets(d, signal);
        }
      }
      for (const sched::PlanItem& item : b.plan.worker_items(m)) {
        wait_offsets(item.dest_rank);
        for (int64_t i = item.row_begin; i < item.row_end; ++i)
          call.send_rows(b.win, item.dest_rank, i, [&](Tag* t) { b.win.complete(t); });
      }
      return;
    }
    // Destinations in rotated order, starting after ourselves, so senders spread over receivers.
    for (int k = 1; k <= b.ranks; ++k) {
      const int d = (b.rank + k) % b.ranks;
      if (!b.same_host(d)) continue;  // reached through the relay
      if (m == 0) {
        if (call.offsets_need_counts()) wait_counts(b, d, b.rank, true);
        call.compute_offsets(b.win, d);
        call.signal_offsets(d, signal);
      } else {
        wait_offsets(d);
      }
      int64_t i0, i1;
      slice(routing.dest_rows[static_cast<size_t>(d)], m, members, &i0, &i1);
      for (int64_t i = i0; i < i1; ++i)
        call.send_rows(b.win, d, i, [&](Tag* t) { b.win.complete(t); });
    }
  });
  // Across hosts, leave only once the messages this rank relays have arrived and their count
  // records are written: that depends only on the other ranks' sends, and keeps the transport
  // progressing while a split-phase caller computes (the relay is idle between the phases).
  if (b.relay)
    b.wait_for([&] { return b.relay->counts_forwarded(); }, true,
               [] { return std::string("relayed messages"); });
  timer.lap("send");
}

void Ubep::dispatch_recv() {
  HostEngine& b = b_;
  const double send_us = b.stats.stage_us.empty() ? 0.0 : b.stats.stage_us.back().second;
  StageTimer timer(b.stats);
  wait_counts(b, b.rank, b.ranks, true);
  b.call.receive_counts(b.win);
  timer.lap("counts + prefix sum");
  b.call.for_each_expected_row(b.win, [&](const Tag* tag, int64_t row) {
    b.wait_for(
        [&] { return b.win.arrived(tag); }, true,
        [&] { return detail::concat("dispatch row ", row, " (epoch tag ", b.win.tag(), ")"); });
  });
  // A relay leaves only when what it relays is forwarded and its own sends are done.
  if (b.relay)
    b.wait_for([&] { return b.relay->progress(); }, true,
               [] { return std::string("relay forwarding"); });
  b.stats.stage_us.insert(b.stats.stage_us.begin(), {"send", send_us});
  timer.lap("receive");
}

// The receive hook: only the count records the range depends on (source s's alone with
// per-source placement) and the range's own rows are waited for, so a late rank delays only
// the ranges it sends. dispatch_recv later waits for the rest (rows already seen return at once).
std::array<int64_t, 2> Ubep::wait_recv_range(int s, int e) {
  HostEngine& b = b_;
  wait_counts(b, b.rank, s + 1, true, b.call.first_range_source(s));
  const std::array<int64_t, 2> range = b.call.range_from_counts(b.win, e, s);
  const bool latency = b.call.layout == Layout::kLatency;
  const Tag* tags = b.win.at<Tag>(b.rank, latency ? b.win.map().lat_tag : b.win.map().tp_tag) +
                    (latency ? e * b.RT() : 0);
  for (int64_t p = range[0]; p < range[0] + range[1]; ++p)
    b.wait_for([&] { return b.win.arrived(tags + p); }, true,
               [&] {
                 return detail::concat("dispatch row ", p, " from rank ", s, " (epoch tag ",
                                       b.win.tag(), ")");
               });
  return range;
}

void Ubep::combine_send(const CombineArgs& a) {
  HostEngine& b = b_;
  StageTimer timer(b.stats);
  const int members = b.dp->members();
  char* comb = b.win.at<char>(b.rank, b.win.map().comb_x);
  Tag* tags = b.win.at<Tag>(b.rank, b.win.map().comb_tag);
  const bool zero_copy = a.x.data == comb && !a.compacted;
  b.dp->run_roles([&](int m) {
    b.call.for_each_output_row(m, members, [&](int64_t row, int64_t packed) {
      const int64_t from = a.compacted ? packed : row;
      if (!zero_copy)  // plain stores: the owners read these rows right away
        b.win.put_row(
            comb + static_cast<size_t>(row) * b.row_bytes(),
            static_cast<const char*>(a.x.data) + static_cast<size_t>(from) * b.row_bytes(), false);
      b.win.complete(tags + row);
    });
  });
  if (b.relay) b.relay->start_combine();
  timer.lap("send");
}

void Ubep::combine_recv() {
  HostEngine& b = b_;
  const CallState& call = b.call;
  const Routing& routing = call.routing;
  const int members = b.dp->members();
  const double send_us = b.stats.stage_us.empty() ? 0.0 : b.stats.stage_us.back().second;
  StageTimer timer(b.stats);
  const int El = b.local_experts;
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
      pos = (e % El) * b.RT() + call.expert_offset_at[static_cast<size_t>(r * El + e % El)] +
            routing.expert_slot[tk];
    }
    const Tag* tag = b.win.at<Tag>(r, b.win.map().comb_tag) + pos;
    b.wait_for([&] { return b.win.arrived(tag); }, caller,
               [&] {
                 return detail::concat("combine row of token ", tok, " at rank ", r, " (epoch tag ",
                                       b.win.tag(), ")");
               });
    return b.win.at<char>(r, b.win.map().comb_x) + static_cast<size_t>(pos) * b.row_bytes();
  };
  if (b.relay) {
    // Across hosts the caller's thread alone drives the transport, so it reduces alone too.
    for (int64_t t = 0; t < routing.num_tokens; ++t)
      b.reduce_token(t, b.acc.data(), [&](int64_t tok, int j) { return locate(tok, j, true); });
    b.wait_for([&] { return b.relay->combine_done(); }, true,
               [] { return std::string("relay partials"); });
  } else {
    b.dp->run_roles([&](int m) {
      float* acc = &b.acc[static_cast<size_t>(m) * static_cast<size_t>(b.cfg.hidden)];
      int64_t t0, t1;
      slice(routing.num_tokens, m, members, &t0, &t1);
      for (int64_t t = t0; t < t1; ++t)
        b.reduce_token(t, acc, [&](int64_t tok, int j) { return locate(tok, j, false); });
    });
  }
  b.stats.stage_us.insert(b.stats.stage_us.begin(), {"send", send_us});
  timer.lap("receive + reduce");
}

}  // namespace

std::unique_ptr<Algorithm> make_ubep(HostEngine& b) { return std::make_unique<Ubep>(b); }

}  // namespace ubep::ep
