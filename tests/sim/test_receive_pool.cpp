// ReceivePool (sim/receive_pool.hpp) against the event-per-task pool it replaced: random
// arrivals, joins, gates and seals, every completion time compared to the bit. (Suite
// SimReceivePool: the sim tests' ctest selection matches "Sim".)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "sim/engine.hpp"
#include "sim/receive_pool.hpp"
#include "ubep/error.hpp"

using namespace ubep::sim;

namespace {

struct Scenario {
  double task_ns = 1;
  double gate = 0;
  std::vector<double> joins;  // one server each; the pool is sealed at the last join
  struct Arrival {
    double at;
    uint64_t rows;
  };
  std::vector<Arrival> arrivals;
};

struct Outcome {
  double last_done = -std::numeric_limits<double>::infinity();
  double finish = -1;        // when the rank would be done: sealed, gate open, every row done
  std::vector<double> done;  // every completion, sorted (reference only)
};

// The pool as call_sim.cpp had it: a queue, idle servers and a completion event per task.
Outcome reference(const Scenario& s) {
  EventQueue q;
  uint64_t queued = 0, done = 0, total = 0;
  int idle = 0, joined = 0;
  bool gate = false;
  Outcome out;
  for (const auto& a : s.arrivals) total += a.rows;
  auto check = [&] {
    if (out.finish < 0 && gate && joined == static_cast<int>(s.joins.size()) && done == total)
      out.finish = q.now();
  };
  std::function<void()> pump = [&] {
    while (gate && idle > 0 && queued > 0) {
      --queued;
      --idle;
      q.after(s.task_ns, [&] {
        ++idle;
        ++done;
        out.done.push_back(q.now());
        out.last_done = q.now();
        pump();
        check();
      });
    }
  };
  q.at(s.gate, [&] {
    gate = true;
    pump();
    check();
  });
  for (double t : s.joins)
    q.at(t, [&] {
      ++idle;
      ++joined;
      pump();
      check();
    });
  for (const auto& a : s.arrivals)
    q.at(a.at, [&, a] {
      queued += a.rows;
      pump();
      check();
    });
  q.run();
  std::sort(out.done.begin(), out.done.end());
  return out;
}

// The same scenario through ReceivePool, as call_sim.cpp drives it now.
Outcome computed(const Scenario& s) {
  EventQueue q;
  ReceivePool pool(s.task_ns);
  uint64_t total = 0;
  int joined = 0;
  Outcome out;
  for (const auto& a : s.arrivals) total += a.rows;
  auto check = [&] {
    if (out.finish < 0 && pool.gate_open() && joined == static_cast<int>(s.joins.size()) &&
        pool.started() == total)
      out.finish = std::max(q.now(), pool.last_done());
  };
  q.at(s.gate, [&] {
    pool.open_gate(q.now());
    check();
  });
  for (double t : s.joins)
    q.at(t, [&] {
      pool.add_servers(q.now(), 1);
      if (++joined == static_cast<int>(s.joins.size())) pool.seal(q.now());
      check();
    });
  for (const auto& a : s.arrivals)
    q.at(a.at, [&, a] {
      pool.arrive(q.now(), a.rows);
      check();
    });
  q.run();
  out.last_done = pool.last_done();
  return out;
}

Scenario random_scenario(std::mt19937_64& rng, bool split) {
  Scenario s;
  // Half the scenarios on a grid of 0.5 ns with a 1.5 ns task, so that arrivals, joins, the
  // gate and completions tie; the others with a cost that rounds.
  const bool grid = rng() % 2 == 0;
  auto when = [&](double span) {
    return grid ? 0.5 * static_cast<double>(rng() % static_cast<uint64_t>(2 * span))
                : std::uniform_real_distribution<double>(0, span)(rng);
  };
  s.task_ns = grid ? 1.5 : std::uniform_real_distribution<double>(0.3, 4.0)(rng);
  const int servers = 1 + static_cast<int>(rng() % 12);
  const double first_join = when(10);
  s.gate = when(30);
  for (int i = 0; i < servers; ++i) s.joins.push_back(split ? first_join : when(60));
  const int arrivals = static_cast<int>(rng() % 60);
  for (int i = 0; i < arrivals; ++i) s.arrivals.push_back({when(80), rng() % 7});
  return s;
}

}  // namespace

TEST(SimReceivePool, MatchesAnEventPerTaskToTheBit) {
  std::mt19937_64 rng(28);
  int compared = 0;
  for (int i = 0; i < 2000; ++i) {
    // Servers joining together (ubep's reorder workers) and one by one (senders turning to
    // receiving, with shared roles).
    const Scenario s = random_scenario(rng, i % 2 == 0);
    const Outcome ref = reference(s);
    const Outcome got = computed(s);
    ASSERT_EQ(got.last_done, ref.last_done) << "scenario " << i;
    ASSERT_EQ(got.finish, ref.finish) << "scenario " << i;
    ASSERT_GE(ref.finish, 0) << "scenario " << i;
    compared += static_cast<int>(ref.done.size());
  }
  EXPECT_GT(compared, 20000);  // rows, not just empty scenarios
}

// Every completion, not only the last: with one task per arrival, first come first served and one
// cost, tasks complete in arrival order, so last_done after each arrival is that task's
// completion, and the whole list is compared.
TEST(SimReceivePool, EachCompletionMatchesOnceSealed) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    Scenario s;
    s.task_ns = std::uniform_real_distribution<double>(0.3, 4.0)(rng);
    s.gate = 0;
    const int servers = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < servers; ++k) s.joins.push_back(0);
    double t = 0;
    for (int k = 0; k < 40; ++k) {
      t += std::uniform_real_distribution<double>(0, 1.5)(rng);
      s.arrivals.push_back({t, 1});
    }
    const Outcome ref = reference(s);
    ReceivePool pool(s.task_ns);
    pool.open_gate(0);
    pool.add_servers(0, servers);
    pool.seal(0);
    std::vector<double> done;
    for (const auto& a : s.arrivals) {
      const double before = pool.last_done();
      pool.arrive(a.at, 1);
      // One task of one cost: it completes last, or ties the last.
      ASSERT_GE(pool.last_done(), before);
      done.push_back(pool.last_done());
    }
    ASSERT_EQ(done, ref.done) << "scenario " << i;
  }
}

TEST(SimReceivePool, RejectsAServerAfterTheSeal) {
  ReceivePool pool(1);
  pool.add_servers(0, 2);
  pool.seal(0);
  EXPECT_THROW(pool.add_servers(1, 1), ubep::InvalidArgument);
  EXPECT_THROW(ReceivePool(1).add_servers(0, -1), ubep::InvalidArgument);
}
