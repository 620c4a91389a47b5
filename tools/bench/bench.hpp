// The benchmark behind ubep-bench and the demo: MPI baseline, bsp, ubep, the measured
// memory-bandwidth bound and the latency floor, in one run on one group.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ubep/baseline.hpp"
#include "ubep/buffer.hpp"
#include "ubep/group.hpp"
#include "ubep/stats.hpp"

namespace ubep::tools {

struct BenchOptions {
  std::string workload = "decode";  // decode | prefill | tiny (DESIGN.md §4)
  int64_t tokens = 128;
  int64_t hidden = 7168;
  int topk = 8;
  int experts = 256;
  DType dtype = DType::kBF16;
  // fp8 only: pass bf16 x and let ubep cast on send ("fp8-cast"), instead of fp8 codes and
  // scales quantized before the timed calls ("fp8").
  bool fp8_cast = false;
  // The fp8 bounds' untimed expert steps do the bench's expert's work (dequantizing,
  // BoundHarness::set_fp8_expert and set_fp8_expert_into), or copy the rows (--bound-expert copy).
  bool bound_expert_match = true;
  // --dtype's list (bf16, fp32, fp8, fp8-cast): main runs the bench once per entry.
  std::vector<std::string> dtypes{"bf16"};
  Layout layout = Layout::kLatency;
  std::vector<std::string> algos{"mpi", "bsp", "ubep"};
  std::vector<SyncMode> syncs{SyncMode::kFused};  // variants of the ubep algorithm to run
  std::string routing = "uniform";                // uniform | hot
  int iters = 50;
  int rounds = 5;    // iterations interleaved with the other implementations' in this many slices
  int repeat = 1;    // whole runs, the implementations' order rotating; summary over their medians
  int warmup = 5;    // untimed iterations at the start of every slice (bench_slices)
  int workers = -1;  // worker threads per rank for ubep and the baseline (-1: cores / ranks - 1)
  std::string topology;  // preset/HxR/file for the scheduler report and the ubep schedule
  SendSchedule schedule = SendSchedule::kEqualSlices;
  int plan_workers = 8;  // workers assumed by the per-policy scheduler report
  uint64_t seed = 42;
  Placement placement = Placement::kAuto;  // for bsp and ubep
  // Non-empty: the straggler run instead of the comparison. Rank 0 arrives D µs late at every
  // call, for each D; bsp, ubep-compact and ubep-per-source are timed on the other ranks.
  std::vector<double> straggler_us;
  std::string json;  // write results here (rank 0)
  std::string dump;  // write one call's inputs/outputs as .npy here
  bool quiet = false;

  // Applies a workload preset (before explicit overrides).
  void apply_workload(const std::string& name);
};

struct BenchRow {
  std::string impl;     // mpi | a2a | bsp | ubep | bound | bound_packed | floor | barrier
  std::string variant;  // sync mode for ubep; the winning copy kernel for bound; "" otherwise
  std::string dtype;    // the --dtype entry the row was measured with
  std::string op;       // dispatch | combine (floor: roundtrip; barrier: flag)
  double median_us = 0, p99_us = 0, gbps = 0;
  double bytes = 0;  // mean bytes received per rank per call
  double barriers = 0;
  std::vector<std::pair<std::string, double>> stages;      // mean µs per stage
  std::vector<std::pair<std::string, double>> candidates;  // bound: median µs of each kernel
  double network_bytes = 0, network_rows = 0;              // per rank per call, across hosts
  double expected_network_rows = 0;  // deduplicated volume computed from routing
  // Dispatch: the bench's expert step right after the op (outside its timing), median µs, mean
  // over ranks. Where a call leaves its rows decides what the expert's first read costs (from
  // the sender's cache or from memory), so a store policy is judged by both numbers.
  double expert_read_us = 0;
  // Bound: its untimed expert step (the copy, or the fp8 expert's work), mean µs over the
  // recorded steps, mean over ranks: to set beside the calls' expert_read_us.
  double expert_step_us = 0;
  // Combine: the caller's first read of y right after the op (outside its timing; CPU outputs),
  // median µs, mean over ranks: the same check for the output's store policy.
  double caller_read_us = 0;
  // Median over the bound of the same op (0 when there is none), and over floor + bound: what a
  // call cannot beat (data must be copied, and a peer must see a flag).
  double x_bound = 0, x_floor_bound = 0;
  // Where the time goes, per rank (index = rank; breakdown.cpp), medians over the calls: each
  // stage of `stages`, its part spent waiting on a peer (wait_us) and the rest, this rank's own
  // work (work_us: copying, reducing, bookkeeping; the median of stage - wait); the whole op
  // (op_us: what the stages leave out is the engine's checks and routing); and how much later
  // than the earliest rank this rank started the op (late_us). wait_us/work_us are empty where
  // the implementation does not measure waits.
  struct RankPhases {
    std::vector<double> stage_us, wait_us, work_us;
    double late_us = 0, op_us = 0;
  };
  std::vector<RankPhases> per_rank;
  // One host only: the skew of a call's starts (latest minus earliest rank), median and p99, and
  // the call timed from the latest start to the latest end (median): the op without that skew.
  double skew_median_us = 0, skew_p99_us = 0, from_last_start_us = 0;
  // --repeat (repeat.cpp): the run this row is from (0-based), or, in the summary, the number of
  // runs, and the range over them of the per-run medians and x_bound.
  int run = 0, runs = 0;
  double run_min_us = 0, run_max_us = 0, x_bound_min = 0, x_bound_max = 0;
};

// What every timed op starts after (start_barrier.cpp): all ranks leave it together, within
// about a cache line's transfer, and no waiter sleeps or (with no more ranks than cores) gives
// up its core. Collective constructor and destructor; across hosts it is the group barrier.
class StartBarrier {
 public:
  explicit StartBarrier(Group& g);
  ~StartBarrier();
  StartBarrier(const StartBarrier&) = delete;
  StartBarrier& operator=(const StartBarrier&) = delete;
  void wait();

 private:
  Group& g_;
  std::unique_ptr<SharedWindow> win_;
  uint64_t arrived_ = 0;
  bool yield_ = false;
};

// Per-call records of one implementation's op, on this rank (breakdown.cpp): the stages and
// their peer waits from CallStats, and when each call started.
class OpBreakdown {
 public:
  // stats: the call's (nullptr for implementations without stages); start: steady clock.
  void add(const CallStats* stats, std::chrono::steady_clock::time_point start);
  // Collective: fills row.stages, row.per_rank and the skew fields; durations are this rank's
  // (the same calls as add's, in order).
  void finish(Group& g, const std::vector<double>& durations, BenchRow* row) const;

 private:
  std::vector<std::string> order_;                        // stage names, first seen first
  std::map<std::string, std::vector<double>> us_, wait_;  // per stage: one value per call
  bool waits_ = true;
  std::vector<double> start_us_;
};

// Flags of ubep-bench, validated: every bad value raises InvalidArgument naming the flag and
// the value (main() turns it into exit code 2). --help sets `help`.
struct BenchCommand {
  BenchOptions opt;
  int ranks = 2;
  double timeout_s = 60;
  bool help = false;
};
BenchCommand parse_bench_args(int argc, const char* const* argv);
extern const char* const kBenchUsage;

// Predicted cost of this rank's send work under each scheduling policy.
struct PolicyRow {
  std::string policy;
  double slowest_us = 0, mean_us = 0, imbalance = 0;
};
std::vector<PolicyRow> policy_report(Group& group, const BenchOptions& opt);
void print_policy_report(const Group& group, const BenchOptions& opt,
                         const std::vector<PolicyRow>& rows);

// Another library's all-to-all-v under the baseline's pack, unpack and reduce, run by --algo NAME
// beside "mpi" (rows named after the exchange). ubep-bench registers "oneccl" when it is built
// with oneCCL (tools/bench/oneccl_exchange.hpp); an unregistered one is an InvalidArgument.
using ExchangeMaker = std::function<std::unique_ptr<BulkExchange>(Group&)>;
void register_exchange(const std::string& name, ExchangeMaker make);

// One slice of a run (--rounds): untimed calls, then timed ones.
struct Slice {
  int warm = 0, timed = 0;
};
// The slices of one implementation: `iters` timed calls spread over min(rounds, iters) slices,
// each starting with `warmup` untimed calls. Every slice warms up, not only the first: the
// bound harness or another implementation ran just before it, and a decode combine took 30-80
// calls to come back to its steady time after the harness's slice (1,100 -> 655 us, 2 process
// ranks; docs/PERFORMANCE.md, issue 31, twenty-first session), while its 10 timed calls came
// right after it.
std::vector<Slice> bench_slices(int iters, int rounds, int warmup);
// The bound harness's untimed iterations before slice `slice`: `warmup` before the first, at
// most 2 before the others. Each of its iterations runs every candidate over its own rows
// (tens of passes over its memory), so it needs fewer than a call does.
int bound_warmup(int slice, int warmup);

// Collective over the group; every rank returns the same rows.
std::vector<BenchRow> run_bench(Group& group, const BenchOptions& opt);
// The straggler run (--straggler-us): rows with impl bsp | ubep-compact | ubep-per-source, op
// dispatch_send (ubep's send phase; bsp has none, its whole dispatch is shown) and dispatch,
// variant "late=D", timed on the ranks that are not late; compact() timed as op "compact".
std::vector<BenchRow> run_straggler(Group& group, const BenchOptions& opt);
void print_straggler_table(const Group& group, const BenchOptions& opt,
                           const std::vector<BenchRow>& rows);

// Rank 0 prints/writes; other ranks do nothing.
void print_table(const Group& group, const BenchOptions& opt, const std::vector<BenchRow>& rows);
// The per-rank breakdown of one row (rank 0 prints; breakdown.cpp).
void print_breakdown(const BenchRow& row);

// --repeat (repeat.cpp): one row per (dtype, impl, variant, op) over the runs: the median of the
// runs' medians (median_us), their range, the median and range of the runs' x_bound (each run's
// ratio to its own bound), and x_floor_bound's median. Bound rows merge whatever kernel won.
std::vector<BenchRow> summarize_runs(const std::vector<std::vector<BenchRow>>& runs);
// Rank 0: the summary table and the derived ratios (dispatch + combine over the bound,
// fp8 / bf16 dispatch, x (floor + bound)), each as the median and range over the runs.
void print_summary(const Group& group, const BenchOptions& opt,
                   const std::vector<std::vector<BenchRow>>& runs,
                   const std::vector<BenchRow>& summary);
// With run_rows (--repeat): `rows` are the summary, run_rows every run's rows ("run_results").
void write_json(const Group& group, const BenchOptions& opt, const std::vector<BenchRow>& rows,
                const std::vector<BenchRow>& run_rows = {});

// Shared by the measurements (bench.cpp, bounds.cpp): per-iteration times of this rank ->
// a row whose median and p99 are over the slowest rank of each iteration.
BenchRow make_row(Group& g, const std::string& impl, const std::string& variant,
                  const std::string& op, const std::vector<double>& times, double bytes);
double mean_over_ranks(Group& g, double v);

// Rows of one call as the benchmark's routing sends them: (destination rank, token), by
// destination in rotated order from the next rank, tokens in order. Latency layout: one row
// per selected (token, k); throughput: one per (token, destination rank).
struct SendRow {
  int dest;
  int64_t token;
  int expert = -1;  // latency layout: the row's global expert (k order within a token)
};
std::vector<SendRow> send_rows(const std::vector<int64_t>& topk_idx, int64_t tokens, int topk,
                               int experts, int ranks, int me, Layout layout);

// The memory-bandwidth bound (impl "bound", ops dispatch and combine), measured with every rank
// copying at once: dispatch copies each sent row from x into its destination's shared window
// (the peer's memory, at the row's place in the call's layout: place_rows); combine reads each
// row back from there into its token's output row, after a fresh dispatch and expert copy, as
// a call finds them. Fastest of several copy and or-reduce loops, per op; the row's variant
// names the winner. Latency layout: also impl "bound_packed", the same with the rows packed by
// source (timed interleaved with the bound's candidates). With scale_bytes > 0 (fp8) a dispatch row
// is also scale_bytes of per-row scales from `scales`, written to a separate dense array as the
// call's window holds them (payload rows stay 64-byte aligned); the combine rows are row_bytes.
// What fixes where a call's rows lie in its destination's window (the call's API, not its
// implementation: the latency layout's rows are [local expert, source region, slot]).
struct BoundShape {
  Layout layout = Layout::kLatency;
  Placement placement = Placement::kAuto;
  int local_experts = 1;
  int64_t max_tokens = 0;  // per rank (the buffer's capacity; the bench uses the token count)
};
// Where each sent row lands in its destination's window, as the call places it (one row index
// per entry of `sends`), the rows a window region holds, and this rank's received rows as
// (first row, count) runs, as an expert reads and writes them. packed: ignore the layout, rows
// by source in send order (for comparison). Collective (one allgather).
struct RowPlaces {
  std::vector<int64_t> pos;
  int64_t region_rows = 1;
  std::vector<std::pair<int64_t, int64_t>> runs;
};
RowPlaces place_rows(Group& g, const std::vector<SendRow>& sends, const BoundShape& shape,
                     bool packed = false);
class BoundHarness {
 public:
  // Collective: allocates the window (the bound needs every rank on one host).
  BoundHarness(Group& g, const std::vector<SendRow>& sends, const char* x, size_t row_bytes,
               const BoundShape& shape, const char* scales = nullptr, size_t scale_bytes = 0);
  ~BoundHarness();  // collective
  BoundHarness(const BoundHarness&) = delete;
  BoundHarness& operator=(const BoundHarness&) = delete;
  // The untimed expert step between a dispatch and its combine does the bench's fp8 expert's
  // work (expert_fp8_row on every received row, its first hidden bytes taken as codes, scales
  // of one) instead of copying the rows: for the harness of bf16 rows (2 * hidden bytes, no
  // scales) that bounds an fp8 call's combine.
  void set_fp8_expert(int64_t hidden);
  // For the harness of an fp8 call's dispatch rows (codes and scales): its expert step
  // dequantizes each received row with its scales (expert_fp8_row) into `bf16_rows`' combine
  // input, and the combine after it is `bf16_rows`' (plain or-reduce): the calls' own sequence
  // before their next dispatch. It then bounds the dispatch only. `bf16_rows` holds the same
  // sends as rows of 2x the bytes without scales, and outlives this harness's runs.
  void set_fp8_expert_into(BoundHarness& bf16_rows);
  // For tests: the bf16 row the last fp8 expert step wrote for the k-th row this rank received
  // (in the order of its RowPlaces runs); empty past the last.
  std::vector<uint16_t> last_expert_row(size_t k) const;
  // Collective: `iters` rounds of every candidate; record = keep the times (false: warm-up).
  // Calls may be spread over the run, between other implementations' iterations.
  void run(int iters, bool record);
  // Collective: the fastest candidate per op (and per layout), over all recorded rounds.
  std::vector<BenchRow> rows();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// The latency floor (impl "floor", op "roundtrip"): a one-cache-line flag round trip between
// ranks 0 and 1 through shared memory; and one all-to-all flag barrier (impl "barrier", op
// "flag"), as bsp makes after each stage, with every rank arriving together. Empty on one rank
// or when ranks 0 and 1 do not share memory.
std::vector<BenchRow> measure_floor(Group& g, int iters);

// Random routing for one rank: distinct experts per token, uniform or with 8 hot experts.
void make_routing(int64_t tokens, int topk, int experts, const std::string& routing, uint64_t seed,
                  std::vector<int64_t>* idx, std::vector<float>* weights);

}  // namespace ubep::tools
