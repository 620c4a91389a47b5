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
#include "ep/exchange_context.hpp"
#include "ep/token_exchange.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::ep {

namespace {

// [begin, end) of `member`'s share of `items` split into `members` equal slices.
inline void slice(int64_t items, int member, int members, int64_t* begin, int64_t* end) {
  *begin = items * member / members;
  *end = items * (member + 1) / members;
}

// Waits until the count records of sources [from, upto) are at `dest` (on the caller's thread
// the cross-host relay keeps running meanwhile, so proxied records can appear).
void wait_counts(const ExchangeContext& ctx, const DispatchCall& call, int dest, int upto,
                 bool caller, int from = 0) {
  for (int source = from; source < upto; ++source)
    if (!call.masked(source))
      ctx.waiter.wait_for([&] { return ctx.win.count_arrived(dest, source); }, caller,
                          [&] {
                            return detail::concat("count record of rank ", source, " at rank ",
                                                  dest, " (epoch tag ", ctx.win.tag(), ")");
                          });
}

// The hop-aware send plan (BufferConfig::schedule): only ubep's senders follow one.
std::unique_ptr<sched::Scheduler> make_scheduler(const ExchangeContext& ctx) {
  const ResearchOptions& research = ctx.cfg.research;
  if (research.schedule == SendSchedule::kEqualSlices) return nullptr;
  sched::Topology topo = research.topology.empty()
                             ? sched::discover(ctx.group)
                             : sched::parse_topology(research.topology, ctx.ranks());
  UBEP_CHECK_ARG(topo.ranks() == ctx.ranks(), "topology '", research.topology, "' has ",
                 topo.ranks(), " ranks, the group ", ctx.ranks());
  const sched::Policy policy = research.schedule == SendSchedule::kNaive ? sched::Policy::kNaive
                               : research.schedule == SendSchedule::kColumnMajor
                                   ? sched::Policy::kColumnMajor
                                   : sched::Policy::kBalanced;
  return std::make_unique<sched::Scheduler>(std::move(topo),
                                            sched::SchedulerOptions{ctx.dp.members(), policy});
}

class Ubep final : public TokenExchange {
 public:
  explicit Ubep(const ExchangeContext& ctx) : ctx_(ctx), scheduler_(make_scheduler(ctx)) {
    if (scheduler_) plan_rows_.resize(static_cast<size_t>(ctx.ranks()));
  }
  bool split_phase() const override { return true; }
  void dispatch_send(DispatchCall& call) override;
  Arrivals dispatch_recv(DispatchCall& call) override;
  std::array<int64_t, 2> wait_recv_range(const DispatchCall& call, int source,
                                         int local_expert) override;
  void combine_send(const CombineCall& call) override;
  TensorView combine_recv(const CombineCall& call) override;

 private:
  // Destinations in rotated order, starting after this rank, so senders spread over receivers;
  // visit(dest) for each one reached through shared memory (the others go through the relay).
  template <typename Visit>
  void for_each_destination(const DispatchCall& call, Visit&& visit) const {
    for (int k = 1; k <= ctx_.ranks(); ++k) {
      const int dest = (ctx_.rank() + k) % ctx_.ranks();
      if (ctx_.reach(call, dest)) visit(dest);
    }
  }
  void publish_counts(const DispatchCall& call) const;
  // The offset role for one destination: computes where this rank's rows go there (after the
  // lower ranks' count records, with compact placement) and signals the token senders.
  void settle_offsets(DispatchCall& call, int dest, uint64_t generation) const;
  void send_planned(DispatchCall& call, int member, uint64_t generation);
  void send_equal_slices(DispatchCall& call, int member, uint64_t generation);
  void wait_offsets(const DispatchCall& call, int dest, uint64_t generation) const;
  // The combine row of `token`'s j-th contribution (throughput: j is the expert rank; latency:
  // j is k), waited for unless !wait: then it is only an address for a prefetch hint, whose
  // bytes nobody reads before a waiting call returns the same row.
  const char* combine_row(const DispatchCall& call, int64_t token, int j, bool caller,
                          bool wait) const;
  // The send phase's stage (time, peer wait), which the receive phase's timer would clear: taken
  // before it starts, put back in front of the receive's stages after.
  struct SendStage {
    double us = 0, wait_us = 0;
  };
  SendStage last_send_stage() const {
    const CallStats& s = ctx_.stats;
    return {s.stage_us.empty() ? 0.0 : s.stage_us.back().second,
            s.stage_wait_us.empty() ? 0.0 : s.stage_wait_us.back()};
  }
  void keep_send_stage(const SendStage& send) const {
    CallStats& s = ctx_.stats;
    s.stage_us.insert(s.stage_us.begin(), {"send", send.us});
    s.stage_wait_us.insert(s.stage_wait_us.begin(), send.wait_us);
  }

  ExchangeContext ctx_;
  std::unique_ptr<sched::Scheduler> scheduler_;  // when cfg.research.schedule plans the send work
  sched::Plan plan_;
  std::vector<int64_t> plan_rows_;  // [R] rows per destination handed to the scheduler
};

void Ubep::publish_counts(const DispatchCall& call) const {
  const Routing& routing = call.routing();
  for_each_destination(call, [&](int dest) {
    ctx_.win.publish_count(
        dest, ctx_.rank(), routing.dest_rows[static_cast<size_t>(dest)], routing.topk, call.shape(),
        &routing.dest_expert_rows[static_cast<size_t>(dest * ctx_.local_experts())]);
  });
}

void Ubep::settle_offsets(DispatchCall& call, int dest, uint64_t generation) const {
  if (call.offsets_need_counts()) wait_counts(ctx_, call, dest, ctx_.rank(), true);
  call.compute_offsets(ctx_.win, dest);
  call.signal_offsets(dest, generation);
}

void Ubep::wait_offsets(const DispatchCall& call, int dest, uint64_t generation) const {
  wait_until([&] { return call.offsets_signalled(dest, generation); }, ctx_.waiter.policy(),
             [&] { return detail::concat("offsets for rank ", dest); });
}

// The scheduler's plan: member 0 settles every destination's offsets first, then every member
// sends its planned (destination, row slice) items.
void Ubep::send_planned(DispatchCall& call, int member, uint64_t generation) {
  if (member == 0)
    for_each_destination(call, [&](int dest) { settle_offsets(call, dest, generation); });
  for (const sched::PlanItem& item : plan_.worker_items(member)) {
    wait_offsets(call, item.dest_rank, generation);
    for (int64_t i = item.row_begin; i < item.row_end; ++i)
      call.send_rows(ctx_.win, item.dest_rank, i, [&](Tag* t) { ctx_.win.complete(t); });
  }
}

// Equal slices (DispatchCall::sends_by_token): of the tokens, each member sending its tokens'
// rows token by token once every destination's offsets are settled; or of each destination's
// rows, member 0 settling a destination's offsets just before its own slice there.
void Ubep::send_equal_slices(DispatchCall& call, int member, uint64_t generation) {
  const int members = ctx_.dp.members();
  const bool by_token = call.sends_by_token();
  for_each_destination(call, [&](int dest) {
    if (member == 0)
      settle_offsets(call, dest, generation);
    else
      wait_offsets(call, dest, generation);
    if (by_token) return;
    int64_t begin, end;
    slice(call.routing().dest_rows[static_cast<size_t>(dest)], member, members, &begin, &end);
    for (int64_t i = begin; i < end; ++i)
      call.send_rows(ctx_.win, dest, i, [&](Tag* t) { ctx_.win.complete(t); });
  });
  if (!by_token) return;
  int64_t begin, end;
  slice(call.routing().num_tokens, member, members, &begin, &end);
  call.send_tokens(
      ctx_.win, begin, end, [&](int dest) { return ctx_.reach(call, dest); },
      [&](Tag* t) { ctx_.win.complete(t); });
}

void Ubep::dispatch_send(DispatchCall& call) {
  StageTimer timer(ctx_.stats, &ctx_.waiter.waited_ns());
  // The offset role (member 0, one writer) signals the other senders that the offsets for a
  // destination are computed (DispatchCall::signal_offsets: release/acquire, rank-local).
  const uint64_t generation = call.next_send_generation();
  if (scheduler_) {
    // Plan (destination, row slice) items per worker for this call's routing; cross-host rows
    // go through the relay and are not part of the workers' plan.
    for (int dest = 0; dest < ctx_.ranks(); ++dest)
      plan_rows_[static_cast<size_t>(dest)] =
          ctx_.same_host(dest) ? call.routing().dest_rows[static_cast<size_t>(dest)] : 0;
    scheduler_->plan({ctx_.rank(), 0, plan_rows_, static_cast<int64_t>(ctx_.row_bytes())}, plan_);
  }
  call.choose_stores(ctx_.win.codec());
  ctx_.dp.run_roles([&](int member) {
    if (member == 0) {
      // Remote hosts first: their data has furthest to go. Then the count records.
      if (ctx_.relay) ctx_.relay->start_dispatch(call);
      publish_counts(call);
    }
    if (scheduler_)
      send_planned(call, member, generation);
    else
      send_equal_slices(call, member, generation);
  });
  // Across hosts, leave only once the messages this rank relays have arrived and their count
  // records are written: that depends only on the other ranks' sends, and keeps the transport
  // progressing while a split-phase caller computes (the relay is idle between the phases).
  if (ctx_.relay)
    ctx_.waiter.wait_for([&] { return ctx_.relay->counts_forwarded(); }, true,
                         [] { return std::string("relayed messages"); });
  timer.lap("send");
  call.sent(timer.last_own_us());
}

Arrivals Ubep::dispatch_recv(DispatchCall& call) {
  const SendStage send = last_send_stage();
  StageTimer timer(ctx_.stats, &ctx_.waiter.waited_ns());
  wait_counts(ctx_, call, ctx_.rank(), ctx_.ranks(), true);
  call.receive_counts(ctx_.win);
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
  if (call.shape_mismatch() < 0) {
    call.for_each_expected_row(ctx_.win, [&](const Tag* tag, int64_t row, int) {
      ctx_.waiter.wait_for([&] { return ctx_.win.arrived(tag); }, true,
                           [&] {
                             return detail::concat("dispatch row ", row, " (epoch tag ",
                                                   ctx_.win.tag(), ")");
                           });
    });
    // recv_src after every tag, in one pass: its stores then overlap each other, where noted
    // between the tag polls they cost 12 us of a 128-token decode against 4-8 (issue 31).
    // Rows the receive hook returned were noted there already; this writes the same values.
    call.record_sources(ctx_.win);
  }
  // A relay leaves only when what it relays is forwarded and its own sends are done.
  if (ctx_.relay)
    ctx_.waiter.wait_for([&] { return ctx_.relay->progress(); }, true,
                         [] { return std::string("relay forwarding"); });
  if (call.shape_mismatch() >= 0) return call.arrivals();
  timer.lap("receive");
  keep_send_stage(send);
  return call.arrivals();
}

// The receive hook: only the count records the range depends on (source s's alone with
// per-source placement) and the range's own rows are waited for, so a late rank delays only
// the ranges it sends. dispatch_recv later waits for the rest (rows already seen return at once).
std::array<int64_t, 2> Ubep::wait_recv_range(const DispatchCall& call, int source,
                                             int local_expert) {
  wait_counts(ctx_, call, ctx_.rank(), source + 1, true, call.first_range_source(source));
  const std::array<int64_t, 2> range = call.range_from_counts(ctx_.win, local_expert, source);
  const bool latency = call.layout() == Layout::kLatency;
  const int64_t base = latency ? local_expert * call.expert_slots() : 0;
  const DispatchCall::RowTags tags = call.row_tags(ctx_.win);
  const DispatchCall::SourceNotes notes = call.source_notes(ctx_.win);
  for (int64_t row = base + range[0]; row < base + range[0] + range[1]; ++row) {
    const Tag* tag = tags.at(row);
    ctx_.waiter.wait_for([&] { return ctx_.win.arrived(tag); }, true,
                         [&] {
                           return detail::concat("dispatch row ", row - base, " from rank ", source,
                                                 " (epoch tag ", ctx_.win.tag(), ")");
                         });
    if (notes.src) notes.note(row, source);
  }
  return range;
}

void Ubep::combine_send(const CombineCall& combine) {
  StageTimer timer(ctx_.stats, &ctx_.waiter.waited_ns());
  const int members = ctx_.dp.members();
  char* combine_rows = ctx_.win.at<char>(ctx_.rank(), ctx_.win.map().comb_x);
  Tag* tags = ctx_.win.at<Tag>(ctx_.rank(), ctx_.win.map().comb_tag);
  const size_t row_bytes = ctx_.row_bytes();
  // Plain stores (the owners read these rows right away) unless far larger than a cache
  // (DispatchCall::kStreamStagedBytes); streamed rows are fenced before their tags by the data
  // path (publish), as a dispatch's.
  const bool stream = static_cast<size_t>(combine.dispatch.num_recv_rows()) * row_bytes >=
                      DispatchCall::kStreamStagedBytes;
  ctx_.dp.run_roles([&](int member) {
    combine.dispatch.for_each_output_row(member, members, [&](int64_t row, int64_t packed) {
      const int64_t from = combine.compacted ? packed : row;
      if (!combine.zero_copy)
        ctx_.win.put_row(combine_rows + static_cast<size_t>(row) * row_bytes,
                         combine.x + static_cast<size_t>(from) * row_bytes, stream);
      ctx_.win.complete(tags + row);
    });
  });
  if (ctx_.relay) ctx_.relay->start_combine(combine.dispatch);
  timer.lap("send");
}

const char* Ubep::combine_row(const DispatchCall& call, int64_t token, int j, bool caller,
                              bool wait) const {
  const Routing& routing = call.routing();
  int expert_rank;
  int64_t pos;
  if (call.layout() == Layout::kThroughput) {
    expert_rank = j;
    pos = call.row_offset_at(expert_rank) + routing.slot_at(token, expert_rank);
  } else {
    const size_t tk = static_cast<size_t>(token * routing.topk + j);
    const auto expert = static_cast<size_t>(routing.topk_idx[tk]);
    const int local = routing.expert_local[expert];
    expert_rank = routing.expert_rank[expert];
    pos = local * call.expert_slots() + call.expert_offset_at(expert_rank, local) +
          routing.expert_slot[tk];
  }
  const Tag* tag = ctx_.win.at<Tag>(expert_rank, ctx_.win.map().comb_tag) + pos;
  if (wait)
    ctx_.waiter.wait_for([&] { return ctx_.win.arrived(tag); }, caller,
                         [&] {
                           return detail::concat("combine row of token ", token, " at rank ",
                                                 expert_rank, " (epoch tag ", ctx_.win.tag(), ")");
                         });
  return ctx_.win.at<char>(expert_rank, ctx_.win.map().comb_x) +
         static_cast<size_t>(pos) * ctx_.row_bytes();
}

TensorView Ubep::combine_recv(const CombineCall& combine) {
  const DispatchCall& call = combine.dispatch;
  const int64_t tokens = call.routing().num_tokens;
  const SendStage send = last_send_stage();
  StageTimer timer(ctx_.stats, &ctx_.waiter.waited_ns());
  ctx_.reducer.begin(call);
  if (ctx_.relay) {
    // Across hosts the caller's thread alone drives the transport, so it reduces alone too.
    for (int64_t t = 0; t < tokens; ++t)
      ctx_.reducer.reduce(
          call, combine.out, t, t + 1 < tokens ? t + 1 : -1, ctx_.reducer.acc(0),
          [&](int64_t tok, int j) { return combine_row(call, tok, j, true, true); },
          [&](int64_t tok, int j) { return combine_row(call, tok, j, true, false); });
    ctx_.waiter.wait_for([&] { return ctx_.relay->combine_done(); }, true,
                         [] { return std::string("relay partials"); });
  } else {
    const int members = ctx_.dp.members();
    ctx_.dp.run_roles([&](int member) {
      float* acc = ctx_.reducer.acc(member);
      int64_t begin, end;
      slice(tokens, member, members, &begin, &end);
      for (int64_t t = begin; t < end; ++t)
        ctx_.reducer.reduce(
            call, combine.out, t, t + 1 < end ? t + 1 : -1, acc,
            [&](int64_t tok, int j) { return combine_row(call, tok, j, false, true); },
            [&](int64_t tok, int j) { return combine_row(call, tok, j, false, false); });
    });
  }
  timer.lap("receive + reduce");
  ctx_.reducer.reduced(timer.last_own_us());
  keep_send_stage(send);
  return ctx_.reducer.y_view(tokens, combine.out);
}

}  // namespace

std::unique_ptr<TokenExchange> make_ubep(const ExchangeContext& ctx) {
  return std::make_unique<Ubep>(ctx);
}

}  // namespace ubep::ep
