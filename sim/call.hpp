// Simulation of one dispatch or combine call across all ranks, in the BSP or the UBEP
// orchestration, executing the plans of the library's real scheduler (ubep::sched).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "sim/machine.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::sim {

enum class Algo : uint8_t { kBsp, kUbep };
enum class Op : uint8_t { kDispatch, kCombine };
// How a receiver learns that a message is complete (ubep only; bsp has its own flag stage).
enum class Sync : uint8_t {
  kFused,        // token-flag fusion: flag inside the data (480 of every 512 bytes are payload)
  kStopAndWait,  // data, wait for its acknowledgment (fence), then a separate flag write
  kSentinel,     // receiver polls a sentinel value inside the data; must reset the buffer after
  // As kSentinel, but the reset is not charged to the call: it runs after the call returns (during
  // the expert compute, before the next call's senders reuse the slots). A lower bound for the
  // call; the reset's HBM traffic still exists, outside it (EXPERIMENTS.md §2).
  kSentinelDeferred,
};
const char* algo_name(Algo a);
const char* op_name(Op o);
const char* sync_name(Sync s);
Algo parse_algo(const std::string& s);
Sync parse_sync(const std::string& s);

// Expert choices of every rank's tokens for one call.
struct Traffic {
  int ranks = 0;
  int experts = 0;
  int topk = 0;
  int64_t tokens_per_rank = 0;
  std::vector<std::vector<int32_t>> ids;  // [rank][token * topk + k], -1 = none
};
// Draws traffic with the scheduler's routing generator (uniform when hot_experts == 0).
Traffic draw_traffic(int ranks, int experts, int topk, int64_t tokens, int hot_experts,
                     double hot_weight, uint64_t seed);

struct CallConfig {
  Op op = Op::kDispatch;
  Algo algo = Algo::kUbep;
  Sync sync = Sync::kFused;
  sched::Policy policy = sched::Policy::kColumnMajor;
  bool latency_layout = true;  // one unit per (destination, expert), as DeepEP low-latency
  int hidden = 7168;
  int elem_bytes = 2;
  int workers = 0;  // per rank; 0 = the preset's
  bool record_transfers = false;
  // Max-min rates recomputed at most once per this many ns (0: at every start and finish, the
  // exact model; Network::end_instant).
  double resolve_ns = 0;
  // Print "items simulated of planned, elapsed, ETA" on stderr while a call runs past 2 s.
  bool progress = false;
  // Give the scheduler every rank's receive totals (its receiver term, issue 30); false: the
  // sender-only cost model of before.
  bool plan_receivers = true;
  // The scheduler models the ports as work-conserving, each worker at most its engine's rate
  // (SchedulerOptions::worker_gbps, issue 30); false: its fixed 1/W shares of before.
  bool plan_sharing = true;
  // The scheduler's smallest piece (SchedulerOptions::min_piece_bytes; 0: one row may be a
  // piece, the plans before issue 28's third session).
  int64_t min_piece_bytes = sched::kDefaultMinPieceBytes;
};

// Progress of one long call on stderr: "items simulated of planned, elapsed, ETA", at most every
// 2 s and only once the call has run 2 s.
struct CallProgress {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double last = 0;
  void report(uint64_t simulated, uint64_t planned);
};

// One planned item as the simulator executed it.
struct Transfer {
  int src = 0, worker = 0, dest = 0, expert = -1;
  int64_t row_begin = 0, row_end = 0;
  double issue_ns = 0, visible_ns = 0;  // start on the worker; receiver may consume it
};

struct CallResult {
  std::vector<double> finish_ns;  // per rank, absolute
  std::vector<double> recv_rows;  // per rank: rows received (expert compute scales with it)
  double start_ns = 0;            // earliest rank start
  double makespan_ns = 0;         // last finish - earliest start
  double slowest_sender_ns = 0;   // max over ranks and workers: last item landed - rank start
  double planned_slowest_ns = 0;  // max over ranks of the scheduler's predicted slowest worker
  double barrier_ns = 0;          // bsp: wall time inside barriers (rank 0's view)
  uint64_t planned_items = 0, simulated_items = 0, events = 0;
  uint64_t resolves = 0, flows_refilled = 0;  // the max-min solver's work (engine.hpp)
  uint64_t trace = 0;                         // Network::trace: equal runs have equal traces
  double wire_bytes = 0;                      // bytes of data on the wire (planned items)
  double payload_bytes = 0;                   // useful bytes (rows x row payload)
  std::vector<Transfer> transfers;            // when CallConfig::record_transfers
  std::vector<sched::Plan> plans;             // when CallConfig::record_transfers, per source rank
};

// Simulates one call. start_ns: per-rank time the call begins (empty = all at 0).
CallResult simulate_call(const Preset& preset, const CallConfig& config, const Traffic& traffic,
                         std::span<const double> start_ns = {});

// The preset as one call sees it: the rates measured nearest to the call's bytes per rank
// (CostParams::rate_sets), non-temporal copy rate for large dispatches.
Preset effective_preset(const Preset& preset, const CallConfig& config, const Traffic& traffic);

// Bytes the busiest rank moves in this call (rows x row payload; the rows a rank receives in a
// uniform call, as many as it sends).
double received_bytes(const Preset& preset, const CallConfig& config, const Traffic& traffic);

// Payload bytes of one row (dispatch: hidden row + routing metadata, as protocol.hpp lays it
// out; combine: the hidden row), and its size on the wire in a sync mode.
double row_payload_bytes(Op op, int hidden, int elem_bytes, int topk);
double wire_bytes(double payload, Algo algo, Sync sync, const CostParams& cost);

}  // namespace ubep::sim
