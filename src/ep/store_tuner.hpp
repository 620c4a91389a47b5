// How a small dispatch writes its rows into peers' windows: with non-temporal stores or plain
// ones, chosen from this rank's own measurements. Neither wins everywhere, and which one wins
// depends on where the destination lines are when the call starts, which no size rule knows:
// on the project's Zen 1 VM (2 MPI ranks, the bench's bound harness, same binary, minutes apart)
// one token's 8 rows took 6.8 us with plain stores against 10.6 non-temporal in one state of
// the machine, and 17.5-30 against 7.7-10.5 in another; an fp8 call of 4 tokens 11.0 against
// 20.5 (docs/PERFORMANCE.md, eleventh session). Calls moving 512 KiB or more to peers always
// stream: there plain stores read every line before writing it (3 bytes of traffic per byte
// instead of 2) and lost in every run, by 1.9x at 16 tokens (about 900 KiB to the peer: 484-495
// against 263-265 us) and 1.7x at 128 (3,387 against 1,930 us), while plain stores won some
// runs up to 224 KiB (4 tokens). Probing there would cost its plain calls and gain nothing.
//
// The choice is a PolicyTuner's (policy_tuner.hpp: warm-up, alternating probes, the median
// decides, probing again after a doubling run), timed by the send stage's own work (waits on
// peers excluded), which is where the store policy's cost lands. The results are the same bits
// either way: the rows are ordered before their tags by the data path in both
// (DataPath::put_row, publish).
//
// Not thread-safe: one per Buffer (in its DispatchCall), used by the thread that runs the call's
// phases.
#pragma once

#include <cstddef>

#include "ep/policy_tuner.hpp"

namespace ubep::ep {

class StoreTuner {
 public:
  // Calls moving this many bytes or more to peers always stream, and are not timed.
  static constexpr size_t kAlwaysStreamBytes = size_t{512} << 10;
  static constexpr int kWarmupCalls = PolicyTuner::kWarmupCalls;  // per class: streamed, untimed
  static constexpr int kProbes = PolicyTuner::kProbes;
  static constexpr int kFirstExploitCalls = PolicyTuner::kFirstExploitCalls;
  static constexpr int kExploitCalls = PolicyTuner::kExploitCalls;

  // Whether the next call, moving `peer_bytes` to peers, streams them (the first policy).
  bool stream(size_t peer_bytes) { return !tuner_.second(peer_bytes); }
  // The send stage's own work of the call stream() last decided, in microseconds. A call that
  // failed before its send was timed records nothing; the next stream() starts afresh.
  void record(double own_us) { tuner_.record(own_us); }

 private:
  PolicyTuner tuner_{kAlwaysStreamBytes};
};

}  // namespace ubep::ep
