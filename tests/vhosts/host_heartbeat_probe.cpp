// One host's heartbeat (bootstrap::HostHeartbeat) for the lost-host trials on virtual hosts
// (tests/vhosts/host_loss_trials.sh): host h (0-based) binds PREFIX.(h+1):PORT and beats to every
// other host; each loss is printed with the CLOCK_REALTIME it was judged (the namespaces share
// the clock), so the driver subtracts the time it made the fault.
// Usage: host_heartbeat_probe SELF HOSTS PREFIX PORT PERIOD_MS THRESHOLD_MS SECONDS
#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "bootstrap/host_heartbeat.hpp"

namespace {
double realtime_s() {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s SELF HOSTS PREFIX PORT PERIOD_MS THRESHOLD_MS SECONDS\n",
                 argv[0]);
    return 2;
  }
  int self = std::atoi(argv[1]), hosts = std::atoi(argv[2]);
  std::string prefix = argv[3];
  auto port = static_cast<uint16_t>(std::atoi(argv[4]));
  ubep::bootstrap::HostHeartbeat::Options opt;
  opt.period = std::chrono::milliseconds(std::atoi(argv[5]));
  opt.threshold = std::chrono::milliseconds(std::atoi(argv[6]));
  int seconds = std::atoi(argv[7]);
  ubep::bootstrap::HostHeartbeat hb(self, hosts, prefix + "." + std::to_string(self + 1), port,
                                    opt);
  std::vector<ubep::bootstrap::HostHeartbeat::Peer> peers;
  for (int h = 0; h < hosts; ++h)
    if (h != self) peers.push_back({h, prefix + "." + std::to_string(h + 1), port});
  std::atomic<int> lost{0};
  hb.start(peers, [&](int host, std::chrono::nanoseconds silent) {
    std::printf("host %d: lost host %d silent_ms %.1f at %.6f\n", self, host, silent.count() / 1e6,
                realtime_s());
    std::fflush(stdout);
    lost.fetch_add(1);
  });
  std::printf("ready host %d\n", self);
  std::fflush(stdout);
  bool all_heard = false;
  for (int i = 0; i < seconds * 1000 && lost.load() < hosts - 1; ++i) {
    if (!all_heard) {
      all_heard = true;
      for (int h = 0; h < hosts; ++h) all_heard = all_heard && (h == self || hb.heard(h));
      if (all_heard) {
        std::printf("heard all host %d\n", self);  // the driver makes its fault after these
        std::fflush(stdout);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return 0;
}
