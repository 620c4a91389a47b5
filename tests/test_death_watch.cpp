// bootstrap::DeathWatch when a replacement process takes a dead rank's place (rewatch): nothing
// of the dead predecessor's death may reach the live replacement.
// - AnEventOfThePredecessorDoesNotKillTheReplacement: an epoll event of the predecessor that the
//   watch thread already took. The event named the pidfd's number, and the replacement's pidfd
//   gets that number back (the lowest free descriptor), so the stale event marked the live
//   replacement dead: in ubep-elastic (CI of fec9263, elastic_100_cycles) a survivor masked the
//   replacement at its own incarnation, and it never served.
// - RewatchWaitsForThePredecessorsSubscribers: a death whose subscribers had not run yet when the
//   replacement was watched (ubep-elastic under load, 2026-12-06).
// Both make their interleaving happen every run.
// - ChurnOfDeathsAndRewatches, the stress test of both: three ranks killed and replaced 600
//   times at random moments against the watch thread's publication; no subscriber may ever run
//   for a rank whose live replacement is watched, and every replacement's death is seen.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "bootstrap/death_watch.hpp"

namespace ubep::bootstrap {
namespace {

using namespace std::chrono_literals;

// A child that lives until killed.
pid_t live_child() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

// Waits until `pid` has ended (a zombie: its pidfd is readable), without reaping it.
void await_end(pid_t pid) {
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);
}

template <typename Pred>
bool within(std::chrono::milliseconds limit, Pred&& pred) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Ranks 0 (b) and 1 (a) die together while the watch thread is held in a subscriber (of rank 2's
// death), so one epoll_wait returns both events. Held again in the first of them (rank 1's: it
// died first), the thread still holds rank 0's event when rank 0 is rewatched to a live process;
// its pidfd then reuses the predecessor's number (rank 0's, the lowest). The stale event must
// not kill the replacement; the replacement's own death must still be seen.
TEST(DeathWatch, AnEventOfThePredecessorDoesNotKillTheReplacement) {
  const pid_t b = live_child(), a = live_child(), d = live_child(), repl = live_child();
  ASSERT_GT(b, 0);
  ASSERT_GT(a, 0);
  ASSERT_GT(d, 0);
  ASSERT_GT(repl, 0);
  DeathWatch watch({b, a, d});
  std::mutex mu;
  std::condition_variable cv;
  int held = -1;    // the rank whose subscriber call is waiting, -1: none
  bool go = false;  // releases it
  int calls = 0;
  const int id = watch.subscribe([&](int rank) {
    std::unique_lock<std::mutex> lock(mu);
    if (++calls > 2) return;  // only the first two deaths are held
    held = rank;
    cv.notify_all();
    cv.wait_for(lock, 10s, [&] { return go; });
    go = false;
    held = -1;
    cv.notify_all();
  });
  auto wait_held = [&](int rank) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 10s, [&] { return held == rank; });
  };
  auto release = [&] {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
    cv.notify_all();
  };

  kill(d, SIGKILL);
  ASSERT_TRUE(wait_held(2)) << "rank 2's death was not seen";
  kill(a, SIGKILL);
  await_end(a);
  kill(b, SIGKILL);
  await_end(b);
  release();  // the thread's next epoll_wait returns rank 1's and rank 0's events together
  ASSERT_TRUE(wait_held(1)) << "rank 1's death was not the next seen";
  EXPECT_FALSE(watch.dead(0)) << "rank 0's event came before rank 1's (one batch expected)";
  watch.rewatch(0, repl);  // the replacement; its pidfd takes rank 0's old number
  release();               // the thread goes on to rank 0's event, which is stale now
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(watch.dead(0)) << "the predecessor's death was counted against the replacement";
  EXPECT_TRUE(watch.dead(1));

  kill(repl, SIGKILL);
  EXPECT_TRUE(within(5000ms, [&] { return watch.dead(0); }))
      << "the replacement's own death was not seen";
  watch.unsubscribe(id);
  for (pid_t p : {a, b, d, repl}) waitpid(p, nullptr, 0);
}

// The watch thread publishes a death in two steps: dead() turns true, then the subscribers run.
// A rewatch between the two (the caller saw dead(), mapped the replacement, and an agreement
// cleared the word a subscriber writes) must wait for the subscribers: a HostEngine's subscriber
// that ran after it wrote kDeadWord for the live replacement, and that survivor then failed every
// dispatch (ubep-elastic under load). Here the subscriber is held while rewatch is called: rewatch
// must not return before it is released, and the replacement stays live.
TEST(DeathWatch, RewatchWaitsForThePredecessorsSubscribers) {
  const pid_t old_proc = live_child(), repl = live_child();
  ASSERT_GT(old_proc, 0);
  ASSERT_GT(repl, 0);
  DeathWatch watch({old_proc});
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, go = false, finished = false;
  const int id = watch.subscribe([&](int) {
    std::unique_lock<std::mutex> lock(mu);
    if (entered) return;  // the replacement's own death, at the end
    entered = true;
    cv.notify_all();
    cv.wait_for(lock, 10s, [&] { return go; });
    finished = true;
  });
  kill(old_proc, SIGKILL);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return entered; })) << "the death was not seen";
  }
  EXPECT_TRUE(watch.dead(0));
  std::atomic<bool> rewatched{false};
  std::thread caller([&] {
    watch.rewatch(0, repl);
    rewatched.store(true);
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(rewatched.load()) << "rewatch returned while the predecessor's subscriber ran";
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
    cv.notify_all();
  }
  caller.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(finished);
  }
  EXPECT_FALSE(watch.dead(0)) << "the replacement counts as dead";
  kill(repl, SIGKILL);
  EXPECT_TRUE(within(5000ms, [&] { return watch.dead(0); }))
      << "the replacement's own death was not seen";
  watch.unsubscribe(id);
  for (pid_t p : {old_proc, repl}) waitpid(p, nullptr, 0);
}

TEST(DeathWatch, ChurnOfDeathsAndRewatches) {
  constexpr int kRanks = 3, kCycles = 600;
  std::vector<pid_t> procs;
  for (int r = 0; r < kRanks; ++r) {
    procs.push_back(live_child());
    ASSERT_GT(procs.back(), 0);
  }
  DeathWatch watch(procs);
  // word: what a Buffer's subscriber stores (kDeadWord), cleared by the agreement on the
  // replacement. live: the rank's watched process is a live replacement (set after rewatch
  // returns, cleared before it is killed), so no subscriber call may see it set.
  std::atomic<int> word[kRanks] = {}, live[kRanks] = {}, late_calls{0};
  for (auto& l : live) l.store(1);
  std::atomic<int> calls{0};
  const int id = watch.subscribe([&](int rank) {
    // Every third call is slow, as a watch thread preempted mid-publication is.
    if (calls.fetch_add(1) % 3 == 0) std::this_thread::sleep_for(1ms);
    if (live[rank].load()) late_calls.fetch_add(1);
    word[rank].store(1);
  });
  std::mt19937 rng(12345);
  int waited = 0, raced = 0;
  for (int c = 0; c < kCycles; ++c) {
    const int r = static_cast<int>(rng() % kRanks);
    const pid_t repl = live_child();
    ASSERT_GT(repl, 0);
    const pid_t old_proc = procs[static_cast<size_t>(r)];
    live[r].store(0);
    kill(old_proc, SIGKILL);
    switch (rng() % 3) {
      case 0: {  // the caller sees the death at once, as a survivor's call does
        const auto until = std::chrono::steady_clock::now() + 5s;
        while (!watch.dead(r) && std::chrono::steady_clock::now() < until)
          std::this_thread::yield();
        ASSERT_TRUE(watch.dead(r)) << "cycle " << c << ": the death was not seen";
        ++waited;
        break;
      }
      case 1:  // the replacement comes while the death is being published, or before
        for (unsigned i = 0, n = rng() % 20000; i < n; ++i)
          std::atomic_signal_fence(std::memory_order_seq_cst);  // a delay the compiler keeps
        ++raced;
        break;
      default:
        ++raced;
        break;
    }
    watch.rewatch(r, repl);
    word[r].store(0);  // the agreement clears the word for the replacement
    live[r].store(1);
    procs[static_cast<size_t>(r)] = repl;
    EXPECT_FALSE(watch.dead(r)) << "cycle " << c << ": the live replacement counts as dead";
    waitpid(old_proc, nullptr, 0);
  }
  std::this_thread::sleep_for(50ms);  // a late subscriber would write by now
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(word[r].load(), 0) << "rank " << r;
  EXPECT_EQ(late_calls.load(), 0) << "subscribers ran for live replacements";
  EXPECT_GT(waited, 0);
  EXPECT_GT(raced, 0);
  for (int r = 0; r < kRanks; ++r) {
    live[r].store(0);
    kill(procs[static_cast<size_t>(r)], SIGKILL);
  }
  for (int r = 0; r < kRanks; ++r)
    EXPECT_TRUE(within(5000ms, [&] { return watch.dead(r) && word[r].load() == 1; }))
        << "rank " << r << ": the last replacement's death was not published";
  watch.unsubscribe(id);
  for (pid_t p : procs) waitpid(p, nullptr, 0);
}

}  // namespace
}  // namespace ubep::bootstrap
