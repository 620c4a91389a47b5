// kill -9 of a rank while its peers wait outside any call (issue 29), run by
// test_mpi_kill_wait.sh under mpirun with recovery on. Usage:
//   test_mpi_kill_wait <dir> <barrier|allgather|setup|expert_layer> <timeout_ms> [ranks_per_host]
// Every rank loops on one kind of group wait:
//   barrier    Group::barrier (one host: the shared-memory flag barrier; across hosts: the MPI
//              bootstrap's MPI_Ibarrier, with deaths forwarded between hosts);
//   allgather  Group::allgather, the set-up exchange (MPI_Iallgather);
//   setup      a Buffer made and dropped (its windows' exchanges of segment names and status);
//   expert_layer  a dispatch, then the tile-overlap expert layer (src/moe) on its rows: the last
//              rank dies between its dispatch and its layer run (its rows are out), so the
//              survivors wait in the layer for its expert outputs (one host only).
// The last rank SIGKILLs itself after a few ms of that loop, writing the kill's CLOCK_MONOTONIC
// time first (<dir>/killed_at; the clock is the machine's, shared by virtual hosts). Every
// survivor writes <dir>/result.<rank>: "<error kind> <ms from the kill to the error> <what()>".
// The driver asserts that each survivor got PeerFailedError naming the dead rank; with a long
// timeout, the old behaviour (a TimeoutError after timeout_ms) fails it.
#include <mpi.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "host_kill.hpp"
#include "ubep/buffer.hpp"
#include "ubep/error.hpp"
#ifdef UBEP_TEST_HAVE_MOE
#include "ubep/moe.hpp"
#endif
#include "ubep/mpi_group.hpp"

namespace {

using namespace ubep;

double monotonic_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

const char* error_kind(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const PeerFailedError*>(&e)) return "PeerFailedError";
  return "other";
}

void kill_self(const std::string& dir) {
  char t[64];
  std::snprintf(t, sizeof t, "%.3f\n", monotonic_ms());
  std::ofstream(dir + "/killed_at") << t << std::flush;
  kill(getpid(), SIGKILL);
}

#ifdef UBEP_TEST_HAVE_MOE
// One dispatch and one expert-layer run; the last rank, `kill_after` ms into the loop, dies in
// between (its rows reached the others; its expert outputs never will).
class ExpertLayerLoop {
 public:
  explicit ExpertLayerLoop(Group& g)
      : g_(g), buffer_(g, buffer_config(g)), layer_(g, layer_config(g)) {}
  void once(long i, bool victim, const std::string& dir) {
    const moe::RouterOutput r = moe::route(moe::RouterMode::kBalanced, 2 * g_.size(), kTopk,
                                           kTokens, static_cast<uint64_t>(i));
    std::vector<float> x(static_cast<size_t>(kTokens * kHidden),
                         1.0f + static_cast<float>(g_.rank()));
    DispatchArgs a;
    a.x = TensorView(x.data(), DType::kFP32, {kTokens, kHidden});
    a.topk_idx =
        TensorView(const_cast<int64_t*>(r.topk_idx.data()), DType::kInt64, {kTokens, kTopk});
    a.topk_weights =
        TensorView(const_cast<float*>(r.topk_weights.data()), DType::kFP32, {kTokens, kTopk});
    a.layout = Layout::kThroughput;
    DispatchResult d = buffer_.dispatch(a);
    // The victim dies only where its death must meet the layer's own waits: after every rank's
    // dispatch has returned (the barrier), and in a call whose routing (the same on every rank:
    // seeded by i) sends tokens to the victim's experts, so every survivor waits for its
    // outputs. Without both, a survivor could learn of the death in its dispatch, or in the next
    // call's (seen in CI, and 1 of 25 runs here), and the layer's waits went untested.
    const int last = g_.size() - 1;
    const bool needs_last = std::any_of(r.topk_idx.begin(), r.topk_idx.end(),
                                        [&](int64_t e) { return e >= 0 && e / 2 == last; });
    g_.barrier();
    if (victim && needs_last) kill_self(dir);
    const moe::TileFn copy = [](const moe::TileTask& t) {
      for (int64_t row = 0; row < t.rows; ++row)
        std::memcpy(t.out + row * t.out_ld, t.in + row * t.in_ld, kHidden * sizeof(float));
    };
    layer_.run(d, a.topk_idx, a.topk_weights, copy, moe::Schedule::kOverlapped);
  }

 private:
  static constexpr int64_t kTokens = 4, kHidden = 8;
  static constexpr int kTopk = 2;
  static BufferConfig buffer_config(Group& g) {
    BufferConfig c;
    c.max_tokens_per_rank = kTokens;
    c.hidden = kHidden;
    c.dtype = DType::kFP32;
    c.num_experts = 2 * g.size();
    c.max_topk = kTopk;
    c.placement = Placement::kCompact;  // the layer reads each expert's rows from slot 0
    return c;
  }
  static moe::ExpertLayerConfig layer_config(Group& g) {
    moe::ExpertLayerConfig c;
    c.max_tokens_per_rank = kTokens;
    c.hidden = kHidden;
    c.dtype = DType::kFP32;
    c.num_experts = 2 * g.size();
    c.max_topk = kTopk;
    return c;
  }
  Group& g_;
  Buffer buffer_;
  moe::ExpertLayer layer_;
};
#endif

void wait_once(Group& g, const std::string& mode, long i) {
  if (mode == "barrier") {
    g.barrier();
  } else if (mode == "allgather") {
    const long mine = i * 1000 + g.rank();
    std::vector<long> all(static_cast<size_t>(g.size()));
    g.allgather(&mine, all.data(), sizeof mine);
    for (int r = 0; r < g.size(); ++r)
      if (all[static_cast<size_t>(r)] != i * 1000 + r)
        throw std::runtime_error("allgather returned a wrong value");
  } else {
    BufferConfig cfg;
    cfg.max_tokens_per_rank = 4;
    cfg.hidden = 8;
    cfg.dtype = DType::kFP32;
    cfg.num_experts = 2 * g.size();
    cfg.max_topk = 2;
    cfg.num_workers = 0;
    Buffer b(g, cfg);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr,
                 "usage: %s <dir> <barrier|allgather|setup|expert_layer> <timeout_ms> "
                 "[ranks_per_host]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1], mode = argv[2];
  if (mode != "barrier" && mode != "allgather" && mode != "setup" && mode != "expert_layer") {
    std::fprintf(stderr, "unknown mode '%s' (barrier, allgather, setup, expert_layer)\n",
                 mode.c_str());
    return 2;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int me = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::ofstream(dir + "/pid." + std::to_string(me)) << getpid() << "\n";
  GroupOptions opts;
  opts.timeout = std::chrono::milliseconds(std::stoi(argv[3]));
  if (argc == 5) opts.ranks_per_host = std::stoi(argv[4]);
  auto group = make_mpi_group(MPI_COMM_WORLD, opts);
  std::ofstream(dir + "/hosts." + std::to_string(me)) << group->num_hosts() << "\n";
  MPI_Barrier(MPI_COMM_WORLD);  // the group is made: the kill lands in the loop below

  // UBEP_KILL_WAIT_WHOLE_HOST=1 (issue 32): the last rank SIGKILLs every rank of its host (their
  // pids from <dir>/pid.*), then itself: nobody is left there to forward the deaths.
  const bool whole_host = std::getenv("UBEP_KILL_WAIT_WHOLE_HOST") != nullptr;
  if (me == ranks - 1 && mode != "expert_layer") {  // expert_layer: the loop kills
    std::vector<pid_t> mates;
    for (int r = 0; whole_host && r < ranks - 1; ++r)
      if (group->host_of(r) == group->host_of(me)) {
        std::ifstream in(dir + "/pid." + std::to_string(r));
        pid_t p = 0;
        if (in >> p) mates.push_back(p);
      }
    std::thread([dir, mates] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      char t[64];
      std::snprintf(t, sizeof t, "%.3f\n", monotonic_ms());
      std::ofstream(dir + "/killed_at") << t << std::flush;
      ubep_test::kill_host(mates);
    }).detach();
  }
  std::string result = "none";
  long i = 0;
  try {
    if (mode == "expert_layer") {
#ifndef UBEP_TEST_HAVE_MOE
      throw std::runtime_error("built without the expert layer (UBEP_WITH_EXTRAS=OFF)");
#else
      ExpertLayerLoop loop(*group);
      const double start = monotonic_ms();
      for (; i < 100000000; ++i) loop.once(i, me == ranks - 1 && monotonic_ms() - start > 50, dir);
#endif
    }
    for (; i < 100000000; ++i) wait_once(*group, mode, i);
  } catch (const std::exception& e) {
    const double at = monotonic_ms();
    std::string what = e.what();
    for (char& c : what)
      if (c == '\n') c = ' ';
    char head[96];
    std::snprintf(head, sizeof head, "%s %.3f ", error_kind(e), at);
    result = head + what;
    std::fprintf(stderr, "rank %d after %ld waits: %s\n", me, i, e.what());
  }
  ubep_test::hold_if_host_kill_started();  // the victim's own result: never written
  {
    std::ofstream out(dir + "/result." + std::to_string(me) + ".tmp");
    out << result << "\n";
  }
  std::rename((dir + "/result." + std::to_string(me) + ".tmp").c_str(),
              (dir + "/result." + std::to_string(me)).c_str());
  // Stay until every survivor has its result: an early exit would be a death its host-mates see
  // (and may report first). Bounded: 20 s, then the driver finds the missing result.
  for (int r = 0, tries = 0; r < ranks - 1 && tries < 20000; ++tries)
    if (access((dir + "/result." + std::to_string(r)).c_str(), F_OK) == 0)
      ++r;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // No MPI_Finalize: it would wait for the dead rank. No destructors either (they would wait).
  std::fflush(nullptr);
  _exit(0);
}
