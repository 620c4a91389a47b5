// ubep-sim's max-min network against SimGrid's (its LMM solver, CM02 model: bandwidth and
// latency factors 1, no cross traffic, zero latencies, so SimGrid shares bandwidth by pure
// max-min). Random flow sets on a cm384-like machine (per-worker copy engines, one UB port per
// die each way) and on a two-level fat tree (oversubscribed leaf uplinks, ECMP by hash); every
// flow's finish time must agree within 1%. SimGrid allows one engine per process, so each flow
// set runs in a forked child that writes its finish times back through a pipe.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "maxmin_reference.hpp"
#include "sim/engine.hpp"

#ifdef UBEP_HAVE_SIMGRID
#include <sys/wait.h>
#include <unistd.h>

#include <simgrid/s4u.hpp>
#endif

using namespace ubep::sim;
using ubep::sim::reference::RefFlow;

namespace {

// "h3": built by appending (`"h" + std::to_string(3)` trips GCC 12's -Wrestrict, bug 105329).
template <typename Int>
std::string numbered(char prefix, Int i) {
  std::string s(1, prefix);
  s += std::to_string(i);
  return s;
}

struct FlowSet {
  std::vector<double> capacity;  // bytes per ns
  std::vector<RefFlow> flows;
  std::vector<std::pair<int, int>> ends;  // per flow: (source host, destination host)
  int hosts = 0;
};

// cm384-like: `ranks` dies, each with `workers` copy engines of 33.3 B/ns and one 392 B/ns port
// each way; a flow is (engine, sender port, receiver port).
FlowSet cm384_like(std::mt19937_64& rng, int ranks, int workers, int n) {
  FlowSet s;
  const int per_rank = workers + 2;
  for (int r = 0; r < ranks; ++r) {
    for (int w = 0; w < workers; ++w) s.capacity.push_back(1600.0 / 48);
    s.capacity.push_back(392);  // tx
    s.capacity.push_back(392);  // rx
  }
  s.hosts = ranks * workers + ranks;  // one source host per engine, one receiver host per die
  std::uniform_int_distribution<int> rank(0, ranks - 1), worker(0, workers - 1);
  for (int i = 0; i < n; ++i) {
    const int src = rank(rng), w = worker(rng);
    int dst = rank(rng);
    if (dst == src) dst = (dst + 1) % ranks;
    RefFlow f;
    f.path = {src * per_rank + w, src * per_rank + workers, dst * per_rank + workers + 1};
    f.bytes = static_cast<double>(1024 + rng() % (1 << 20));
    f.start = static_cast<double>(rng() % 8) * 2000.0;  // shared instants and staggered starts
    s.flows.push_back(f);
    s.ends.emplace_back(src * workers + w, ranks * workers + dst);
  }
  return s;
}

// Two-level fat tree: `leaves` leaf switches of `hosts_per_leaf` hosts (host links 100 each
// way), `spines` spines, one 200 B/ns link per leaf-spine pair and direction (oversubscribed
// when hosts_per_leaf * 100 > spines * 200). A cross-leaf flow takes the spine its pair hashes to.
FlowSet fat_tree(std::mt19937_64& rng, int leaves, int hosts_per_leaf, int spines, int n) {
  FlowSet s;
  const int H = leaves * hosts_per_leaf;
  for (int h = 0; h < 2 * H; ++h) s.capacity.push_back(100);                // up, down per host
  for (int k = 0; k < 2 * leaves * spines; ++k) s.capacity.push_back(200);  // leaf->spine, back
  auto up = [](int h) { return 2 * h; };
  auto down = [](int h) { return 2 * h + 1; };
  auto leaf_up = [&](int leaf, int sp) { return 2 * H + 2 * (leaf * spines + sp); };
  auto leaf_down = [&](int leaf, int sp) { return 2 * H + 2 * (leaf * spines + sp) + 1; };
  s.hosts = H;
  std::uniform_int_distribution<int> host(0, H - 1);
  for (int i = 0; i < n; ++i) {
    const int src = host(rng);
    int dst = host(rng);
    if (dst == src) dst = (dst + 1) % H;
    RefFlow f;
    const int ls = src / hosts_per_leaf, ld = dst / hosts_per_leaf;
    if (ls == ld) {
      f.path = {up(src), down(dst)};
    } else {
      const int sp = (src * 31 + dst * 17) % spines;
      f.path = {up(src), leaf_up(ls, sp), leaf_down(ld, sp), down(dst)};
    }
    f.bytes = static_cast<double>(1024 + rng() % (1 << 20));
    f.start = static_cast<double>(rng() % 8) * 3000.0;
    s.flows.push_back(f);
    s.ends.emplace_back(src, dst);
  }
  return s;
}

std::vector<double> engine_finish(const FlowSet& s) {
  EventQueue q;
  Network net(q);
  for (double c : s.capacity) net.add_link(c);
  std::vector<double> finish(s.flows.size(), -1);
  for (size_t i = 0; i < s.flows.size(); ++i)
    q.at(s.flows[i].start, [&, i] {
      net.start_flow(s.flows[i].path, s.flows[i].bytes, 0, [&, i] { finish[i] = q.now(); });
    });
  q.run();
  return finish;
}

#ifdef UBEP_HAVE_SIMGRID
// Runs in the forked child: SimGrid's time unit is the second and ours the nanosecond, so
// capacities (bytes per ns) are taken as bytes per second and times read back as they are.
void simgrid_child(const FlowSet& s, int out_fd) {
  std::vector<std::string> args = {"oracle", "--cfg=network/model:CM02",
                                   "--cfg=network/crosstraffic:0", "--log=root.thres:critical"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  simgrid::s4u::Engine e(&argc, argv.data());
  auto* zone = simgrid::s4u::create_full_zone("pod");
  std::vector<simgrid::s4u::Host*> hosts;
  for (int h = 0; h < s.hosts; ++h) hosts.push_back(zone->create_host(numbered('h', h), 1e9));
  std::vector<simgrid::s4u::Link*> links;
  for (size_t l = 0; l < s.capacity.size(); ++l)
    links.push_back(zone->create_link(numbered('l', l), s.capacity[l])->set_latency(0)->seal());
  std::vector<std::vector<bool>> routed(static_cast<size_t>(s.hosts),
                                        std::vector<bool>(static_cast<size_t>(s.hosts), false));
  for (size_t i = 0; i < s.flows.size(); ++i) {
    const auto [a, b] = s.ends[i];
    if (routed[static_cast<size_t>(a)][static_cast<size_t>(b)]) continue;  // same pair, same path
    routed[static_cast<size_t>(a)][static_cast<size_t>(b)] = true;
    std::vector<simgrid::s4u::LinkInRoute> route;
    for (int l : s.flows[i].path) route.emplace_back(links[static_cast<size_t>(l)]);
    zone->add_route(hosts[static_cast<size_t>(a)]->get_netpoint(),
                    hosts[static_cast<size_t>(b)]->get_netpoint(), nullptr, nullptr, route, false);
  }
  zone->seal();
  std::vector<double> finish(s.flows.size(), -1);
  for (size_t i = 0; i < s.flows.size(); ++i) {
    auto* from = hosts[static_cast<size_t>(s.ends[i].first)];
    auto* to = hosts[static_cast<size_t>(s.ends[i].second)];
    simgrid::s4u::Actor::create(numbered('f', i), from, [&, i, from, to] {
      simgrid::s4u::this_actor::sleep_until(s.flows[i].start);
      simgrid::s4u::Comm::sendto(from, to, static_cast<uint64_t>(s.flows[i].bytes));
      finish[i] = simgrid::s4u::Engine::get_clock();
    });
  }
  e.run();
  const auto bytes = static_cast<ssize_t>(finish.size() * sizeof(double));
  _exit(write(out_fd, finish.data(), static_cast<size_t>(bytes)) == bytes ? 0 : 1);
}

std::vector<double> simgrid_finish(const FlowSet& s) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    simgrid_child(s, fds[1]);
  }
  close(fds[1]);
  std::vector<double> finish(s.flows.size());
  size_t got = 0;
  auto* p = reinterpret_cast<char*>(finish.data());
  const size_t want = finish.size() * sizeof(double);
  while (got < want) {
    const ssize_t n = read(fds[0], p + got, want - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != want || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return {};
  return finish;
}
#endif

// Largest relative difference of the finish times (fails the test when over 1%).
double compare(const FlowSet& s, const std::vector<double>& ours, const std::vector<double>& ref,
               const std::string& what) {
  double worst = 0;
  EXPECT_EQ(ours.size(), ref.size()) << what;
  for (size_t i = 0; i < std::min(ours.size(), ref.size()); ++i) {
    const double err = std::abs(ours[i] - ref[i]) / ref[i];
    worst = std::max(worst, err);
    EXPECT_LT(err, 0.01) << what << " flow " << i << ": ours " << ours[i] << " ns, reference "
                         << ref[i] << " (start " << s.flows[i].start << ", " << s.flows[i].bytes
                         << " B)";
  }
  return worst;
}

}  // namespace

TEST(SimGridOracle, FinishTimesAgreeWithinOnePercent) {
#ifndef UBEP_HAVE_SIMGRID
  GTEST_SKIP() << "SimGrid not found at configure time: install libsimgrid-dev (scripts/deps.sh)";
#else
  std::mt19937_64 rng(2028);
  double worst = 0;
  int sets = 0, flows = 0;
  for (int k = 0; k < 50; ++k) {
    const int n = k % 10 == 0 ? 2000 : 50 + static_cast<int>(rng() % 600);
    const FlowSet s = k % 2 == 0 ? cm384_like(rng, 8 + static_cast<int>(rng() % 24),
                                              4 + static_cast<int>(rng() % 16), n)
                                 : fat_tree(rng, 4, 8, 2, n);
    const auto ref = simgrid_finish(s);
    ASSERT_EQ(ref.size(), s.flows.size()) << "the SimGrid child failed on set " << k;
    worst = std::max(worst, compare(s, engine_finish(s), ref, "set " + std::to_string(k)));
    ++sets;
    flows += n;
  }
  std::printf("SimGrid agreement: %d flow sets, %d flows, max relative error %.3g\n", sets, flows,
              worst);
#endif
}
