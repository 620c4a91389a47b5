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
#include "ep/algo_context.hpp"
#include "ep/algorithm.hpp"

namespace ubep::ep {

namespace {
constexpr int kDispatchOp = 0, kCombineOp = 1;

void set_flags_and_verify(const AlgoContext& c, int op) {
  const Window& w = c.win;
  // Flags travel through shared memory, so only within the host; the barriers cover the rest.
  for (int d = 0; d < c.ranks(); ++d)
    if (c.reach(d)) w.dp().publish(w.map().stage_flag(w.peer(d), op, c.rank()), w.tag());
  for (int s = 0; s < c.ranks(); ++s) {
    if (!c.reach(s)) continue;
    const Tag* f = w.map().stage_flag(w.local(), op, s);
    c.waiter.wait_for([&] { return w.arrived(f); }, true,
                      [&] { return detail::concat("bsp flag of rank ", s); });
  }
}

// bsp's stage barrier. On one host it is a flag round through this buffer's window (slot
// 2 + n): every rank stores the call's tag into its flag at every peer and waits for every
// peer's flag -- one barrier, counted like a group barrier, that a failed peer ends at once
// (FailureWatch) and that a new Buffer starts afresh, so a failure never leaves the group's own
// barrier out of step. A slot is rewritten only in the next call, after every rank has passed
// it (passing the next barrier needs everyone), so a waiter never misses the value it waits for.
// Across hosts the group's barrier (MPI) does it.
void stage_barrier(const AlgoContext& c, int n, uint64_t* window_barriers) {
  if (c.multi_host()) {
    c.group.barrier();
    return;
  }
  const Window& w = c.win;
  const int slot = 2 + n;
  for (int d = 0; d < c.ranks(); ++d)
    if (d != c.rank() && c.reach(d))
      w.dp().publish(w.map().stage_flag(w.peer(d), slot, c.rank()), w.tag());
  for (int s = 0; s < c.ranks(); ++s) {
    if (s == c.rank() || !c.reach(s)) continue;
    const Tag* f = w.map().stage_flag(w.local(), slot, s);
    c.waiter.wait_for([&] { return w.arrived(f); }, true,
                      [&] { return detail::concat("bsp barrier ", n, " of rank ", s); });
  }
  ++*window_barriers;
}

class Bsp final : public Algorithm {
 public:
  explicit Bsp(const AlgoContext& c) : c_(c) {}
  bool split_phase() const override { return false; }
  void dispatch_send(const DispatchArgs& a) override;
  void dispatch_recv() override {}  // dispatch_send completed the call
  std::array<int64_t, 2> wait_recv_range(int s, int e) override {
    const int64_t* r = c_.call.range(e, s);
    return {r[0], r[1]};
  }
  void combine_send(const CombineArgs& a) override;
  void combine_recv() override {}
  uint64_t window_barriers() const override { return window_barriers_; }

 private:
  void barrier(int n) { stage_barrier(c_, n, &window_barriers_); }

  AlgoContext c_;
  uint64_t window_barriers_ = 0;
};

void Bsp::dispatch_send(const DispatchArgs& /*a: read through call.source*/) {
  const AlgoContext& c = c_;
  CallState& call = c.call;
  const Routing& routing = call.routing;
  StageTimer timer(c.stats);
  timer.lap("layout");  // routing was built (and validated) by begin_dispatch
  if (c.relay) c.relay->start_dispatch();
  for (int d = 0; d < c.ranks(); ++d) {
    if (!c.reach(d)) continue;
    c.win.publish_count(d, c.rank(), routing.dest_rows[static_cast<size_t>(d)], routing.topk,
                        call.shape(),
                        &routing.dest_expert_rows[static_cast<size_t>(d * c.local_experts())]);
  }
  if (c.relay)  // relayed sources' count records are part of this stage
    c.waiter.wait_for([&] { return c.relay->counts_forwarded(); }, true,
                      [] { return std::string("relayed counts"); });
  barrier(0);
  timer.lap("count exchange");
  for (int d = 0; d < c.ranks(); ++d)
    if (c.reach(d)) call.compute_offsets(c.win, d);
  // The rows to each destination split over the worker team as ubep splits them (fair
  // baseline); the barrier after this stage orders them for the receivers. Destinations in
  // rotated order (as ubep does), so senders do not all start on the same rank.
  c.dp.run_roles([&](int m) {
    const int members = c.dp.members();
    for (int k = 1; k <= c.ranks(); ++k) {
      const int d = (c.rank() + k) % c.ranks();
      if (!c.reach(d)) continue;
      const int64_t n = routing.dest_rows[static_cast<size_t>(d)];
      for (int64_t i = n * m / members; i < n * (m + 1) / members; ++i)
        call.send_rows(c.win, d, i, [](Tag*) {});
    }
  });
  if (c.relay)
    c.waiter.wait_for([&] { return c.relay->progress(); }, true,
                      [] { return std::string("relay forwarding"); });
  barrier(1);
  timer.lap("token send");
  set_flags_and_verify(c, kDispatchOp);
  barrier(2);
  timer.lap("set-flag & verify");
  call.receive_counts(c.win);
  timer.lap("prefix sum");
}

void Bsp::combine_send(const CombineArgs& a) {
  const AlgoContext& c = c_;
  const CallState& call = c.call;
  const Window& w = c.win;
  StageTimer timer(c.stats);
  c.dp.run_roles([&](int m) {  // the rows split over the worker team, like ubep's
    call.for_each_output_row(m, c.dp.members(), [&](int64_t row, int64_t packed) {
      int owner;
      int64_t slot;
      call.row_owner(w, c.cfg.max_topk, row, &owner, &slot);
      const char* data = static_cast<const char*>(a.x.data) +
                         static_cast<size_t>(a.compacted ? packed : row) * c.row_bytes();
      if (c.same_host(owner)) {
        // Plain stores: the owner reduces these rows right away, so they should stay in cache.
        w.put_row(w.at<char>(owner, w.map().push) + static_cast<size_t>(slot) * c.row_bytes(), data,
                  false);
      } else {  // stage it for this host's relay to that owner
        w.put_row(w.at<char>(c.rank(), w.map().comb_x) + static_cast<size_t>(row) * c.row_bytes(),
                  data, false);
        w.dp().publish(w.at<Tag>(c.rank(), w.map().comb_tag) + row, w.tag());
      }
    });
  });
  if (c.relay) c.relay->start_combine();
  barrier(3);
  timer.lap("row send");
  set_flags_and_verify(c, kCombineOp);
  barrier(4);
  timer.lap("set-flag & verify");
  const char* push = w.at<char>(c.rank(), w.map().push);
  auto reduce = [&](int64_t t0, int64_t t1, float* acc) {
    for (int64_t t = t0; t < t1; ++t)
      c.reducer.reduce(t, acc, [&](int64_t tok, int j) {
        const int64_t slot =
            call.layout == Layout::kThroughput ? j * c.T() + tok : tok * c.cfg.max_topk + j;
        return push + static_cast<size_t>(slot) * c.row_bytes();
      });
  };
  const int64_t tokens = call.routing.num_tokens;
  if (c.relay) {  // across hosts the caller's thread drives the transport, so it reduces alone
    reduce(0, tokens, c.reducer.acc(0));
  } else {  // tokens split over the worker team, each member with its own accumulator row
    c.dp.run_roles([&](int m) {
      const int members = c.dp.members();
      reduce(tokens * m / members, tokens * (m + 1) / members, c.reducer.acc(m));
    });
  }
  if (c.relay)
    c.waiter.wait_for([&] { return c.relay->combine_done(); }, true,
                      [] { return std::string("relay partials"); });
  timer.lap("reduce");
}

}  // namespace

std::unique_ptr<Algorithm> make_bsp(const AlgoContext& c) { return std::make_unique<Bsp>(c); }

}  // namespace ubep::ep
