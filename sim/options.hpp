// Command-line options of ubep-sim, shared by every subcommand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/call.hpp"

namespace ubep::sim {

struct Options {
  std::string command;
  std::string preset = "cm384";
  std::string calibration;  // local preset's calibration file
  std::vector<int> ranks;   // empty: the subcommand's default
  std::vector<int> batch;   // tokens per rank
  int hidden = 7168;
  int elem_bytes = 2;
  int topk = 8;
  int experts = 256;
  int hot = 0;  // hot experts (0 = uniform routing)
  double hot_weight = 4;
  std::string points;  // sched-sweep: "hot:weight,..." subset of its grid (empty: all)
  uint64_t seed = 1;
  int workers = 0;  // 0 = preset
  Op op = Op::kDispatch;
  Algo algo = Algo::kUbep;
  Sync sync = Sync::kFused;
  sched::Policy bsp_policy = sched::Policy::kNaive;
  sched::Policy ubep_policy = sched::Policy::kColumnMajor;
  bool latency_layout = true;
  bool plan_receivers = true;  // --receivers on|off: the scheduler's receiver term
  bool plan_sharing = true;    // --sharing on|off: the scheduler's work-conserving links
  int64_t min_piece_bytes = sched::kDefaultMinPieceBytes;  // --min-piece-bytes
  int steps = 100;                                         // tpot
  int moe_layers = 58, dense_layers = 3;
  int repeats = 3;                           // bench
  int resolve_ns = 0;                        // Network::end_instant quantum (0 = exact)
  std::string json;                          // output file
  std::string measured;                      // predict: ubep-bench JSON to compare with
  std::string round_calibrations;            // validate: round N's calibration file, comma list
  std::string rounds;                        // calibrate: the rounds' calibrate files, comma list
  std::string out = "sim-calibration.json";  // calibrate
  bool quiet = false;
};

// Parses argv; throws InvalidArgument naming a bad flag or value. Prints help and exits on -h.
Options parse_options(int argc, char** argv);
void print_help();
// The items of a comma list (empty items skipped).
std::vector<std::string> comma_list(const std::string& list);
// The files of --measured.
std::vector<std::string> measured_files(const Options& o);

}  // namespace ubep::sim
