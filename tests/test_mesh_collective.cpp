// The group barrier and allgather of a TCP group over the mesh (src/bootstrap/mesh_collective.*,
// issue 32), one thread per rank over TcpRemote on socket pairs, hosts by a host map: every
// allgather checked against an independent pattern, every barrier against entry counters; sizes
// from empty to several chunks; uneven hosts. A stress test: a whole host lost, the live ranks'
// calls failing named while stale chunks of every size pile up, then a replacement host taken by
// each live rank at its own time (some chunks then arrive a view ahead, some a view behind), and
// every later call of every rank right. Plus the bounds: a silent rank and a rank passing other
// bytes are named.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/mesh_collective.hpp"
#include "transport/tcp/tcp_remote.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {
namespace {

using transport::TcpRemote;

// Byte i of rank r's contribution to call c: independent of the code under test.
char value(int r, int c, size_t i) {
  return static_cast<char>((r * 97 + c * 31 + static_cast<int>(i % 251) * 7 + 3) & 0xff);
}

// Bytes of call c (the same on every rank): every third a barrier, else empty to 3 chunks.
size_t size_of(int c) {
  std::mt19937 g(static_cast<unsigned>(c) * 2654435761u + 1);
  const unsigned k = g() % 10;
  return k == 0 ? 0 : k < 8 ? 1 + g() % 300 : MeshCollective::kChunk + g() % 30000;
}

struct World {
  explicit World(std::vector<int> hosts)
      : host_of(std::move(hosts)), n(static_cast<int>(host_of.size())) {
    fds.assign(static_cast<size_t>(n), std::vector<int>(static_cast<size_t>(n), -1));
    pending = std::make_unique<std::atomic<int>[]>(static_cast<size_t>(n * n));
    for (int i = 0; i < n * n; ++i) pending[static_cast<size_t>(i)] = -1;
    entered = std::make_unique<std::atomic<int>[]>(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) entered[static_cast<size_t>(i)] = -1;
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        if (host_of[static_cast<size_t>(a)] != host_of[static_cast<size_t>(b)]) connect(a, b, fds);
  }
  void connect(int a, int b, std::vector<std::vector<int>>& into) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    into[static_cast<size_t>(a)][static_cast<size_t>(b)] = sv[0];
    into[static_cast<size_t>(b)][static_cast<size_t>(a)] = sv[1];
  }
  std::atomic<int>& pending_fd(int at, int peer) {
    return pending[static_cast<size_t>(at * n + peer)];
  }

  std::vector<int> host_of;
  int n;
  std::vector<std::vector<int>> fds;
  std::unique_ptr<std::atomic<int>[]> pending;  // [at][peer]: a replacement's connection to take
  std::unique_ptr<std::atomic<int>[]> entered;  // [rank]: the last barrier it entered
};

// One rank: its transport, its view (incarnations) and the collective. The pump takes a
// replacement's connection, as TcpGroup's door does, once the predecessor is known lost.
struct Rank {
  Rank(World& w, int rank, std::vector<int> fds, std::vector<uint32_t> inc,
       std::chrono::milliseconds timeout = std::chrono::seconds(10))
      : world(w),
        me(rank),
        remote(rank, std::move(fds)),
        incarnation(std::move(inc)),
        coll(rank, w.host_of, remote,
             MeshHooks{[this](int r) { return incarnation[static_cast<size_t>(r)]; },
                       [this] { pump(); }, nullptr},
             timeout) {}
  void pump() {
    if (!may_take) return;
    remote.progress();
    for (int q = 0; q < world.n; ++q) {
      if (world.pending_fd(me, q).load() < 0 || remote.peer_failure(q).empty()) continue;
      remote.replace_peer(q, world.pending_fd(me, q).exchange(-1));
      ++incarnation[static_cast<size_t>(q)];
    }
  }
  // Call c, checked: an allgather against value(), a barrier against the entry counters.
  void call(int c) {
    const size_t bytes = size_of(c);
    if (c % 3 == 2) {
      world.entered[static_cast<size_t>(me)] = c;
      coll.barrier();
      for (int r = 0; r < world.n; ++r)
        ASSERT_GE(world.entered[static_cast<size_t>(r)].load(), c)
            << "rank " << me << " left barrier " << c << " before rank " << r << " entered";
      return;
    }
    std::vector<char> in(bytes), out(bytes * static_cast<size_t>(world.n), 0);
    for (size_t i = 0; i < bytes; ++i) in[i] = value(me, c, i);
    coll.allgather(in.data(), out.data(), bytes);
    for (int r = 0; r < world.n; ++r)
      for (size_t i = 0; i < bytes; ++i)
        ASSERT_EQ(out[static_cast<size_t>(r) * bytes + i], value(r, c, i))
            << "rank " << me << ", call " << c << ", from rank " << r << ", byte " << i;
  }
  World& world;
  int me;
  TcpRemote remote;
  std::vector<uint32_t> incarnation;
  bool may_take = true;
  MeshCollective coll;
};

// A rank's thread: an exception (a collective's error where none may be) is a test failure.
template <typename Fn>
std::thread rank_thread(Fn fn) {
  return std::thread([fn] {
    try {
      fn();
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  });
}

void jitter(std::mt19937& rng) {
  if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
}

void every_call_right(std::vector<int> hosts, int calls) {
  World w(std::move(hosts));
  std::vector<std::thread> threads;
  for (int r = 0; r < w.n; ++r)
    threads.push_back(rank_thread([&, r] {
      Rank me(w, r, w.fds[static_cast<size_t>(r)],
              std::vector<uint32_t>(static_cast<size_t>(w.n), 0));
      std::mt19937 rng(static_cast<unsigned>(r) + 5);
      for (int c = 0; c < calls && !::testing::Test::HasFailure(); ++c) {
        jitter(rng);
        me.call(c);
      }
    }));
  for (auto& t : threads) t.join();
}

TEST(MeshCollective, EveryCallMatchesTheReference) { every_call_right({0, 0, 1, 1, 2, 2}, 300); }

TEST(MeshCollective, UnevenHostsToo) {  // forwarders by local index modulo the next host's size
  every_call_right({0, 0, 0, 1, 2, 2}, 150);
  every_call_right({0, 1}, 150);
}

// Host 2 (ranks 4, 5) lost after 30 calls: each live rank's next 3 calls fail, named, at once;
// then each takes the replacement host (incarnation 1) at its own time, and 90 calls of all six
// ranks are right. Repeated to vary the interleavings.
void lose_and_replace_host(unsigned seed) {
  World w({0, 0, 1, 1, 2, 2});
  const std::vector<uint32_t> zero(6, 0), back{0, 0, 0, 0, 1, 1};
  std::atomic<int> lost_seen{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.push_back(rank_thread([&, r] {
      Rank me(w, r, w.fds[static_cast<size_t>(r)], zero);
      me.may_take = false;  // until after the 3 calls that must fail, named
      std::mt19937 rng(seed * 7 + static_cast<unsigned>(r));
      for (int c = 0; c < 30 && !::testing::Test::HasFailure(); ++c) me.call(c);
      while (lost_seen.load() == 0) std::this_thread::yield();
      const size_t sizes[3] = {20000, 7, 0};
      for (size_t s : sizes) {
        std::vector<char> in(s, 1), out(s * 6);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          me.coll.allgather(in.data(), out.data(), s);
          ADD_FAILURE() << "rank " << r << ": an allgather with host 2 lost completed";
        } catch (const PeerFailedError& e) {
          const std::string what = e.what();
          EXPECT_TRUE(what.find("rank 4") != std::string::npos ||
                      what.find("rank 5") != std::string::npos)
              << what;
          EXPECT_NE(what.find("in group allgather #"), std::string::npos) << what;
        }
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
        jitter(rng);
      }
      me.may_take = true;
      for (int c = 100; c < 190 && !::testing::Test::HasFailure(); ++c) {
        jitter(rng);
        me.call(c);
      }
    }));
  std::vector<std::thread> host2;
  for (int r = 4; r < 6; ++r)
    host2.push_back(rank_thread([&, r] {
      Rank me(w, r, w.fds[static_cast<size_t>(r)], zero);
      for (int c = 0; c < 30 && !::testing::Test::HasFailure(); ++c) me.call(c);
      for (int fd : w.fds[static_cast<size_t>(r)])
        if (fd >= 0) shutdown(fd, SHUT_RDWR);  // lost: nothing more is said
    }));
  for (auto& t : host2) t.join();
  // The replacement host: new connections to the live ranks, taken by each at its next call.
  std::vector<std::vector<int>> fresh(6, std::vector<int>(6, -1));
  for (int r = 4; r < 6; ++r)
    for (int q = 0; q < 4; ++q) {
      w.connect(r, q, fresh);
      w.pending_fd(q, r) = fresh[static_cast<size_t>(q)][static_cast<size_t>(r)];
    }
  lost_seen = 1;
  for (int r = 4; r < 6; ++r)
    threads.push_back(rank_thread([&, r] {
      Rank me(w, r, fresh[static_cast<size_t>(r)], back);
      std::mt19937 rng(seed * 11 + static_cast<unsigned>(r));
      for (int c = 100; c < 190 && !::testing::Test::HasFailure(); ++c) {
        jitter(rng);
        me.call(c);
      }
    }));
  for (auto& t : threads) t.join();
}

TEST(MeshCollectiveStress, AHostLostThenReplacedEveryCallInOneView) {
  for (unsigned seed = 1; seed <= 6 && !::testing::Test::HasFailure(); ++seed)
    lose_and_replace_host(seed);
}

// A rank that never calls is a TimeoutError at the bound naming it; one that passes other bytes
// is an InvalidArgument naming both sizes.
TEST(MeshCollective, ASilentRankAndOtherBytesAreNamed) {
  {
    World w({0, 1});
    Rank a(w, 0, w.fds[0], {0, 0}, std::chrono::milliseconds(300));
    TcpRemote b(1, w.fds[1]);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      a.coll.barrier();
      ADD_FAILURE() << "a barrier without rank 1 completed";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("group barrier #1 waiting for rank 1"),
                std::string::npos)
          << e.what();
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(took, std::chrono::milliseconds(290));
    EXPECT_LT(took, std::chrono::seconds(2));
  }
  World w({0, 1});
  std::string said[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.push_back(rank_thread([&, r] {
      Rank me(w, r, w.fds[static_cast<size_t>(r)], {0, 0}, std::chrono::seconds(2));
      std::vector<char> in(8 * static_cast<size_t>(r + 1)), out(in.size() * 2);
      try {
        me.coll.allgather(in.data(), out.data(), in.size());
      } catch (const InvalidArgument& e) {
        said[r] = e.what();
      }
    }));
  for (auto& t : threads) t.join();
  EXPECT_NE(said[0].find("rank 1 passed 16 bytes, this rank (0) expected 8"), std::string::npos)
      << said[0];
  EXPECT_NE(said[1].find("rank 0 passed 8 bytes, this rank (1) expected 16"), std::string::npos)
      << said[1];
}

}  // namespace
}  // namespace ubep::bootstrap
