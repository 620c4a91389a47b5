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
#include "ep/host_engine.hpp"
#include "ep/relay.hpp"

namespace ubep::ep {

namespace {
constexpr int kDispatchOp = 0, kCombineOp = 1;

void set_flags_and_verify(HostEngine& b, int op) {
  const Window& w = b.win;
  // Flags travel through shared memory, so only within the host; the barriers cover the rest.
  for (int d = 0; d < b.ranks; ++d)
    if (b.same_host(d)) w.dp().publish(w.map().stage_flag(w.peer(d), op, b.rank), w.tag());
  for (int s = 0; s < b.ranks; ++s) {
    if (!b.same_host(s)) continue;
    const Tag* f = w.map().stage_flag(w.local(), op, s);
    b.wait_for([&] { return w.arrived(f); }, true,
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
void stage_barrier(HostEngine& b, int n) {
  if (b.multi_host()) {
    b.grp.barrier();
    return;
  }
  const Window& w = b.win;
  const int slot = 2 + n;
  for (int d = 0; d < b.ranks; ++d)
    if (d != b.rank) w.dp().publish(w.map().stage_flag(w.peer(d), slot, b.rank), w.tag());
  for (int s = 0; s < b.ranks; ++s) {
    if (s == b.rank) continue;
    const Tag* f = w.map().stage_flag(w.local(), slot, s);
    b.wait_for([&] { return w.arrived(f); }, true,
               [&] { return detail::concat("bsp barrier ", n, " of rank ", s); });
  }
  ++b.window_barriers;
}

class Bsp final : public Algorithm {
 public:
  explicit Bsp(HostEngine& b) : b_(b) {}
  bool split_phase() const override { return false; }
  void dispatch_send(const DispatchArgs& a) override;
  void dispatch_recv() override {}  // dispatch_send completed the call
  std::array<int64_t, 2> wait_recv_range(int s, int e) override {
    const int64_t* r = b_.call.range(e, s);
    return {r[0], r[1]};
  }
  void combine_send(const CombineArgs& a) override;
  void combine_recv() override {}

 private:
  HostEngine& b_;
};

void Bsp::dispatch_send(const DispatchArgs& /*a: read through call.source*/) {
  HostEngine& b = b_;
  CallState& call = b.call;
  const Routing& routing = call.routing;
  StageTimer timer(b.stats);
  timer.lap("layout");  // routing was built (and validated) by begin_dispatch
  if (b.relay) b.relay->start_dispatch();
  for (int d = 0; d < b.ranks; ++d) {
    if (!b.same_host(d)) continue;
    b.win.publish_count(d, b.rank, routing.dest_rows[static_cast<size_t>(d)], routing.topk,
                        call.shape(),
                        &routing.dest_expert_rows[static_cast<size_t>(d * b.local_experts)]);
  }
  if (b.relay)  // relayed sources' count records are part of this stage
    b.wait_for([&] { return b.relay->counts_forwarded(); }, true,
               [] { return std::string("relayed counts"); });
  stage_barrier(b, 0);
  timer.lap("count exchange");
  for (int d = 0; d < b.ranks; ++d)
    if (b.same_host(d)) call.compute_offsets(b.win, d);
  // The rows to each destination split over the worker team as ubep splits them (fair
  // baseline); the barrier after this stage orders them for the receivers. Destinations in
  // rotated order (as ubep does), so senders do not all start on the same rank.
  b.dp->run_roles([&](int m) {
    const int members = b.dp->members();
    for (int k = 1; k <= b.ranks; ++k) {
      const int d = (b.rank + k) % b.ranks;
      if (!b.same_host(d)) continue;
      const int64_t n = routing.dest_rows[static_cast<size_t>(d)];
      for (int64_t i = n * m / members; i < n * (m + 1) / members; ++i)
        call.send_rows(b.win, d, i, [](Tag*) {});
    }
  });
  if (b.relay)
    b.wait_for([&] { return b.relay->progress(); }, true,
               [] { return std::string("relay forwarding"); });
  stage_barrier(b, 1);
  timer.lap("token send");
  set_flags_and_verify(b, kDispatchOp);
  stage_barrier(b, 2);
  timer.lap("set-flag & verify");
  call.receive_counts(b.win);
  timer.lap("prefix sum");
}

void Bsp::combine_send(const CombineArgs& a) {
  HostEngine& b = b_;
  const CallState& call = b.call;
  const Window& w = b.win;
  StageTimer timer(b.stats);
  b.dp->run_roles([&](int m) {  // the rows split over the worker team, like ubep's
    call.for_each_output_row(m, b.dp->members(), [&](int64_t row, int64_t packed) {
      int owner;
      int64_t slot;
      call.row_owner(w, b.cfg.max_topk, row, &owner, &slot);
      const char* data = static_cast<const char*>(a.x.data) +
                         static_cast<size_t>(a.compacted ? packed : row) * b.row_bytes();
      if (b.same_host(owner)) {
        // Plain stores: the owner reduces these rows right away, so they should stay in cache.
        w.put_row(w.at<char>(owner, w.map().push) + static_cast<size_t>(slot) * b.row_bytes(), data,
                  false);
      } else {  // stage it for this host's relay to that owner
        w.put_row(w.at<char>(b.rank, w.map().comb_x) + static_cast<size_t>(row) * b.row_bytes(),
                  data, false);
        w.dp().publish(w.at<Tag>(b.rank, w.map().comb_tag) + row, w.tag());
      }
    });
  });
  if (b.relay) b.relay->start_combine();
  stage_barrier(b, 3);
  timer.lap("row send");
  set_flags_and_verify(b, kCombineOp);
  stage_barrier(b, 4);
  timer.lap("set-flag & verify");
  const char* push = w.at<char>(b.rank, w.map().push);
  auto reduce = [&](int64_t t0, int64_t t1, float* acc) {
    for (int64_t t = t0; t < t1; ++t)
      b.reduce_token(t, acc, [&](int64_t tok, int j) {
        const int64_t slot =
            call.layout == Layout::kThroughput ? j * b.T + tok : tok * b.cfg.max_topk + j;
        return push + static_cast<size_t>(slot) * b.row_bytes();
      });
  };
  const int64_t tokens = call.routing.num_tokens;
  if (b.relay) {  // across hosts the caller's thread drives the transport, so it reduces alone
    reduce(0, tokens, b.acc.data());
  } else {  // tokens split over the worker team, each member with its own accumulator row
    b.dp->run_roles([&](int m) {
      const int members = b.dp->members();
      reduce(tokens * m / members, tokens * (m + 1) / members,
             &b.acc[static_cast<size_t>(m) * static_cast<size_t>(b.cfg.hidden)]);
    });
  }
  if (b.relay)
    b.wait_for([&] { return b.relay->combine_done(); }, true,
               [] { return std::string("relay partials"); });
  timer.lap("reduce");
}

}  // namespace

std::unique_ptr<Algorithm> make_bsp(HostEngine& b) { return std::make_unique<Bsp>(b); }

}  // namespace ubep::ep
