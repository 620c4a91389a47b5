// bootstrap::HostHeartbeat on loopback (issue 32): live hosts are never judged lost, a host that
// stops beating is judged lost by every other host and named, and start/stop under fire does
// not crash or leak (the stress case). Times here are correctness caps; the detection times are
// measured by tests/vhosts/host_loss_trials.sh on virtual hosts.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bootstrap/host_heartbeat.hpp"
#include "ubep/error.hpp"

namespace {
using ubep::bootstrap::HostHeartbeat;
using namespace std::chrono_literals;

struct Cluster {
  std::vector<std::unique_ptr<HostHeartbeat>> hb;
  std::mutex mu;
  std::vector<std::pair<int, int>> lost;  // (judge, lost host)

  explicit Cluster(int hosts, HostHeartbeat::Options opt = {}, std::vector<int> group_of = {}) {
    for (int h = 0; h < hosts; ++h)
      hb.push_back(std::make_unique<HostHeartbeat>(h, hosts, "127.0.0.1", 0, opt));
    for (int h = 0; h < hosts; ++h) {
      std::vector<HostHeartbeat::Peer> peers;
      for (int o = 0; o < hosts; ++o)
        if (o != h && (group_of.empty() || group_of[o] != group_of[h]))  // as host_liveness
          peers.push_back({o, "127.0.0.1", hb[o]->port()});
      hb[h]->start(
          peers,
          [this, h](int host, std::chrono::nanoseconds) {
            std::lock_guard<std::mutex> lock(mu);
            lost.emplace_back(h, host);
          },
          group_of);
    }
  }
  // The heartbeats first: their threads call back into mu and lost until joined.
  ~Cluster() { hb.clear(); }
  std::vector<std::pair<int, int>> seen() {
    std::lock_guard<std::mutex> lock(mu);
    return lost;
  }
};

// Thresholds here are generous (300 ms): a loaded CI machine may stall a sender thread for tens
// of ms, which the default 60 ms would rightly call a silence; the false-positive count at the
// default is measured by the trials, not asserted here.
HostHeartbeat::Options generous() {
  HostHeartbeat::Options opt;
  opt.threshold = 300ms;
  return opt;
}

TEST(HostHeartbeat, LiveHostsAreNeverJudgedLost) {
  Cluster c(3, generous());
  std::this_thread::sleep_for(1s);
  EXPECT_TRUE(c.seen().empty());
  for (int h = 0; h < 3; ++h)
    for (int o = 0; o < 3; ++o) EXPECT_FALSE(c.hb[h]->lost(o));
}

TEST(HostHeartbeat, ASilentHostIsNamedByEveryOther) {
  Cluster c(4, generous());
  std::this_thread::sleep_for(200ms);
  c.hb[2]->go_silent();  // host 2 stops beating, no goodbye: a crash
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (c.seen().size() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(100ms);  // room for a wrong extra judgement to show
  auto lost = c.seen();
  ASSERT_EQ(lost.size(), 3u);
  for (auto [judge, host] : lost) {
    EXPECT_NE(judge, 2);
    EXPECT_EQ(host, 2);
    EXPECT_TRUE(c.hb[judge]->lost(2));
  }
}

// Heartbeats run per rank; a rank is judged with its machine (group_of). CI stop 46: two senders
// on different machines went quiet for 60-69 ms while their machine-mates beat, and each machine
// was named lost. Here ranks 2 and 3 share a machine: rank 3 going quiet is no lost machine while
// rank 2 beats (its own death is its mates' to tell); both quiet is, and both are named by both
// judges. Without the grouping the first half fails (rank 3 named within a threshold).
TEST(HostHeartbeat, ARankQuietWhileItsMachineMateBeatsIsNoLostMachine) {
  Cluster c(4, generous(), {0, 0, 1, 1});
  std::this_thread::sleep_for(200ms);
  c.hb[3]->go_silent();
  std::this_thread::sleep_for(1s);  // > 3 thresholds
  EXPECT_TRUE(c.seen().empty()) << "rank 3 was named lost while rank 2, on its machine, beat";
  c.hb[2]->go_silent();
  auto deadline = std::chrono::steady_clock::now() + 3s;
  while (c.seen().size() < 4 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(100ms);
  auto lost = c.seen();
  std::sort(lost.begin(), lost.end());
  const std::vector<std::pair<int, int>> want{{0, 2}, {0, 3}, {1, 2}, {1, 3}};
  EXPECT_EQ(lost, want);
}

TEST(HostHeartbeat, AHostThatSaysGoodbyeIsNotLost) {
  Cluster c(3, generous());
  std::this_thread::sleep_for(200ms);
  c.hb[1].reset();                     // a clean end: goodbye sent
  std::this_thread::sleep_for(900ms);  // three thresholds
  EXPECT_TRUE(c.seen().empty());
}

TEST(HostHeartbeat, AHostNeverHeardIsLostAfterTheGrace) {
  HostHeartbeat::Options opt;
  opt.startup_grace = 300ms;
  HostHeartbeat hb(0, 2, "127.0.0.1", 0, opt);
  HostHeartbeat mute(1, 2, "127.0.0.1", 0, opt);  // bound, never started: it never beats
  std::atomic<int> lost{-1};
  hb.start({{1, "127.0.0.1", mute.port()}}, [&](int host, auto) { lost = host; });
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(lost.load(), -1);  // inside the grace
  for (int i = 0; i < 400 && lost.load() < 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(lost.load(), 1);
}

TEST(HostHeartbeat, BadArgumentsAreNamed) {
  HostHeartbeat::Options opt;
  EXPECT_THROW(HostHeartbeat(0, 1, "127.0.0.1", 0, opt), ubep::InvalidArgument);
  EXPECT_THROW(HostHeartbeat(2, 2, "127.0.0.1", 0, opt), ubep::InvalidArgument);
  EXPECT_THROW(HostHeartbeat(0, 2, "not-an-ip", 0, opt), ubep::InvalidArgument);
  opt.threshold = opt.period;
  EXPECT_THROW(HostHeartbeat(0, 2, "127.0.0.1", 0, opt), ubep::InvalidArgument);
  HostHeartbeat hb(0, 3, "127.0.0.1", 0, {});
  EXPECT_THROW(hb.start({{0, "127.0.0.1", 1}}, nullptr), ubep::InvalidArgument);  // itself
  EXPECT_THROW(hb.start({{1, "127.0.0.1", 1}, {1, "127.0.0.1", 2}}, nullptr),
               ubep::InvalidArgument);                                                    // twice
  EXPECT_THROW(hb.start({{1, "127.0.0.1", 1}}, nullptr, {0, 1}), ubep::InvalidArgument);  // 2 of 3
  EXPECT_THROW(hb.start({{1, "127.0.0.1", 1}}, nullptr, {0, 1, 3}), ubep::InvalidArgument);
}

// Stress: hosts come and go in a tight loop while the others judge them and call back; the
// destructor must join a thread that may be inside on_lost, and judgements must only ever name
// hosts that were gone. Run under TSan/ASan by scripts/test.sh's sanitizer build.
TEST(HostHeartbeat, StressChurnNeverNamesALiveHost) {
  HostHeartbeat::Options opt;
  opt.period = 2ms;
  opt.threshold = 300ms;
  for (int round = 0; round < 20; ++round) {
    Cluster c(3, opt);
    std::this_thread::sleep_for(30ms);
    int victim = round % 3;
    c.hb[victim]->go_silent();  // a crash; the others keep judging
    if (round % 2) {
      std::this_thread::sleep_for(5ms);  // destroyed while judging
    } else {  // both others must name it (bounded wait: a correctness cap, not a timing target)
      auto deadline = std::chrono::steady_clock::now() + 2s;
      while (c.seen().size() < 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(5ms);
      EXPECT_EQ(c.seen().size(), 2u) << "round " << round;
    }
    for (auto [judge, host] : c.seen()) {
      EXPECT_EQ(host, victim) << "round " << round << ": host " << judge << " judged live " << host
                              << " lost";
    }
  }  // every cluster destroyed with callbacks possibly in flight
}

// Waits (bounded: a correctness cap) until `c` has seen n verdicts.
void await_verdicts(Cluster& c, size_t n) {
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (c.seen().size() < n && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
}

// A stall of the judging host itself: the whole process (all three hosts, as virtual hosts on one
// kernel or a VM whose vCPUs were stolen share a stall) is stopped for 4 thresholds. On waking,
// nobody may be judged lost, since nobody could beat; and a host that dies after the stall is
// still named. In a child process, which the parent stops and continues; the child reports in
// its exit status (0: as expected, 1: a live host named, 2: no stall seen, 3: the loss not named).
int run_stalled_cluster(int ready_fd) {
  // 250 ms: loopback datagrams were measured held up to 99 ms in this shared kernel under the
  // suite's load (docs/ELASTIC.md), and at 100 ms a CI run (cf313ac) named a live host.
  HostHeartbeat::Options opt;
  opt.threshold = 250ms;
  Cluster c(3, opt);
  std::this_thread::sleep_for(300ms);  // every host heard
  char one = 1;
  if (write(ready_fd, &one, 1) != 1) return 4;
  std::this_thread::sleep_for(1000ms);  // the parent stops the process for 700 ms in here
  if (!c.seen().empty()) return 1;
  uint64_t stalls = 0;
  for (auto& hb : c.hb) stalls += hb->own_stalls();
  if (stalls == 0) return 2;
  c.hb[2]->go_silent();
  await_verdicts(c, 2);
  return c.seen().size() == 2 ? 0 : 3;
}

TEST(HostHeartbeat, AStallOfTheJudgeItselfIsNotAnybodysSilence) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    _exit(run_stalled_cluster(ready[1]));
  }
  close(ready[1]);
  pollfd p{ready[0], POLLIN, 0};
  char got = 0;
  const bool started = poll(&p, 1, 10000) == 1 && read(ready[0], &got, 1) == 1;
  close(ready[0]);
  if (started) {
    kill(child, SIGSTOP);
    std::this_thread::sleep_for(700ms);  // > the threshold: without the discount, a verdict
    kill(child, SIGCONT);
  } else {
    kill(child, SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(started) << "the child's cluster never started";
  ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
  const char* why[] = {"", "a live host was judged lost after the stall",
                       "no heartbeat thread saw its own stall", "the later loss was not named",
                       "the child could not report"};
  EXPECT_EQ(WEXITSTATUS(status), 0) << why[WEXITSTATUS(status) % 5];
}

// Issue 32: a replacement host taken by the live side is judged again (rearm), at its new
// address, so its own loss is named as fast as its predecessor's.
TEST(HostHeartbeat, AReplacementIsJudgedAgainAfterRearm) {
  Cluster c(2, generous());
  std::this_thread::sleep_for(100ms);
  c.hb[1]->go_silent();
  await_verdicts(c, 1);
  ASSERT_EQ(c.seen().size(), 1u);
  HostHeartbeat::Options opt = generous();
  opt.incarnation = 1;
  HostHeartbeat repl(1, 2, "127.0.0.1", 0, opt);
  repl.start({{0, "127.0.0.1", c.hb[0]->port()}}, nullptr);
  c.hb[0]->rearm(1, "127.0.0.1", repl.port(), 1);
  std::this_thread::sleep_for(700ms);  // two thresholds: the replacement beats, no verdict
  EXPECT_EQ(c.seen().size(), 1u);
  EXPECT_FALSE(c.hb[0]->lost(1));
  EXPECT_TRUE(c.hb[0]->heard(1));
  repl.go_silent();  // the replacement lost in turn
  await_verdicts(c, 2);
  ASSERT_EQ(c.seen().size(), 2u);
  EXPECT_EQ(c.seen()[1], std::make_pair(0, 1));
}

// The predecessor's beats (say it is cut off but still running) do not speak for a replacement
// that never beats: only beats of the rearmed incarnation or later count.
TEST(HostHeartbeat, APredecessorsBeatsDoNotKeepAReplacementAlive) {
  HostHeartbeat::Options opt = generous();
  opt.startup_grace = 300ms;
  Cluster c(2, opt);
  std::this_thread::sleep_for(100ms);
  HostHeartbeat mute(1, 2, "127.0.0.1", 0, opt);  // the replacement: bound, never beats
  c.hb[0]->rearm(1, "127.0.0.1", mute.port(), 1);
  // Host 1 (incarnation 0) still beats to host 0 all along; host 0 now beats to `mute`, so
  // host 1 may judge host 0 lost too: only host 0's verdict matters here.
  auto deadline = std::chrono::steady_clock::now() + 2s;
  auto judged = [&] {
    for (auto v : c.seen())
      if (v == std::make_pair(0, 1)) return true;
    return false;
  };
  while (!judged() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(judged());
  EXPECT_TRUE(c.hb[0]->lost(1));
}

TEST(HostHeartbeat, RearmOfABadHostIsNamed) {
  HostHeartbeat hb(0, 2, "127.0.0.1", 0, {});
  EXPECT_THROW(hb.rearm(0, "127.0.0.1", 1, 1), ubep::InvalidArgument);  // itself
  EXPECT_THROW(hb.rearm(2, "127.0.0.1", 1, 1), ubep::InvalidArgument);
  EXPECT_THROW(hb.rearm(1, "nowhere", 1, 1), ubep::InvalidArgument);
}

// Stress: rearm and forget from the caller's thread while the heartbeat thread drains, judges
// and applies them (TSan in the sanitizer build): a host that beats all along is never judged
// lost, and once it stops it is named exactly once.
TEST(HostHeartbeat, StressRearmWhileJudging) {
  HostHeartbeat::Options opt;
  opt.period = 2ms;
  opt.threshold = 300ms;
  Cluster c(2, opt);
  opt.incarnation = 1000;  // newer than every incarnation rearmed below
  HostHeartbeat repl(1, 2, "127.0.0.1", 0, opt);
  repl.start({{0, "127.0.0.1", c.hb[0]->port()}}, nullptr);
  c.hb[1]->go_silent();
  for (uint32_t inc = 1; inc <= 300; ++inc) {
    if (inc % 7 == 0) c.hb[0]->forget(1);
    c.hb[0]->rearm(1, "127.0.0.1", repl.port(), inc);
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(400ms);
  EXPECT_TRUE(c.seen().empty()) << "a beating replacement was judged lost";
  repl.go_silent();
  await_verdicts(c, 1);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(c.seen().size(), 1u);
}

}  // namespace
