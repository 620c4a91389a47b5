// A choice between two ways of doing a call's work that give the same bits and differ only in
// speed, made from this rank's own timings: which one wins depends on the machine and its
// state, which no fixed rule knows (StoreTuner: how small dispatches store their rows;
// TokenReducer: whether a throughput combine prefetches its rows).
//
// Per size class (the bit width of the size the caller gives, bytes), the tuner takes the first
// policy, untimed, for the class's first kWarmupCalls calls (first touches of the memory, cold
// caches: in a debug build the first probes took 2-3x the steady time), then alternates the two
// policies over 2 * kProbes calls, keeps the policy whose median time was lower (one slow probe
// does not decide), and probes again after a run that doubles from kFirstExploitCalls to
// kExploitCalls calls: an early wrong choice is soon revisited, and the tuner follows a machine
// whose state changes. Sizes of 0 and from `untuned_from` on always take the first policy,
// untimed.
//
// Not thread-safe: one per Buffer, used by the thread that runs the call's phases.
#pragma once

#include <array>
#include <cstddef>
#include <limits>

namespace ubep::ep {

class PolicyTuner {
 public:
  static constexpr int kWarmupCalls = 2;         // per class: first policy, untimed
  static constexpr int kProbes = 4;              // samples of each policy per probing round
  static constexpr int kFirstExploitCalls = 32;  // calls on the choice after the first round,
  static constexpr int kExploitCalls = 1024;     // doubling up to this many

  explicit PolicyTuner(size_t untuned_from = std::numeric_limits<size_t>::max())
      : untuned_from_(untuned_from) {}

  // Whether the next call, of `size`, takes the second policy.
  bool second(size_t size);
  // The time of the call second() last decided, in microseconds. A call that failed before it
  // was timed records nothing; the next second() starts afresh.
  void record(double us);

 private:
  struct SizeClass {
    std::array<std::array<double, kProbes>, 2> samples{};  // [0] first policy, [1] second
    int warmup_left = kWarmupCalls;
    int probes = 0;                         // samples taken in this round, alternating
    int exploit_left = 0;                   // calls left on the choice before the next round
    int next_exploit = kFirstExploitCalls;  // the length of the next choice's run
    bool second_wins = false;
  };
  size_t untuned_from_;
  std::array<SizeClass, 65> classes_{};
  SizeClass* probing_ = nullptr;  // the class whose probe awaits record(), or none
};

}  // namespace ubep::ep
