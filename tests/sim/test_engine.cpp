// The event engine of ubep-sim: ordering of events and bandwidth sharing on hand-computed cases.
#include <gtest/gtest.h>

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

// Bottleneck fair share across two links: X uses send port S (10) and receive port P (4);
// Y uses S only. On P, X alone gets 4; on S each gets 5; X's rate = min(5, 4) = 4, Y's = 5.
// X (40 B) ends at 10; Y (100 B) has 50 B left, then alone on S at 10 B/ns: ends at 15.
TEST(Network, RateIsTheSmallestFairShareOnThePath) {
  EventQueue q;
  Network net(q);
  const int s = net.add_link(10), p = net.add_link(4);
  double x = -1, y = -1;
  net.start_flow({s, p}, 40, 0, [&] { x = q.now(); });
  net.start_flow({s}, 100, 0, [&] { y = q.now(); });
  q.run();
  EXPECT_DOUBLE_EQ(x, 10);
  EXPECT_DOUBLE_EQ(y, 15);
  EXPECT_DOUBLE_EQ(net.link_bytes(s), 140);
  EXPECT_DOUBLE_EQ(net.link_bytes(p), 40);
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
