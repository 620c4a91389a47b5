// Failure semantics on process ranks under mpirun (ctest runs it with 2 and 4 processes): one
// rank skips, rejects or throws (fault_scenario.hpp); one rank passes a different layout; a
// config rejected on one rank gives every rank a clear error instead of leaving its peers in
// MPI_Allgather forever.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

#include "expect_invalid.hpp"
#include "fault_scenario.hpp"
#include "mpi_gtest_main.hpp"
#include "ubep/mpi_group.hpp"

namespace ubep::test {
namespace {

void mpi_sync() { MPI_Barrier(MPI_COMM_WORLD); }
bool mpi_any(bool v) {
  int mine = v ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0;
}

struct FaultParam {
  Algorithm algo;
  Fault fault;
};

class ProcessRankFails : public ::testing::TestWithParam<FaultParam> {};

TEST_P(ProcessRankFails, PeersNameItLaterCallsAreBrokenFreshBufferWorks) {
  const FaultParam fp = GetParam();
  GroupOptions opts;
  opts.timeout =
      timed(fp.fault) ? std::chrono::milliseconds(500) : std::chrono::milliseconds(20000);
  // UBEP_TEST_RANKS_PER_HOST=N (ctest mpi_faults_np4_2hosts): forced hosts of N ranks, TCP
  // between them; the victim's failure word must reach the other host's ranks as a notice, or
  // they wait in the relay for its part until the 20 s timeout (issue 32).
  if (const char* per_host = std::getenv("UBEP_TEST_RANKS_PER_HOST"))
    opts.ranks_per_host = std::atoi(per_host);
  auto g = make_mpi_group(MPI_COMM_WORLD, opts);
  const int victim = g->size() - 1;
  const Layout layout = fp.fault == Fault::kThrow ? Layout::kLatency : Layout::kThroughput;
  run_fault_scenario(*g, fp.algo, fp.fault, victim, layout, mpi_sync, mpi_any);
}

std::vector<FaultParam> fault_params() {
  std::vector<FaultParam> ps;
  for (Algorithm a : {Algorithm::kBsp, Algorithm::kUbep})
    for (Fault f : {Fault::kSkip, Fault::kRejectDispatch, Fault::kRejectCombine, Fault::kThrow})
      ps.push_back({a, f});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(All, ProcessRankFails, ::testing::ValuesIn(fault_params()),
                         [](const auto& i) {
                           return std::string(algorithm_name(i.param.algo)) + "_" +
                                  fault_name(i.param.fault);
                         });

// Issue 22 on process ranks: one rank passes latency, the others throughput, to one dispatch
// (default placement: per-source against compact), plain and split-phase. Every rank gets
// InvalidArgument naming a rank that differs, long before the timeout, and the same Buffer then
// runs matched calls that are checked against the reference.
TEST(ProcessMismatchedCall, ThroughputAgainstLatencyNamedPromptlyBufferUsable) {
  GroupOptions opts;
  opts.timeout = std::chrono::milliseconds(4000);
  auto g = make_mpi_group(MPI_COMM_WORLD, opts);
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep})
    for (bool split : {false, true}) {
      if (split && algo != Algorithm::kUbep) continue;
      for (int latency_rank : {1, 0})
        run_mismatch_scenario(*g, algo, latency_rank, split, std::chrono::milliseconds(1000));
    }
}

// Rank 1 passes a bad config: it names the value, every other rank names rank 1, within a
// bound (before: the peers blocked in MPI_Allgather forever). Then a good Buffer works.
TEST(ProcessConfigRejected, OneRankRejectsEveryRankGetsAClearError) {
  GroupOptions opts;
  opts.timeout = std::chrono::milliseconds(5000);
  auto g = make_mpi_group(MPI_COMM_WORLD, opts);
  Case c = fault_case(g->size(), Layout::kThroughput);
  BufferConfig cfg = config_for(c, Algorithm::kUbep);
  if (g->rank() == 1) cfg.num_experts = 2 * g->size() + 1;
  const std::string value = "num_experts " + std::to_string(2 * g->size() + 1);
  const auto t0 = std::chrono::steady_clock::now();
  if (g->rank() == 1)
    expect_invalid([&] { Buffer b(*g, cfg); }, value);
  else
    expect_invalid([&] { Buffer b(*g, cfg); }, {"rank 1 rejected its config", value});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(3000));
  const Problem p = all_ranks_problem(c, g->size(), 77);
  Buffer b(*g, config_for(c, Algorithm::kBsp));
  run_and_check(*g, c, p, &b, nullptr);
}

}  // namespace
}  // namespace ubep::test

int main(int argc, char** argv) {
  // Each test builds its own group, with the timeout its fault needs.
  return ubep::test::mpi_gtest_main(argc, argv, /*with_world_group=*/false);
}
