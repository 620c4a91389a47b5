// The event engine of ubep-sim: ordering of events and bandwidth sharing on hand-computed cases.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <vector>

#include "sim/engine.hpp"
#include "ubep/error.hpp"

using namespace ubep::sim;

TEST(EventQueue, RunsInTimeOrderAndFifoOnTies) {
  EventQueue q;
  std::vector<int> order;
  q.at(30, [&] { order.push_back(3); });
  q.at(10, [&] { order.push_back(1); });
  q.at(20, [&] { order.push_back(2); });
  q.at(20, [&] { order.push_back(22); });  // same time: after the one scheduled first
  q.at(10, [&] {
    order.push_back(11);
    q.after(5, [&] { order.push_back(15); });  // scheduled from inside an event
  });
  EXPECT_EQ(q.run(), 30);
  EXPECT_EQ(order, (std::vector<int>{1, 11, 15, 2, 22, 3}));
  EXPECT_EQ(q.executed(), 6u);
}

// Zero-delay events (a FIFO beside the heap) keep the (time, scheduling order) order: random
// events that schedule children at delays 0, 1 or 2, the order each was scheduled recorded.
TEST(EventQueue, ZeroDelayEventsKeepTheOrder) {
  EventQueue q;
  std::mt19937_64 rng(5);
  struct Ran {
    double time;
    int seq;
  };
  std::vector<Ran> ran;
  int scheduled = 0, zero = 0;
  std::function<void(double, int)> schedule = [&](double delay, int depth) {
    const int seq = scheduled++;
    zero += delay == 0 ? 1 : 0;
    q.after(delay, [&, seq, depth] {
      ran.push_back({q.now(), seq});
      if (depth < 6)
        for (int k = static_cast<int>(rng() % 3); k > 0; --k)
          schedule(static_cast<double>(rng() % 3), depth + 1);
    });
  };
  for (int i = 0; i < 40; ++i) schedule(static_cast<double>(rng() % 4), 0);
  q.run();
  ASSERT_EQ(static_cast<int>(ran.size()), scheduled);
  EXPECT_GT(zero, 50);
  for (size_t i = 1; i < ran.size(); ++i) {
    ASSERT_LE(ran[i - 1].time, ran[i].time) << i;
    if (ran[i - 1].time == ran[i].time) {
      ASSERT_LT(ran[i - 1].seq, ran[i].seq) << i;
    }
  }
}

// Lanes (engine.hpp): closures of one fixed delay skip the heap. More delays than lanes, some
// that round (now + 0.1), zero delays and absolute times, all interleaved: every event must run
// at the time it was given (now + delay, to the bit), in (time, scheduling order).
TEST(EventQueue, LanesKeepTheOrder) {
  EventQueue q;
  std::mt19937_64 rng(28);
  const double delays[] = {0, 0.1, 0.7, 1.3, 2.9, 1e-3, 5, 0.1 + 0.2};
  struct Ran {
    double want, time;
    int seq;
  };
  std::vector<Ran> ran;
  int scheduled = 0;
  std::function<void(int)> schedule = [&](int depth) {
    const int seq = scheduled++;
    const bool absolute = rng() % 5 == 0;
    const double delay = absolute ? static_cast<double>(rng() % 7) * 0.25 : delays[rng() % 8];
    const double want = q.now() + delay;
    auto action = [&, seq, want, depth] {
      ran.push_back({want, q.now(), seq});
      if (depth < 7)
        for (int k = static_cast<int>(rng() % 4); k > 0; --k) schedule(depth + 1);
    };
    if (absolute)
      q.at(want, action);
    else
      q.after(delay, action);
  };
  for (int i = 0; i < 100; ++i) schedule(0);
  q.run();
  ASSERT_EQ(static_cast<int>(ran.size()), scheduled);
  EXPECT_GT(scheduled, 1000);
  for (size_t i = 0; i < ran.size(); ++i) {
    ASSERT_EQ(ran[i].time, ran[i].want) << i;
    if (i == 0) continue;
    ASSERT_LE(ran[i - 1].time, ran[i].time) << i;
    if (ran[i - 1].time == ran[i].time) {
      ASSERT_LT(ran[i - 1].seq, ran[i].seq) << i;
    }
  }
}

TEST(EventQueue, RejectsThePast) {
  EventQueue q;
  q.at(10, [&] { EXPECT_THROW(q.at(5, [] {}), ubep::InvalidArgument); });
  q.run();
}

TEST(Network, SingleFlowIsLatencyPlusBytesOverBandwidth) {
  EventQueue q;
  Network net(q);
  const int l = net.add_link(10);  // 10 bytes/ns
  double done = -1;
  net.start_flow({l}, 1000, 50, [&] { done = q.now(); });
  q.run();
  EXPECT_DOUBLE_EQ(done, 100 + 50);
  EXPECT_DOUBLE_EQ(net.link_bytes(l), 1000);
}

// Two flows on one 10 B/ns link, 100 B and 300 B, starting together: both get 5 B/ns until the
// small one ends at t = 20 (100 B), then the big one has 200 B left at 10 B/ns: ends at 40.
TEST(Network, FairShareThenSpeedUp) {
  EventQueue q;
  Network net(q);
  const int l = net.add_link(10);
  double a = -1, b = -1;
  net.start_flow({l}, 100, 0, [&] { a = q.now(); });
  net.start_flow({l}, 300, 0, [&] { b = q.now(); });
  q.run();
  EXPECT_DOUBLE_EQ(a, 20);
  EXPECT_DOUBLE_EQ(b, 40);
}

// A late joiner: flow A (400 B) alone from 0 to 10 at 10 B/ns (100 B done); B (100 B) joins at
// t = 10; both at 5 B/ns: B ends at 30, A has 400-100-100 = 200 B left, at 10 B/ns ends at 50.
TEST(Network, LateJoinerSharesFromItsStart) {
  EventQueue q;
  Network net(q);
  const int l = net.add_link(10);
  double a = -1, b = -1;
  net.start_flow({l}, 400, 0, [&] { a = q.now(); });
  q.at(10, [&] { net.start_flow({l}, 100, 0, [&] { b = q.now(); }); });
  q.run();
  EXPECT_DOUBLE_EQ(b, 30);
  EXPECT_DOUBLE_EQ(a, 50);
}

// Max-min across two links: X uses send port S (10) and receive port P (4); Y uses S only.
// P fills first at 4 (X alone); S then gives Y all that X leaves: 10 - 4 = 6.
// X (40 B) ends at 10; Y (100 B) has 40 B left, then alone on S at 10 B/ns: ends at 14.
TEST(Network, HeldBackFlowLeavesItsShareToTheOthers) {
  EventQueue q;
  Network net(q);
  const int s = net.add_link(10), p = net.add_link(4);
  double x = -1, y = -1;
  net.start_flow({s, p}, 40, 0, [&] { x = q.now(); });
  net.start_flow({s}, 100, 0, [&] { y = q.now(); });
  q.run();
  EXPECT_DOUBLE_EQ(x, 10);
  EXPECT_DOUBLE_EQ(y, 14);
  EXPECT_DOUBLE_EQ(net.link_bytes(s), 140);
  EXPECT_DOUBLE_EQ(net.link_bytes(p), 40);
}

// The classic three-level case: L1 (1 B/ns) carries a and b; L2 (2 B/ns) carries a, c, d.
// Progressive filling: L1 fills at 1/2 (a = b = 0.5); L2 has 2 - 0.5 = 1.5 left for c and d:
// 0.75 each (the per-link rule gave them 2/3). c, d (3 B) end at 4. a, b (5 B) stay at 0.5
// (L1) and end at 10. Then e (1 B on L2 only) starts at 10 alone: 2 B/ns, ends at 10.5.
TEST(Network, ProgressiveFillingThreeLevels) {
  EventQueue q;
  Network net(q);
  const int l1 = net.add_link(1), l2 = net.add_link(2);
  double a = -1, b = -1, c = -1, d = -1, e = -1;
  net.start_flow({l1, l2}, 5, 0, [&] { a = q.now(); });
  net.start_flow({l1}, 5, 0, [&] { b = q.now(); });
  net.start_flow({l2}, 3, 0, [&] { c = q.now(); });
  net.start_flow({l2}, 3, 0, [&] {
    d = q.now();
    q.at(10, [&] { net.start_flow({l2}, 1, 0, [&] { e = q.now(); }); });
  });
  q.run();
  EXPECT_DOUBLE_EQ(c, 4);
  EXPECT_DOUBLE_EQ(d, 4);
  EXPECT_DOUBLE_EQ(a, 10);
  EXPECT_DOUBLE_EQ(b, 10);
  EXPECT_DOUBLE_EQ(e, 10.5);
}

// A finish deep in a chain hands capacity along it: L1 (2) carries a, b; L2 (3) carries b, c.
// Filling: L1 at 1 (a = b = 1), L2 gives c 3 - 1 = 2. a (1 B) ends at 1; then b is alone on L1
// (2) but shares L2 with c: L2 fills at 1.5 (b = c = 1.5). b has 4 B left at t = 1 (5 - 1),
// c has 8 - 2 = 6 B left: both 1.5 B/ns; b ends at 1 + 4/1.5, c has 6 - 4 = 2 B left, alone
// at 3 B/ns.
TEST(Network, FinishCascadesAlongAChain) {
  EventQueue q;
  Network net(q);
  const int l1 = net.add_link(2), l2 = net.add_link(3);
  double a = -1, b = -1, c = -1;
  net.start_flow({l1}, 1, 0, [&] { a = q.now(); });
  net.start_flow({l1, l2}, 5, 0, [&] { b = q.now(); });
  net.start_flow({l2}, 8, 0, [&] { c = q.now(); });
  q.run();
  EXPECT_DOUBLE_EQ(a, 1);
  EXPECT_NEAR(b, 1 + 4 / 1.5, 1e-9);
  EXPECT_NEAR(c, 1 + 4 / 1.5 + 2.0 / 3, 1e-9);
}

TEST(Network, ZeroByteFlowOnlyWaitsItsLatency) {
  EventQueue q;
  Network net(q);
  const int l = net.add_link(1);
  double done = -1;
  net.start_flow({l}, 0, 7, [&] { done = q.now(); });
  q.run();
  EXPECT_DOUBLE_EQ(done, 7);
  EXPECT_THROW(net.add_link(0), ubep::InvalidArgument);
}
