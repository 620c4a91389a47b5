// Latency of a TCP group's barrier and allgather (issue 32; docs/ELASTIC.md, "Group barrier and
// allgather"): over the set-up's star through rank 0 (bootstrap::TcpBootstrap, what a TCP group
// used before the mesh) and over the mesh (make_tcp_group's Group::barrier / allgather, two
// rounds between hosts with a forwarder per rank). A benchmark, not a test: no ctest entry, no
// bound. Run with one launcher per host (tcp_hosts.sh vhosts|loopback HOSTS RANKS BIN [ITERS]);
// rank 0 prints per collective and size the median / p90 / max of its own time per call over
// ITERS calls (default 500) after 50 warm-up calls; every allgather's bytes are checked.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bootstrap/tcp_bootstrap.hpp"
#include "host_launcher.hpp"
#include "ubep/error.hpp"
#include "ubep/tcp_group.hpp"

namespace ubep::test {
namespace {

int iters() {
  const char* v = std::getenv("UBEP_BENCH_ITERS");
  return v && std::atoi(v) > 0 ? std::atoi(v) : 500;
}

// Times `op` ITERS times after 50 warm-up calls; rank 0 prints the line.
void timed(int rank, const std::string& what, const std::function<void()>& op) {
  for (int i = 0; i < 50; ++i) op();
  std::vector<double> us(static_cast<size_t>(iters()));
  for (double& t : us) {
    const auto t0 = std::chrono::steady_clock::now();
    op();
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(us.begin(), us.end());
  if (rank == 0)
    std::printf("%-28s median %8.1f  p90 %8.1f  max %9.1f us  (n %zu)\n", what.c_str(),
                us[us.size() / 2], us[us.size() * 9 / 10], us.back(), us.size());
  std::fflush(stdout);
}

// The barrier, then allgathers of 8 B, 1 KiB and 64 KiB per rank (bytes checked).
void suite(const std::string& path, int rank, int size, const std::function<void()>& barrier,
           const std::function<void(const void*, void*, size_t)>& allgather) {
  timed(rank, path + " barrier", barrier);
  for (size_t n : {size_t{8}, size_t{1024}, size_t{65536}}) {
    std::vector<char> in(n, static_cast<char>(rank + 1)), out(n * static_cast<size_t>(size));
    timed(rank, detail::concat(path, " allgather ", n, " B"), [&] {
      allgather(in.data(), out.data(), n);
      for (int r = 0; r < size; ++r)
        UBEP_CHECK(out[static_cast<size_t>(r) * n + n - 1] == static_cast<char>(r + 1), Error, path,
                   " allgather: rank ", r, "'s bytes are wrong");
    });
  }
}

int rank_main(int local_rank) {
  TcpLaunch launch = TcpLaunch::from_env(local_rank);
  try {
    {
      bootstrap::TcpBootstrap star(launch, std::chrono::seconds(20));
      suite(
          "star (set-up's, via rank 0)", star.rank(), star.size(), [&] { star.barrier(); },
          [&](const void* in, void* out, size_t n) { star.allgather(in, out, n); });
    }
    // The group on the next port: the star's listener may still be closing.
    const size_t colon = launch.rendezvous.rfind(':');
    launch.rendezvous = detail::concat(launch.rendezvous.substr(0, colon), ":",
                                       std::atoi(launch.rendezvous.c_str() + colon + 1) + 1);
    GroupOptions opts;
    opts.timeout = std::chrono::seconds(20);
    std::unique_ptr<Group> g = make_tcp_group(launch, opts);
    suite(
        "mesh (TcpGroup)", g->rank(), g->size(), [&] { g->barrier(); },
        [&](const void* in, void* out, size_t n) { g->allgather(in, out, n); });
    g->barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", launch.rank(), e.what());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ubep::test

int main() { return ubep::test::run_host_ranks(ubep::test::rank_main); }
