// A repeated combine of the last dispatch (DeepEP's tests combine one dispatch twice, with and
// without zero_copy), valid while the window still holds the dispatch's rows: until the next
// dispatch.
//
// Why a repeat needs more than the first combine: combine is one-directional. The expert side
// marks its combine rows with the call's tag and the owners read them in place (ubep), or it
// writes them into the owners' staging (bsp), and nobody tells the expert side when the owners
// are done. So after this rank's first combine returned, a peer may still be reading the rows
// this rank would now rewrite, and every tag of the first combine still reads as arrived.
// Hence, before a repeat:
//  * a sequence number of its own in the same half (CallSequence::begin_repeat): the repeat's
//    row tags, flags and bsp barriers wait for a tag no earlier message carries, and the
//    dispatch's outputs (same half) stay where they are;
//  * a barrier: every rank has returned from the previous combine of this dispatch, so no
//    peer reads a row while it is rewritten.
// What the next call relies on is unchanged: it takes the other half, and this half is next
// used by the call after it, with a tag none of these messages carries (ubep.cpp's argument).
#include "ep/host_engine.hpp"

namespace ubep::ep {

namespace {
// The barrier's flag slots (WindowLayout::kStageSlots): 7 is free, and 0 (bsp's dispatch
// verify) is written only in a dispatch, which a peer reaches only after every rank passed
// this barrier. Consecutive repeats alternate between them: a rank that passed one repeat's
// barrier may enter the next while a slow peer has yet to see its flag for the first, and
// must not overwrite that flag.
constexpr int kRepeatSlots[2] = {7, 0};
}  // namespace

void HostEngine::begin_repeat_combine() {
  const uint64_t seq = window_.begin_repeat();
  const int slot = kRepeatSlots[(seq / 2) % 2];
  for (int d = 0; d < ranks_; ++d)
    if (d != rank_)
      window_.dp().publish(window_.map().stage_flag(window_.peer(d), slot, rank_), window_.tag());
  for (int s = 0; s < ranks_; ++s) {
    if (s == rank_) continue;
    const Tag* f = window_.map().stage_flag(window_.local(), slot, s);
    waiter_.wait_for([&] { return window_.arrived(f); }, true,
                     [&] {
                       return detail::concat("rank ", s,
                                             " to enter the repeated combine of dispatch ",
                                             dispatch_seq_, " (epoch tag ", window_.tag(), ")");
                     });
  }
  ++repeat_barriers_;
}

}  // namespace ubep::ep
