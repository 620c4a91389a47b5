// Two Buffers with mask_dead_ranks on one TCP group of 3 hosts x 2 ranks (issue 32), as local
// processes on 127.0.0.1 (no namespaces needed): host 2 SIGKILLed, both Buffers mask it, a
// replacement host 2 makes both Buffers again and both take it back. Each Buffer's membership
// records between hosts have their own tag (MemberLink: kTagBase + the Buffer's number); with
// one tag for all, a record of one Buffer was taken by the other's receive, and an agreement
// waited for a record its twin had consumed, or resumed at the twin's call numbers.
//
// The schedule keeps every rank's order of calls the same across the two Buffers (a collective
// library's rule): interleaved calls A, B while nothing changes; through the kill and the rejoin
// either each Buffer alone (BothMask...) or still interleaved (InterleavedCalls...), which needs
// the group's one agreement for its Buffers (ep/group_agreement.hpp: before, the live ranks took
// the replacement in A and waited in A's next call while it waited in B's agreement). A step
// whose A call failed starts again at A, and the dispatch at which the Buffers agreed fails
// unsent on every rank (the contract, docs/ELASTIC.md). Every call of both Buffers is checked bit
// for bit against the reference of the ranks it ran with; each Buffer's inputs come from its own
// seeds.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "elastic/elastic_case.hpp"
#include "group_checks.hpp"
#include "loopback_ports.hpp"
#include "ubep/error.hpp"
#include "ubep/tcp_group.hpp"

namespace ubep::test {
namespace {

constexpr int kHosts = 3, kRanksPerHost = 2;
const std::vector<int> kHost2 = {4, 5};

// One Buffer's calls on one rank, counted as tcp_host_loss counts them: problem 0 until the host
// is masked, problem 1 while masked (so the call that takes the replacement, chosen while
// masked, has problem 1 on every rank), then 1, 2, 3 in turn counted from the first full call
// (the replacement counts from its first).
struct Stream {
  const char* name;
  Buffer& buf;
  const std::vector<Problem>& problems;
  int phase = 0;  // 0 full (before the kill), 1 masked, 2 full again
  int failed = 0, masked_calls = 0, full = 0;
  bool last_failed = false;  // the last call failed (allowed, at the kill)
  int agreed = 0;            // dispatches that ended at the group's agreement
  std::string first_failure{};

  const Problem& next() const {
    if (phase == 0) return problems[0];
    if (phase == 1) return problems[1];
    return problems[1 + static_cast<size_t>(full) % 3];
  }
  // One checked call. Empty when right (a failure at the kill is counted and allowed, at most
  // 5), else what was wrong.
  std::string call(Group& g, const Case& c) {
    const Problem& p = next();
    last_failed = false;
    try {
      run_and_check(g, c, p, &buf, nullptr, false,
                    [&] { return masked_problem(p, buf.masked_ranks()); });
    } catch (const PeerFailedError& e) {
      last_failed = true;
      // The dispatch at which the group's Buffers agreed on a change ends there, unsent, on every
      // rank (group_agreement.hpp): about once per change (the kill, the rejoin; a second
      // agreement if a change lands in the first), the replacement's first call included.
      if (std::string(e.what()).find("agreed on the new view") != std::string::npos) {
        if (++agreed > 4)
          return detail::concat(name, ": more than 4 dispatches ended at an agreement: ", e.what());
        if (phase == 2 && full > 0)
          return detail::concat(name, ": a call failed after the rejoin: ", e.what());
        return "";
      }
      if (phase == 2) return detail::concat(name, ": a call failed after the rejoin: ", e.what());
      if (first_failure.empty()) first_failure = e.what();
      if (++failed > 5) return detail::concat(name, ": more than 5 failed calls: ", e.what());
      return "";
    } catch (const std::exception& e) {
      return detail::concat(name, ": ", e.what());
    }
    if (::testing::Test::HasFailure()) return detail::concat(name, ": a call returned wrong data");
    const std::vector<int> m = buf.masked_ranks();
    if (!m.empty() && m != kHost2)
      return detail::concat(name, ": masked ranks other than host 2's (", m.size(), " of them)");
    if (!m.empty()) {
      if (phase == 2) return detail::concat(name, ": host 2 masked again after the rejoin");
      phase = 1;
      ++masked_calls;
    } else if (phase == 1) {
      phase = 2;
    }
    full += phase == 2;
    return "";
  }
};

// Calls s until done() (bounded: 30 s, a correctness bound); empty when right.
template <typename Done>
std::string until(Group& g, const Case& c, Stream& s, Done done) {
  const auto cap = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done() && std::chrono::steady_clock::now() < cap) {
    const std::string wrong = s.call(g, c);
    if (!wrong.empty()) return wrong;
    std::this_thread::sleep_for(std::chrono::microseconds(300));  // "compute"
  }
  return done() ? "" : detail::concat(s.name, ": not done after 30 s (phase ", s.phase, ")");
}

// n interleaved steps: A, B, A, B, ... A step whose A call failed (a change of the group ended
// it) starts again at A, as an application redoes an iteration that failed: ranks whose A call
// failed and ranks whose A call completed then meet again at A's next dispatch (those that went
// on to B leave it as soon as a peer begins the agreement there), so every rank keeps calling the
// Buffers in one order.
std::string interleaved(Group& g, const Case& c, Stream& a, Stream& b, int n) {
  for (int i = 0; i < n; ++i)
    for (Stream* s : {&a, &b}) {
      const std::string wrong = s->call(g, c);
      if (!wrong.empty()) return wrong;
      if (s->last_failed) break;
    }
  return "";
}

// Interleaved calls A, B, A, B, ... until done() (bounded as until()); empty when right.
template <typename Done>
std::string interleaved_until(Group& g, const Case& c, Stream& a, Stream& b, Done done) {
  const auto cap = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done() && std::chrono::steady_clock::now() < cap) {
    const std::string wrong = interleaved(g, c, a, b, 1);
    if (!wrong.empty()) return wrong;
    std::this_thread::sleep_for(std::chrono::microseconds(300));  // "compute"
  }
  return done()
             ? ""
             : detail::concat("A and B: not done after 30 s (phases ", a.phase, ", ", b.phase, ")");
}

// Calls until done(): of A alone, then B alone (one Buffer at a time), or interleaved.
template <typename DoneA, typename DoneB>
std::string each_until(Group& g, const Case& c, Stream& a, Stream& b, bool interleave, DoneA done_a,
                       DoneB done_b) {
  if (interleave) return interleaved_until(g, c, a, b, [&] { return done_a() && done_b(); });
  std::string wrong = until(g, c, a, done_a);
  return wrong.empty() ? until(g, c, b, done_b) : wrong;
}

// A live rank of hosts 0 and 1 (host 2's ranks run the first step and are killed in the second).
std::string live_rank(Group& g, const Case& c, Stream& a, Stream& b, bool victim, int ready,
                      bool interleave) {
  std::string wrong = interleaved(g, c, a, b, 10);
  if (!wrong.empty()) return wrong;
  if (write(ready, "r", 1) != 1) return "ready pipe";
  // The kill comes during A's calls (or the interleaved calls); both Buffers mask host 2.
  if (victim) pause();
  wrong = each_until(
      g, c, a, b, interleave, [&] { return a.masked_calls >= 20; },
      [&] { return b.masked_calls >= (interleave ? 20 : 1); });
  if (!wrong.empty()) return wrong;
  if (!(wrong = interleaved(g, c, a, b, 20)).empty()) return wrong;
  if (write(ready, "m", 1) != 1) return "ready pipe";
  // The replacement comes during A's calls (or the interleaved calls): both take it back.
  wrong = each_until(
      g, c, a, b, interleave, [&] { return a.full >= 20; }, [&] { return b.full >= 20; });
  return wrong.empty() ? interleaved(g, c, a, b, 30) : wrong;
}

// The replacement host's rank: the same Buffers, in the same order; then the live ranks' calls.
std::string replacement_rank(Group& g, const Case& c, Stream& a, Stream& b, bool interleave) {
  a.phase = b.phase = 2;
  const std::string wrong = each_until(
      g, c, a, b, interleave, [&] { return a.full >= 20; }, [&] { return b.full >= 20; });
  return wrong.empty() ? interleaved(g, c, a, b, 30) : wrong;
}

int rank_process(const std::vector<int>& ports, int host, int local, bool rejoin, int ready,
                 bool interleave) {
  const int me = host * kRanksPerHost + local;
  try {
    const TcpLaunch l = loopback_launch(ports, kHosts, host, kRanksPerHost, local, rejoin);
    GroupOptions opts;
    opts.timeout = std::chrono::seconds(5);
    std::unique_ptr<Group> g = make_tcp_group(l, opts);
    const auto [c, pa] = masked_host_problems(*g, kRanksPerHost, 3200);
    const std::vector<Problem> pb = masked_host_problems(*g, kRanksPerHost, 3300).problems;
    BufferConfig cfg = config_for(c, Algorithm::kUbep);
    cfg.mask_dead_ranks = true;
    Buffer buf_a(*g, cfg), buf_b(*g, cfg);  // the same config: only the tag tells them apart
    Stream a{"Buffer A", buf_a, pa}, b{"Buffer B", buf_b, pb};
    std::string wrong = rejoin ? replacement_rank(*g, c, a, b, interleave)
                               : live_rank(*g, c, a, b, host == 2, ready, interleave);
    if (wrong.empty()) wrong = allgathers_right(*g, {8, 40000}, 5);  // every rank, in one view
    if (!wrong.empty()) return std::fprintf(stderr, "rank %d: %s\n", me, wrong.c_str()), 3;
    std::printf(
        "rank %d%s: A failed %d, B failed %d calls at the kill, %d and %d dispatches ended "
        "at an agreement (first failure: %s)\n",
        me, rejoin ? " (replacement)" : "", a.failed, b.failed, a.agreed, b.agreed,
        a.first_failure.empty() ? "none" : a.first_failure.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", me, e.what());
    return 2;
  }
}

pid_t fork_rank(const std::vector<int>& ports, int host, int local, bool rejoin, int ready,
                bool interleave) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int rc = rank_process(ports, host, local, rejoin, ready, interleave);
    std::fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

// interleave: the calls of A and B interleave through the kill and the rejoin too (one
// membership agreement for the group's Buffers); else each Buffer alone while it agrees.
void kill_and_replace_host2(bool interleave) {
  const std::vector<int> ports = free_ports(kHosts);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  std::vector<pid_t> ranks;
  for (int r = 0; r < kHosts * kRanksPerHost; ++r)
    ranks.push_back(
        fork_rank(ports, r / kRanksPerHost, r % kRanksPerHost, false, ready[1], interleave));
  std::string wrong;
  for (int r = 0; r < kHosts * kRanksPerHost && wrong.empty(); ++r)
    wrong = await_ready(ready[0], ranks, {}, "the first calls");
  if (wrong.empty()) {
    for (int r : kHost2) kill(ranks[static_cast<size_t>(r)], SIGKILL);
    for (int r = 0; r < 4 && wrong.empty(); ++r)
      wrong = await_ready(ready[0], ranks, {4, 5}, "the calls with host 2 masked");
  }
  if (!wrong.empty()) {
    end_ranks(ranks);
    close(ready[0]);
    close(ready[1]);
    FAIL() << wrong;
  }
  for (int r : kHost2)
    ranks.push_back(fork_rank(ports, 2, r % kRanksPerHost, true, ready[1], interleave));
  expect_host2_killed_others_passed(ranks);
  close(ready[0]);
  close(ready[1]);
}

TEST(TcpTwoBuffers, BothMaskAndTakeBackAReplacedHost) { kill_and_replace_host2(false); }

TEST(TcpTwoBuffers, InterleavedCallsMaskAndTakeBackAReplacedHost) { kill_and_replace_host2(true); }

}  // namespace
}  // namespace ubep::test
