// A 10,000-call soak on process ranks (ctest mpi_soak_np4): bsp and ubep alternating on one
// Buffer, both layouts, changing routing and token counts, random 0-200 us delays on random
// ranks before a call. Every 25th call (and the first 20) is checked against the reference
// through the test harness; the others run the same path unchecked. Then: resident memory is
// flat (last quarter vs first quarter) and no ubep segment of this process is in /dev/shm.
// Usage: test_mpi_soak [calls]
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "harness.hpp"
#include "mpi_gtest_main.hpp"
#include "ubep/error.hpp"
#include "ubep/mpi_group.hpp"

namespace ubep::test {
namespace {

long g_calls = 10000;

// Resident set size in KiB (VmRSS of /proc/self/status).
long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string key;
  long value = 0;
  while (f >> key) {
    if (key == "VmRSS:") {
      f >> value;
      return value;
    }
    std::getline(f, key);
  }
  return -1;
}

std::vector<std::string> my_segments() {
  std::vector<std::string> out;
  const std::string prefix = "ubep-" + std::to_string(getpid()) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.emplace_back(e->d_name);
    closedir(d);
  }
  return out;
}

// One unchecked call: dispatch, the harness's expert (expert_fn), combine.
void run_unchecked(Buffer& b, const Case& c, const Problem& p, int me) {
  const RankInput& in = p.inputs[static_cast<size_t>(me)];
  const DispatchResult r = b.dispatch(in.args(c.dtype, c.hidden, c.layout));
  // The harness's expert on every element of recv_x (rows outside the ranges are ignored).
  const int El = b.num_local_experts();
  const int64_t per_expert = c.layout == Layout::kLatency ? r.recv_x.dim(1) * c.hidden : 0;
  std::vector<char> out(r.recv_x.bytes());
  for (int64_t i = 0; i < r.recv_x.numel(); ++i) {
    const int64_t which = per_expert ? me * El + i / per_expert : me;
    store_value(out.data(), i, expert_fn(load_value(r.recv_x.data, i, c.dtype), which), c.dtype);
  }
  CombineArgs ca;
  ca.handle = r.handle;
  ca.x = r.recv_x;
  ca.x.data = out.data();
  b.combine(ca);
}

TEST(ProcessRanksSoak, TenThousandCallsFlatMemoryNoLeftovers) {
  Group& g = *g_group;
  const int me = g.rank();
  Case c;
  c.experts = 2 * g.size();
  c.hidden = 16;
  c.capacity = 8;
  c.topk = 2;
  c.dtype = DType::kBF16;
  BufferConfig cfg = config_for(c, Algorithm::kUbep);
  cfg.num_workers = 0;  // 4 processes on 2 cores: the caller alone
  Buffer b(g, cfg);
  // Set-up is over: every segment name is unlinked already.
  EXPECT_TRUE(my_segments().empty()) << "after set-up: " << my_segments()[0];
  std::vector<Problem> problems;
  for (int i = 0; i < 32; ++i) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < g.size(); ++r) tokens.push_back((i * 5 + r * 3) % (c.capacity + 1));
    problems.push_back(make_problem(g.size(), c.experts, c.hidden, c.dtype, tokens, c.topk,
                                    i % 3 ? Routing::kWithDrops : Routing::kHot,
                                    1000 + static_cast<uint64_t>(i)));
  }
  // The same seed on every rank: all agree on which rank sleeps how long in each call.
  std::mt19937 rng(2024);
  const long quarter = g_calls / 4;
  long rss_first = 0, rss_last = 0;
  for (long i = 0; i < g_calls; ++i) {
    const Algorithm algo = i % 2 ? Algorithm::kBsp : Algorithm::kUbep;
    c.layout = (i / 2) % 2 ? Layout::kLatency : Layout::kThroughput;
    const int sleeper = static_cast<int>(rng() % static_cast<unsigned>(g.size()));
    const auto delay_us = static_cast<int>(rng() % 201);
    if (rng() % 4 == 0 && sleeper == me)
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    b.set_algorithm(algo);
    const Problem& p = problems[static_cast<size_t>(i) % problems.size()];
    if (i < 20 || i % 25 == 0) {
      run_and_check(g, c, p, &b, nullptr, i % 50 == 0);
    } else {
      run_unchecked(b, c, p, me);
    }
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "stopped at call " << i;
      return;
    }
    // Peak RSS over the second half of the first quarter (after warm-up) and over the last
    // quarter.
    if (i % 64 == 0 && i >= quarter / 2 && i < quarter) rss_first = std::max(rss_first, rss_kib());
    if (i % 64 == 0 && i >= 3 * quarter) rss_last = std::max(rss_last, rss_kib());
  }
  // Everything the calls use is allocated when the Buffer is made, so resident memory must
  // not grow with the number of calls. 512 KiB is page-granular noise (a few pages of malloc
  // arenas and stacks) and catches a leak of ~100 bytes per call over the 5,000+ calls between
  // the two windows. Under AddressSanitizer RSS grows with its quarantine by design; there
  // LeakSanitizer checks for leaks at exit instead.
#if defined(__SANITIZE_ADDRESS__)
  const bool check_rss = false;
#else
  const bool check_rss = true;
#endif
  std::printf("rank %d: %ld calls, VmRSS first quarter %ld KiB, last quarter %ld KiB\n", me,
              g_calls, rss_first, rss_last);
  if (check_rss && g_calls >= 4000) {
    EXPECT_LE(rss_last - rss_first, 512)
        << "VmRSS grew from " << rss_first << " to " << rss_last << " KiB";
  }
  EXPECT_TRUE(my_segments().empty()) << "left in /dev/shm: " << my_segments()[0];
}

}  // namespace
}  // namespace ubep::test

int main(int argc, char** argv) {
  // The number of calls: the first argument GoogleTest leaves (default 10,000).
  return ubep::test::mpi_gtest_main(argc, argv, /*with_world_group=*/true, [](int n, char** v) {
    if (n > 1) ubep::test::g_calls = std::atol(v[1]);
  });
}
