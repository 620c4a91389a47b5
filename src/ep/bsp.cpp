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
#include "ep/buffer_impl.hpp"
#include "ep/relay.hpp"

namespace ubep::ep {

namespace {
constexpr int kDispatchOp = 0, kCombineOp = 1;

void set_flags_and_verify(Buffer::Impl& b, int op) {
  // Flags travel through shared memory, so only within the host; the barriers cover the rest.
  for (int d = 0; d < b.ranks; ++d)
    if (b.same_host(d)) publish(b.win.stage_flag(b.peer(d), op, b.rank), b.tag());
  for (int s = 0; s < b.ranks; ++s) {
    if (!b.same_host(s)) continue;
    const Tag* f = b.win.stage_flag(b.local(), op, s);
    wait_until([&] { return arrived(f, b.tag()); }, b.wait,
               [&] { return detail::concat("bsp flag of rank ", s); });
  }
}
}  // namespace

void bsp_dispatch(Buffer::Impl& b, const DispatchArgs& a) {
  StageTimer timer(b.stats);
  timer.lap("layout");  // routing was built (and validated) by begin_dispatch
  if (b.relay) b.relay->start_dispatch(a);
  for (int d = 0; d < b.ranks; ++d) {
    if (!b.same_host(d)) continue;
    b.publish_count(d, b.rank, b.routing.dest_rows[static_cast<size_t>(d)], b.routing.topk,
                    &b.routing.dest_expert_rows[static_cast<size_t>(d * b.local_experts)]);
  }
  if (b.relay)  // relayed sources' count records are part of this stage
    b.wait_for([&] { return b.relay->counts_forwarded(); }, true,
               [] { return std::string("relayed counts"); });
  b.group.barrier();
  timer.lap("count exchange");
  // Destinations in rotated order (as ubep does), so senders do not all start on the same rank.
  for (int k = 1; k <= b.ranks; ++k) {
    const int d = (b.rank + k) % b.ranks;
    if (!b.same_host(d)) continue;
    b.compute_offsets(d);
    for (int64_t i = 0; i < b.routing.dest_rows[static_cast<size_t>(d)]; ++i)
      b.send_rows(a, d, i, [](Tag*) {});
  }
  if (b.relay)
    b.wait_for([&] { return b.relay->progress(); }, true,
               [] { return std::string("relay forwarding"); });
  b.group.barrier();
  timer.lap("token send");
  set_flags_and_verify(b, kDispatchOp);
  b.group.barrier();
  timer.lap("set-flag & verify");
  b.receive_counts();
  timer.lap("prefix sum");
}

void bsp_combine(Buffer::Impl& b, const CombineArgs& a) {
  StageTimer timer(b.stats);
  b.for_each_output_row(0, 1, [&](int64_t row) {
    int owner;
    int64_t slot;
    b.row_owner(row, &owner, &slot);
    const char* data =
        static_cast<const char*>(a.x.data) + static_cast<size_t>(row) * b.row_bytes();
    if (b.same_host(owner)) {
      // Plain stores: the owner reduces these rows right away, so they should stay in cache.
      std::memcpy(b.at<char>(owner, b.win.push) + static_cast<size_t>(slot) * b.row_bytes(), data,
                  b.row_bytes());
    } else {  // stage it for this host's relay to that owner
      std::memcpy(b.at<char>(b.rank, b.win.comb_x) + static_cast<size_t>(row) * b.row_bytes(), data,
                  b.row_bytes());
      publish(b.at<Tag>(b.rank, b.win.comb_tag) + row, b.tag());
    }
  });
  if (b.relay) b.relay->start_combine();
  b.group.barrier();
  timer.lap("row send");
  set_flags_and_verify(b, kCombineOp);
  b.group.barrier();
  timer.lap("set-flag & verify");
  const char* push = b.at<char>(b.rank, b.win.push);
  for (int64_t t = 0; t < b.routing.num_tokens; ++t) {
    b.reduce_token(t, b.acc.data(), [&](int64_t tok, int j) {
      const int64_t slot =
          b.layout == Layout::kThroughput ? j * b.T + tok : tok * b.cfg.max_topk + j;
      return push + static_cast<size_t>(slot) * b.row_bytes();
    });
  }
  if (b.relay)
    b.wait_for([&] { return b.relay->combine_done(); }, true,
               [] { return std::string("relay partials"); });
  timer.lap("reduce");
}

}  // namespace ubep::ep
