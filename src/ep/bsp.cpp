// The bsp algorithm: the staged pipeline of CANN EP and DeepEP's normal mode, with a group-wide
// barrier after every stage. Dispatch: layout -> count exchange -> token send -> set-flag &
// verify -> prefix sum -> reorder. Combine: row send -> set-flag & verify -> reduce.
// It writes the same records into the same staging memory as ubep (one copy through shared
// memory), so the two differ only in orchestration: this is the fair baseline ubep is measured
// against. The barriers make every stage's writes visible before the next stage reads them.
#include "core/stage_timer.hpp"
#include "ep/buffer_impl.hpp"

namespace ubep::ep {

namespace {
constexpr int kDispatchOp = 0, kCombineOp = 1;

void set_flags_and_verify(Buffer::Impl& b, int op) {
  for (int d = 0; d < b.ranks; ++d) publish(b.staging.stage_flag(b.peer(d), op, b.rank), b.tag());
  for (int s = 0; s < b.ranks; ++s) {
    const Tag* f = b.staging.stage_flag(b.local(), op, s);
    wait_until([&] { return arrived(f, b.tag()); }, b.wait,
               [&] { return detail::concat("bsp flag of rank ", s); });
  }
}
}  // namespace

void bsp_dispatch(Buffer::Impl& b, const DispatchArgs& a) {
  StageTimer timer(b.stats);
  timer.lap("layout");  // routing was built (and validated) by begin_dispatch
  for (int d = 0; d < b.ranks; ++d) b.fill_count(d);
  b.group.barrier();
  timer.lap("count exchange");
  for (int d = 0; d < b.ranks; ++d)
    for (int64_t i = 0; i < b.routing.dest_rows[static_cast<size_t>(d)]; ++i) b.fill_token(a, d, i);
  b.group.barrier();
  timer.lap("token send");
  set_flags_and_verify(b, kDispatchOp);
  b.group.barrier();
  timer.lap("set-flag & verify");
  b.prefix_sum();
  timer.lap("prefix sum");
  for (int s = 0; s < b.ranks; ++s)
    for (int64_t i = 0; i < b.src_rows[static_cast<size_t>(s)]; ++i) b.consume_token(s, i);
  b.group.barrier();  // staging may be rewritten only after every rank has read it
  timer.lap("reorder");
}

void bsp_combine(Buffer::Impl& b, const CombineArgs& a) {
  StageTimer timer(b.stats);
  const int64_t rows = b.combine_row_count();
  for (int64_t row = 0; row < rows; ++row) {
    int owner;
    int64_t slot;
    const char* data;
    b.combine_target(row, &owner, &slot, &data, a);
    if (owner < 0) continue;
    std::memcpy(b.staging.combine(b.peer(owner), b.half(), slot).row(), data, b.row_bytes());
  }
  b.group.barrier();
  timer.lap("token send");
  set_flags_and_verify(b, kCombineOp);
  b.group.barrier();
  timer.lap("set-flag & verify");
  for (int64_t t = 0; t < b.routing.num_tokens; ++t)
    b.reduce_token(t, b.acc.data(), [](int64_t, int) {});
  b.group.barrier();
  timer.lap("reduce");
}

}  // namespace ubep::ep
