// The benchmark behind ubep-bench and the demo: MPI baseline, bsp, ubep and the copy bound,
// measured in one run on one group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ubep/buffer.hpp"
#include "ubep/group.hpp"

namespace ubep::tools {

struct BenchOptions {
  std::string workload = "decode";  // decode | prefill | tiny (DESIGN.md §4)
  int64_t tokens = 128;
  int64_t hidden = 7168;
  int topk = 8;
  int experts = 256;
  DType dtype = DType::kBF16;
  Layout layout = Layout::kLatency;
  std::vector<std::string> algos{"mpi", "bsp", "ubep"};
  std::vector<SyncMode> syncs{SyncMode::kFused};  // variants of the ubep algorithm to run
  std::string routing = "uniform";                // uniform | hot
  int iters = 50;
  int warmup = 5;
  int workers = -1;
  std::string topology;  // preset/HxR/file for the scheduler report and the ubep schedule
  SendSchedule schedule = SendSchedule::kEqualSlices;
  int plan_workers = 8;  // workers assumed by the per-policy scheduler report
  uint64_t seed = 42;
  std::string json;  // write results here (rank 0)
  std::string dump;  // write one call's inputs/outputs as .npy here
  bool quiet = false;

  // Applies a workload preset (before explicit overrides).
  void apply_workload(const std::string& name);
};

struct BenchRow {
  std::string impl;     // mpi | a2a | bsp | ubep | copy
  std::string variant;  // sync mode for ubep, "" otherwise
  std::string op;       // dispatch | combine
  double median_us = 0, p99_us = 0, gbps = 0;
  double bytes = 0;  // mean bytes received per rank per call
  double barriers = 0;
  std::vector<std::pair<std::string, double>> stages;  // mean µs per stage
  double network_bytes = 0, network_rows = 0;          // per rank per call, across hosts
  double expected_network_rows = 0;                    // deduplicated volume computed from routing
};

// Predicted cost of this rank's send work under each scheduling policy.
struct PolicyRow {
  std::string policy;
  double slowest_us = 0, mean_us = 0, imbalance = 0;
};
std::vector<PolicyRow> policy_report(Group& group, const BenchOptions& opt);
void print_policy_report(const Group& group, const BenchOptions& opt,
                         const std::vector<PolicyRow>& rows);

// Collective over the group; every rank returns the same rows.
std::vector<BenchRow> run_bench(Group& group, const BenchOptions& opt);

// Rank 0 prints/writes; other ranks do nothing.
void print_table(const Group& group, const BenchOptions& opt, const std::vector<BenchRow>& rows);
void write_json(const Group& group, const BenchOptions& opt, const std::vector<BenchRow>& rows);

// Random routing for one rank: distinct experts per token, uniform or with 8 hot experts.
void make_routing(int64_t tokens, int topk, int experts, const std::string& routing, uint64_t seed,
                  std::vector<int64_t>* idx, std::vector<float>* weights);

}  // namespace ubep::tools
