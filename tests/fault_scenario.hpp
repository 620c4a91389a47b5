// One rank fails a call; what every rank observes. Shared by the thread-rank suite
// (test_faults.cpp) and the process-rank suite under mpirun (mpi/test_mpi_faults.cpp).
//
// The scenario, on every rank of the group: a good dispatch + combine (calls 1 and 2, checked
// against the reference), then the fault on the victim in call 3 or 4, then:
//   * the peers' call fails with PeerFailedError (published failures: far sooner than the
//     timeout) or TimeoutError (a skipped call: within the timeout plus a margin), naming a rank
//     and the call; at least one peer names the victim;
//   * after an outside barrier, every later call on that Buffer throws BrokenBufferError (on the
//     victim too), never data;
//   * a fresh Buffer on the same group works and is bit-identical to the reference.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "harness.hpp"
#include "ubep/error.hpp"

namespace ubep::test {

enum class Fault {
  kSkip,            // the victim never makes call 3 (dispatch): nothing is published
  kRejectDispatch,  // the victim's dispatch input is bad (an expert id out of range) in call 3
  kRejectCombine,   // the victim's combine input is bad (wrong shape) in call 4
  kThrow,           // the victim's caller throws between dispatch (3) and combine (4); unwinding
                    // destroys its Buffer
};
inline const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kSkip:
      return "skip";
    case Fault::kRejectDispatch:
      return "reject_dispatch";
    case Fault::kRejectCombine:
      return "reject_combine";
    case Fault::kThrow:
      return "throw";
  }
  return "?";
}

// Faults the peers only see by their timeout (nothing is published): a skipped call, and a
// caller that throws between dispatch and combine (its Buffer is destroyed on unwinding).
// Only a skipped call is seen by the timeout; a throwing caller's Buffer publishes its departure.
inline bool timed(Fault f) { return f == Fault::kSkip; }

// Published failures must reach the peers within this (the group's timeout is far longer).
inline constexpr std::chrono::milliseconds kPublishedBound{2000};
// Skipped calls: the peers' TimeoutError comes after the timeout, within this margin.
inline constexpr std::chrono::milliseconds kTimeoutMargin{3000};

// A problem whose every token has an expert on every rank (topk = ranks), so every rank's
// dispatch and combine depend on every other rank: a failure anywhere reaches everyone.
inline Problem all_ranks_problem(const Case& c, int ranks, uint64_t seed) {
  Problem p =
      make_problem(ranks, c.experts, c.hidden, c.dtype, c.tokens, c.topk, Routing::kUniform, seed);
  const int El = c.experts / ranks;
  for (RankInput& in : p.inputs)
    for (int64_t t = 0; t < in.tokens; ++t)
      for (int j = 0; j < c.topk; ++j)
        in.topk_idx[static_cast<size_t>(t * c.topk + j)] = j * El + (t + j) % El;
  return p;
}

inline Case fault_case(int ranks, Layout layout) {
  Case c;
  c.experts = 2 * ranks;
  c.hidden = 16;
  c.capacity = 6;
  c.topk = ranks;
  c.layout = layout;
  c.tokens.assign(static_cast<size_t>(ranks), 5);
  return c;
}

// What one rank saw in the faulty call.
struct Observed {
  std::string kind;  // "PeerFailedError", "TimeoutError", "InvalidArgument", "none", ...
  std::string what;
  std::chrono::milliseconds after{0};
};

template <typename Fn>
Observed observe(Fn&& fn) {
  Observed o;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fn();
    o.kind = "none";
  } catch (const PeerFailedError& e) {
    o = {"PeerFailedError", e.what(), {}};
  } catch (const TimeoutError& e) {
    o = {"TimeoutError", e.what(), {}};
  } catch (const BrokenBufferError& e) {
    o = {"BrokenBufferError", e.what(), {}};
  } catch (const InvalidArgument& e) {
    o = {"InvalidArgument", e.what(), {}};
  } catch (const std::exception& e) {
    o = {"other", e.what(), {}};
  }
  o.after =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  return o;
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Runs the scenario on this rank. `sync` is a barrier outside the library (the test's own);
// `any_rank` is an allreduce-or over the ranks (true if some rank passes true).
inline void run_fault_scenario(Group& g, Algorithm algo, Fault fault, int victim, Layout layout,
                               const std::function<void()>& sync,
                               const std::function<bool(bool)>& any_rank) {
  const int me = g.rank();
  const Case c = fault_case(g.size(), layout);
  Problem p = all_ranks_problem(c, g.size(), 40 + static_cast<uint64_t>(fault));
  // A group that spans hosts: the reference combines in the relay's per-host order.
  if (g.num_hosts() > 1) p.ranks_per_host = g.size() / g.num_hosts();
  const RankInput& in = p.inputs[static_cast<size_t>(me)];
  const DispatchArgs good = in.args(c.dtype, c.hidden, c.layout);
  SCOPED_TRACE(std::string(algorithm_name(algo)) + " " + fault_name(fault) + " victim " +
               std::to_string(victim) + " rank " + std::to_string(me));

  auto buf = std::make_unique<Buffer>(g, config_for(c, algo));
  run_and_check(g, c, p, buf.get(), nullptr);  // calls 1 and 2
  const int fault_call = fault == Fault::kSkip || fault == Fault::kRejectDispatch ? 3 : 4;

  Observed seen;
  if (me == victim) {
    if (fault == Fault::kRejectDispatch) {
      std::vector<int64_t> idx = in.topk_idx;
      idx[0] = c.experts;  // out of range
      DispatchArgs bad = good;
      bad.topk_idx.data = idx.data();
      seen = observe([&] { buf->dispatch(bad); });
      EXPECT_EQ(seen.kind, "InvalidArgument") << seen.what;
      EXPECT_TRUE(contains(seen.what, "expert id " + std::to_string(c.experts))) << seen.what;
    } else if (fault == Fault::kRejectCombine) {
      const DispatchResult r = buf->dispatch(good);
      seen = observe([&] { buf->combine({TensorView(), r.handle}); });  // x: wrong shape
      EXPECT_EQ(seen.kind, "InvalidArgument") << seen.what;
      EXPECT_TRUE(contains(seen.what, "combine: x")) << seen.what;
    } else if (fault == Fault::kThrow) {
      try {
        const std::unique_ptr<Buffer> mine = std::move(buf);
        mine->dispatch(good);
        throw std::runtime_error("the expert computation failed");
      } catch (const std::runtime_error&) {
      }  // unwinding destroyed the Buffer
    }
  } else {
    if (fault_call == 3) {
      seen = observe([&] { buf->dispatch(good); });
    } else {
      const DispatchResult r = buf->dispatch(good);
      std::vector<char> y(r.recv_x.bytes(), 0);  // the expert's output (its values don't matter)
      CombineArgs ca;
      ca.handle = r.handle;
      ca.x = r.recv_x;
      ca.x.data = y.data();
      seen = observe([&] { buf->combine(ca); });
    }
    const std::string call = "call " + std::to_string(fault_call);
    // BrokenBufferError: the echo of another peer that failed first (it names that peer); only
    // with more than two ranks, where a peer can break before this one starts the call.
    const bool echo = seen.kind == "BrokenBufferError" && g.size() > 2;
    EXPECT_TRUE(seen.kind == "PeerFailedError" || seen.kind == "TimeoutError" || echo)
        << seen.kind << ": " << seen.what;
    EXPECT_TRUE(contains(seen.what, call)) << seen.what;
    EXPECT_TRUE(contains(seen.what, "rank ")) << seen.what;
    const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(g.options().timeout);
    if (timed(fault)) {
      EXPECT_LT(seen.after, timeout + kTimeoutMargin) << seen.what;
    } else {
      EXPECT_TRUE(seen.kind == "PeerFailedError" || echo) << seen.kind << ": " << seen.what;
      EXPECT_LT(seen.after, kPublishedBound)
          << "published failure took " << seen.after.count() << " ms: " << seen.what;
    }
  }
  const bool named = me != victim &&
                     seen.kind == (timed(fault) ? "TimeoutError" : "PeerFailedError") &&
                     contains(seen.what, "rank " + std::to_string(victim) + " ");
  EXPECT_TRUE(any_rank(named)) << "no peer named the victim, rank " << victim;

  sync();  // every rank has seen its error: every peer's buffer is broken by now
  if (buf) {
    for (int k = 0; k < 2; ++k) {
      const Observed later = observe([&] {
        DispatchResult r = buf->dispatch(good);
        ADD_FAILURE() << "a broken buffer returned data (" << r.num_recv_rows << " rows)";
      });
      // The skipping victim's first later call is, by its count, the call its peers failed:
      // it fails as theirs did, naming a peer and that call; every other later call is refused.
      if (k == 0 && fault == Fault::kSkip && me == victim && later.kind == "PeerFailedError") {
        EXPECT_TRUE(contains(later.what, "failed call 3 (its buffer is broken)")) << later.what;
      } else {
        EXPECT_EQ(later.kind, "BrokenBufferError") << later.what;
        EXPECT_TRUE(contains(later.what, "broken after call")) << later.what;
        EXPECT_TRUE(contains(later.what, "create a new Buffer")) << later.what;
      }
      EXPECT_LT(later.after, kPublishedBound);
    }
  }
  sync();
  // Across hosts over MPI the fresh Buffer below is left out: the failed call's relay messages
  // that its victim never received stay in MPI's unexpected queue (MPI cannot discard them), and
  // a later Buffer's call with the same sequence number takes them (the relay's tags are the same
  // arithmetic in every Buffer): a gap of its own (docs/ELASTIC.md, "What is not supported").
  if (g.num_hosts() > 1) return;
  buf.reset();
  // A fresh Buffer on the same group: works, bit-identical to the reference (and to itself).
  Buffer fresh(g, config_for(c, algo));
  const std::vector<char> y1 = run_and_check(g, c, p, &fresh, nullptr);
  const std::vector<char> y2 = run_and_check(g, c, p, &fresh, nullptr);
  EXPECT_EQ(y1, y2);
}

// Ranks that pass different layouts to one dispatch, with the default placement (auto: the
// throughput rank resolves to compact, the latency rank to per-source, so they also disagree on
// placement). Two good calls, then call 3 where `latency_rank` passes latency and every other
// rank throughput (through dispatch_send + dispatch_recv when `split`). Every rank gets
// InvalidArgument naming a rank that differs, long before the group's timeout (`bound`), and the
// same Buffer is usable afterwards (two matched calls checked against the reference).
inline void run_mismatch_scenario(Group& g, Algorithm algo, int latency_rank, bool split,
                                  std::chrono::milliseconds bound) {
  const int me = g.rank();
  const Case c = fault_case(g.size(), Layout::kThroughput);
  const Problem p = all_ranks_problem(c, g.size(), 61);
  SCOPED_TRACE(std::string(algorithm_name(algo)) + (split ? " split" : "") + " latency rank " +
               std::to_string(latency_rank) + " rank " + std::to_string(me));
  Buffer b(g, config_for(c, algo));
  run_and_check(g, c, p, &b, nullptr);  // calls 1 and 2
  const Layout mine = me == latency_rank ? Layout::kLatency : Layout::kThroughput;
  const DispatchArgs a = p.inputs[static_cast<size_t>(me)].args(c.dtype, c.hidden, mine);
  const Observed seen = observe([&] {
    if (split) {
      b.dispatch_send(a);
      // The receive hook names the difference too, and leaves the call for dispatch_recv.
      const int other = me == latency_rank ? (me + 1) % g.size() : latency_rank;
      const Observed hook = observe([&] { b.wait_recv_range(other, 0); });
      EXPECT_EQ(hook.kind, "InvalidArgument") << hook.what;
      EXPECT_TRUE(contains(hook.what, "a different call (layout or placement)")) << hook.what;
      b.dispatch_recv();
    } else {
      b.dispatch(a);
    }
  });
  EXPECT_EQ(seen.kind, "InvalidArgument") << seen.what;
  EXPECT_TRUE(contains(seen.what, "a different call (layout or placement)")) << seen.what;
  if (me == latency_rank) {
    EXPECT_TRUE(contains(seen.what, "dispatch: rank ") &&
                !contains(seen.what, "dispatch: rank " + std::to_string(me) + " made"))
        << seen.what;
  } else {
    EXPECT_TRUE(contains(seen.what, "dispatch: rank " + std::to_string(latency_rank) + " made"))
        << seen.what;
  }
  EXPECT_LT(seen.after, bound) << seen.what;
  run_and_check(g, c, p, &b, nullptr);  // the same Buffer: usable, right data
  run_and_check(g, c, p, &b, nullptr);
}

}  // namespace ubep::test
