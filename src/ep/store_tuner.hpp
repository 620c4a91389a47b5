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
// Per size class (the bit width of the call's bytes to peers), the tuner streams the class's first
// kWarmupCalls calls untimed (first touches of the window, cold caches: in a debug build the
// first probes took 2-3x the steady send time), then alternates the two policies over
// 2 * kProbes calls, keeps the policy whose median send time was lower, and probes again after a
// run that doubles from kFirstExploitCalls to kExploitCalls calls: an early wrong choice is soon
// revisited, and the tuner follows a machine whose state changes. What it times is the send
// stage's own work (waits on peers excluded), which is where the store policy's cost lands. The
// results are the same bits either way: the rows are ordered before their tags by the data path
// in both (DataPath::put_row, publish).
//
// Not thread-safe: one per Buffer (in its DispatchCall), used by the thread that runs the call's
// phases.
#pragma once

#include <array>
#include <cstddef>

namespace ubep::ep {

class StoreTuner {
 public:
  // Calls moving this many bytes or more to peers always stream, and are not timed.
  static constexpr size_t kAlwaysStreamBytes = size_t{512} << 10;
  static constexpr int kWarmupCalls = 2;         // per class: streamed, untimed
  static constexpr int kProbes = 4;              // samples of each policy per probing round
  static constexpr int kFirstExploitCalls = 32;  // calls on the choice after the first round,
  static constexpr int kExploitCalls = 1024;     // doubling up to this many

  // Whether the next call, moving `peer_bytes` to peers, streams them.
  bool stream(size_t peer_bytes);
  // The send stage's own work of the call stream() last decided, in microseconds. A call that
  // failed before its send was timed records nothing; the next stream() starts afresh.
  void record(double own_us);

 private:
  struct SizeClass {
    std::array<std::array<double, kProbes>, 2> samples{};  // [0] streamed, [1] plain
    int warmup_left = kWarmupCalls;
    int probes = 0;                         // samples taken in this round, alternating
    int exploit_left = 0;                   // calls left on the choice before the next round
    int next_exploit = kFirstExploitCalls;  // the length of the next choice's run
    bool plain_wins = false;
  };
  std::array<SizeClass, 64> classes_{};
  SizeClass* probing_ = nullptr;  // the class whose probe awaits record(), or none
};

}  // namespace ubep::ep
