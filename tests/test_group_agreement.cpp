// ep::GroupAgreement (issue 32): the Buffers of a group agree together -- every member begins
// before any wait, all are polled until each concluded, each finishes; with two members or more
// the agreeing dispatch fails unsent; a member with a split-phase call outstanding is refused,
// named. And its registry under concurrent joins and leaves (Buffers made and destroyed on
// several threads, one group and several): members of one group share one agreement, and an
// agreement goes with its last member.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "ep/group_agreement.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep::ep {
namespace {

struct FakeMember final : GroupAgreement::Member {
  int number = 0;
  bool idle = true, pending = false, has_record = true;
  int polls_to_conclude = 1;
  std::vector<std::string>* log = nullptr;
  int polls = 0;

  int buffer_number() const override { return number; }
  bool between_calls() const override { return idle; }
  void pump_records() override {}
  bool change_pending() const override { return pending; }
  bool replaced_here(int) const override { return has_record; }
  void begin_agreement(const char*) override { log->push_back("begin " + std::to_string(number)); }
  bool poll_agreement(const char*) override {
    ++polls;
    return polls >= polls_to_conclude;
  }
  void finish_agreement() override { log->push_back("finish " + std::to_string(number)); }
  std::string agreement_state(const char*) const override { return "fake"; }
};

WaitPolicy short_policy() {
  WaitPolicy p;
  p.timeout = std::chrono::seconds(5);
  return p;
}

TEST(GroupAgreement, EveryMemberBeginsBeforeAnyWaitAndTheAgreedDispatchFailsUnsent) {
  run_on_threads(1, [](Group& g) {
    std::vector<std::string> log;
    FakeMember b, a;  // joined out of order: taken in buffer-number order
    b.number = 1;
    a.number = 0;
    a.log = b.log = &log;
    a.polls_to_conclude = 3;
    b.polls_to_conclude = 7;
    auto ga = GroupAgreement::join(g, &b);
    EXPECT_EQ(GroupAgreement::join(g, &a), ga) << "two Buffers of one group, two agreements";
    EXPECT_FALSE(ga->change_pending());
    b.pending = true;
    EXPECT_TRUE(ga->change_pending());
    b.has_record = false;
    EXPECT_TRUE(ga->replaced_elsewhere(4, &b));   // b itself is not asked
    EXPECT_FALSE(ga->replaced_elsewhere(4, &a));  // b lacks the replacement's record
    try {
      ga->agree(&a, short_policy(), "dispatch");
      ADD_FAILURE() << "two members agreed and the dispatch went on";
    } catch (const PeerFailedError& e) {
      EXPECT_NE(std::string(e.what()).find("agreed on the new view"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(log, (std::vector<std::string>{"begin 0", "begin 1", "finish 0", "finish 1"}));
    EXPECT_EQ(a.polls, 3) << "a concluded member was polled again";
    EXPECT_EQ(b.polls, 7);
    b.idle = false;  // a split-phase call outstanding on b: a's agreement is refused, named
    try {
      ga->agree(&a, short_policy(), "dispatch");
      ADD_FAILURE() << "agreed with a member in a split-phase call";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("Buffer number 1"), std::string::npos) << e.what();
    }
    ga->leave(&b);
    log.clear();
    ga->agree(&a, short_policy(), "dispatch");  // one member: the dispatch goes on
    EXPECT_EQ(log, (std::vector<std::string>{"begin 0", "finish 0"}));
    ga->leave(&a);
  });
}

// 8 threads join and leave, each with its own member, on one group and on a group of their own:
// the registry's map and a group's member list are changed concurrently under their mutexes.
TEST(GroupAgreement, ConcurrentJoinsAndLeavesShareOneAgreementPerGroup) {
  run_on_threads(1, [](Group& shared) {
    run_on_threads(8, [&](Group& own) {
      std::vector<std::string> log;
      for (int k = 0; k < 3000; ++k) {
        FakeMember m, n;
        m.number = n.number = own.rank();
        m.log = n.log = &log;
        Group& g = k % 2 ? shared : own;
        auto first = GroupAgreement::join(g, &m);
        auto second = GroupAgreement::join(g, &n);
        if (first != second) ADD_FAILURE() << "one group, two agreements";
        first->leave(&m);
        second->leave(&n);
      }
    });
    // Every member left: the next join makes a new agreement with only its own member.
    std::vector<std::string> log;
    FakeMember solo;
    solo.log = &log;
    auto ga = GroupAgreement::join(shared, &solo);
    ga->agree(&solo, short_policy(), "dispatch");  // alone: no throw
    EXPECT_EQ(log, (std::vector<std::string>{"begin 0", "finish 0"}));
    ga->leave(&solo);
  });
}

}  // namespace
}  // namespace ubep::ep
