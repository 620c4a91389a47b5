// The bsp algorithm: the staged pipeline of CANN EP and DeepEP's normal mode, with a group-wide
// barrier after every communication stage.
//   dispatch: layout -> count exchange | token send | set-flag & verify | prefix sum   (3 barriers)
//   combine:  row send to the owners' staging | set-flag & verify | reduce            (2 barriers)
// It is a fair baseline: the count exchange gives every sender its rows' final offsets, so token
// rows make one copy, straight into the receiver's output in shared memory (the reorder stage has
// nothing left to move). The barriers make each stage's writes visible to the next stage; the
// flags are the separate "done" round the staged design pays for. Outputs are double-buffered
// by call parity (protocol.hpp), so no barrier is needed after the last stage.
#include "core/stage_timer.hpp"
#include "ep/exchange_context.hpp"
#include "ep/token_exchange.hpp"

namespace ubep::ep {

namespace {
constexpr int kDispatchOp = 0, kCombineOp = 1;

void set_flags_and_verify(const ExchangeContext& ctx, const DispatchCall& call, int op) {
  const Window& w = ctx.win;
  // Flags travel through shared memory, so only within the host; the barriers cover the rest.
  for (int dest = 0; dest < ctx.ranks(); ++dest)
    if (ctx.reach(call, dest))
      w.dp().publish(w.map().stage_flag(w.peer(dest), op, ctx.rank()), w.tag());
  for (int source = 0; source < ctx.ranks(); ++source) {
    if (!ctx.reach(call, source)) continue;
    const Tag* flag = w.map().stage_flag(w.local(), op, source);
    ctx.waiter.wait_for([&] { return w.arrived(flag); }, true,
                        [&] { return detail::concat("bsp flag of rank ", source); });
  }
}

// bsp's stage barrier. On one host it is a flag round through this buffer's window (slot
// 2 + n): every rank stores the call's tag into its flag at every peer and waits for every
// peer's flag -- one barrier, counted like a group barrier, that a failed peer ends at once
// (FailureWatch) and that a new Buffer starts afresh, so a failure never leaves the group's own
// barrier out of step. A slot is rewritten only in the next call, after every rank has passed
// it (passing the next barrier needs everyone), so a waiter never misses the value it waits for.
// Across hosts the group's barrier (MPI) does it.
void stage_barrier(const ExchangeContext& ctx, const DispatchCall& call, int n,
                   uint64_t* window_barriers) {
  if (ctx.multi_host()) {
    ctx.group.barrier();
    return;
  }
  const Window& w = ctx.win;
  const int slot = 2 + n;
  for (int dest = 0; dest < ctx.ranks(); ++dest)
    if (dest != ctx.rank() && ctx.reach(call, dest))
      w.dp().publish(w.map().stage_flag(w.peer(dest), slot, ctx.rank()), w.tag());
  for (int source = 0; source < ctx.ranks(); ++source) {
    if (source == ctx.rank() || !ctx.reach(call, source)) continue;
    const Tag* flag = w.map().stage_flag(w.local(), slot, source);
    ctx.waiter.wait_for([&] { return w.arrived(flag); }, true,
                        [&] { return detail::concat("bsp barrier ", n, " of rank ", source); });
  }
  ++*window_barriers;
}

class Bsp final : public TokenExchange {
 public:
  explicit Bsp(const ExchangeContext& ctx) : ctx_(ctx) {}
  bool split_phase() const override { return false; }
  void dispatch_send(DispatchCall& call) override;
  // dispatch_send completed the call.
  Arrivals dispatch_recv(DispatchCall& call) override { return call.arrivals(); }
  std::array<int64_t, 2> wait_recv_range(const DispatchCall& call, int s, int e) override {
    const int64_t* range = call.range(e, s);
    return {range[0], range[1]};
  }
  void combine_send(const CombineCall& combine) override;
  TensorView combine_recv(const CombineCall& combine) override {
    return ctx_.reducer.y_view(combine.dispatch.routing().num_tokens, combine.out);
  }
  uint64_t window_barriers() const override { return window_barriers_; }

 private:
  void barrier(const DispatchCall& call, int n) { stage_barrier(ctx_, call, n, &window_barriers_); }
  void exchange_counts(DispatchCall& call);
  void send_tokens(DispatchCall& call);
  void push_combine_rows(const CombineCall& combine);
  void reduce_staged(const CombineCall& combine);

  ExchangeContext ctx_;
  uint64_t window_barriers_ = 0;
};

// Stage 1: every count record, then a barrier; every sender then knows its offsets.
void Bsp::exchange_counts(DispatchCall& call) {
  const Routing& routing = call.routing();
  if (ctx_.relay) ctx_.relay->start_dispatch(call);
  for (int dest = 0; dest < ctx_.ranks(); ++dest) {
    if (!ctx_.reach(call, dest)) continue;
    ctx_.win.publish_count(
        dest, ctx_.rank(), routing.dest_rows[static_cast<size_t>(dest)], routing.topk, call.shape(),
        &routing.dest_expert_rows[static_cast<size_t>(dest * ctx_.local_experts())]);
  }
  if (ctx_.relay)  // relayed sources' count records are part of this stage
    ctx_.waiter.wait_for([&] { return ctx_.relay->counts_forwarded(); }, true,
                         [] { return std::string("relayed counts"); });
  barrier(call, 0);
}

// Stage 2: the rows split over the worker team and sent in ubep's order (fair baseline;
// DispatchCall::sends_by_token): equal slices of the tokens, token by token, or of each
// destination's rows, destinations in rotated order (so senders do not all start on the same
// rank). The barrier after this stage orders them for the receivers.
void Bsp::send_tokens(DispatchCall& call) {
  for (int dest = 0; dest < ctx_.ranks(); ++dest)
    if (ctx_.reach(call, dest)) call.compute_offsets(ctx_.win, dest);
  const Routing& routing = call.routing();
  const auto reach = [&](int dest) { return ctx_.reach(call, dest); };
  ctx_.dp.run_roles([&](int member) {
    const int members = ctx_.dp.members();
    if (call.sends_by_token()) {
      const int64_t n = routing.num_tokens;
      call.send_tokens(ctx_.win, n * member / members, n * (member + 1) / members, reach,
                       [](Tag*) {});
      return;
    }
    for (int k = 1; k <= ctx_.ranks(); ++k) {
      const int dest = (ctx_.rank() + k) % ctx_.ranks();
      if (!reach(dest)) continue;
      const int64_t n = routing.dest_rows[static_cast<size_t>(dest)];
      for (int64_t i = n * member / members; i < n * (member + 1) / members; ++i)
        call.send_rows(ctx_.win, dest, i, [](Tag*) {});
    }
  });
  if (ctx_.relay)
    ctx_.waiter.wait_for([&] { return ctx_.relay->progress(); }, true,
                         [] { return std::string("relay forwarding"); });
  barrier(call, 1);
}

void Bsp::dispatch_send(DispatchCall& call) {
  StageTimer timer(ctx_.stats, &ctx_.waiter.waited_ns());
  timer.lap("layout");  // the engine routed (and validated) the call
  exchange_counts(call);
  timer.lap("count exchange");
  call.choose_stores(ctx_.win.codec());
  send_tokens(call);
  timer.lap("token send");
  call.sent(timer.last_own_us());
  set_flags_and_verify(ctx_, call, kDispatchOp);
  barrier(call, 2);
  timer.lap("set-flag & verify");
  call.receive_counts(ctx_.win);
  call.record_sources(ctx_.win);  // every row is here (the barrier): recv_src from the records
  timer.lap("prefix sum");
}

// Combine stage 1: every combine row into its owner's staging (or, for an owner on another
// host, into this rank's combine rows for the relay).
void Bsp::push_combine_rows(const CombineCall& combine) {
  const DispatchCall& call = combine.dispatch;
  const Window& w = ctx_.win;
  const size_t row_bytes = ctx_.row_bytes();
  ctx_.dp.run_roles([&](int member) {  // the rows split over the worker team, like ubep's
    call.for_each_output_row(member, ctx_.dp.members(), [&](int64_t row, int64_t packed) {
      int owner;
      int64_t slot;
      call.row_owner(w, ctx_.cfg.max_topk, row, &owner, &slot);
      const char* data =
          combine.x + static_cast<size_t>(combine.compacted ? packed : row) * row_bytes;
      if (ctx_.same_host(owner)) {
        // Plain stores: the owner reduces these rows right away, so they should stay in cache.
        w.put_row(w.at<char>(owner, w.map().push) + static_cast<size_t>(slot) * row_bytes, data,
                  false);
      } else {  // stage it for this host's relay to that owner
        w.put_row(w.at<char>(ctx_.rank(), w.map().comb_x) + static_cast<size_t>(row) * row_bytes,
                  data, false);
        w.dp().publish(w.at<Tag>(ctx_.rank(), w.map().comb_tag) + row, w.tag());
      }
    });
  });
  if (ctx_.relay) ctx_.relay->start_combine(call);
}

// Combine stage 3: each owner reduces its tokens from its staging.
void Bsp::reduce_staged(const CombineCall& combine) {
  const DispatchCall& call = combine.dispatch;
  const char* push = ctx_.win.at<char>(ctx_.rank(), ctx_.win.map().push);
  // Every staged row is here (the barriers before this stage), so locating one never waits.
  auto row = [&](int64_t tok, int j) {
    const int64_t slot = call.layout() == Layout::kThroughput ? j * ctx_.max_tokens() + tok
                                                              : tok * ctx_.cfg.max_topk + j;
    return push + static_cast<size_t>(slot) * ctx_.row_bytes();
  };
  auto reduce = [&](int64_t begin, int64_t end, float* acc) {
    for (int64_t t = begin; t < end; ++t)
      ctx_.reducer.reduce(call, combine.out, t, t + 1 < end ? t + 1 : -1, acc, row, row);
  };
  const int64_t tokens = call.routing().num_tokens;
  if (ctx_.relay) {  // across hosts the caller's thread drives the transport, so it reduces alone
    reduce(0, tokens, ctx_.reducer.acc(0));
    ctx_.waiter.wait_for([&] { return ctx_.relay->combine_done(); }, true,
                         [] { return std::string("relay partials"); });
  } else {  // tokens split over the worker team, each member with its own accumulator row
    ctx_.dp.run_roles([&](int member) {
      const int members = ctx_.dp.members();
      reduce(tokens * member / members, tokens * (member + 1) / members, ctx_.reducer.acc(member));
    });
  }
}

void Bsp::combine_send(const CombineCall& combine) {
  StageTimer timer(ctx_.stats, &ctx_.waiter.waited_ns());
  push_combine_rows(combine);
  barrier(combine.dispatch, 3);
  timer.lap("row send");
  set_flags_and_verify(ctx_, combine.dispatch, kCombineOp);
  barrier(combine.dispatch, 4);
  timer.lap("set-flag & verify");
  ctx_.reducer.begin(combine.dispatch);
  reduce_staged(combine);
  timer.lap("reduce");
  ctx_.reducer.reduced(timer.last_own_us());
}

}  // namespace

std::unique_ptr<TokenExchange> make_bsp(const ExchangeContext& ctx) {
  return std::make_unique<Bsp>(ctx);
}

}  // namespace ubep::ep
