// Hop-aware scheduler: splits one source rank's send work for one call over its workers.
//
// The UBEP paper found that treating 1-hop and 2-hop peers alike makes the worker that drew the
// far peers the straggler. The scheduler takes the call's send work (rows per destination rank,
// or per destination expert), a worker count and a policy, and returns a Plan: for each worker
// an ordered list of items (destination, expert, slice of rows) with their predicted cost.
//
// Cost model (docs/SCHEDULING.md, "cost model"). Every worker of the source rank holds an
// equal 1/W share of each of the rank's links (one link per topology level). A worker issues
// its items back to back: item i's bytes take issue_i = bytes_i / (bandwidth(level_i) / W),
// and the item is complete latency(level_i) after its last byte left, at
//     finish_i = issue_1 + ... + issue_i + latency(level_i).
// Stores are posted (UB and NVLink load/store, RDMA writes), so a worker does not wait for one
// item to land before it issues the next: latencies overlap with later issues. The worker is
// done when its last item lands, at max_i finish_i. A single item costs latency + bytes /
// bandwidth, as the topology's cost model says. Ordering a worker's items far first (largest
// latency first) minimises max_i finish_i (Jackson's rule), which is why the UBEP policies do.
// Receivers (issue 30): every remote destination d also has a receiving port of its level's
// bandwidth, shared by every source that sends to it. Given the rows d receives from all sources
// in this call (SendWork::recv_rows), its port needs floor_d = recv bytes / bandwidth to drain
// them. A destination whose floor exceeds this source's own send time (total issue / W) by more
// than kReceiverMargin is receiver-bound: fair sharing at its port drains every source's traffic
// into d in proportion, so this source's own_d bytes into d get at most own_d / floor_d, and an
// item of x bytes to d holds its worker for max(issue, floor_d * x / own_d) (the workers holding
// d's traffic visit it at different times, see the rotated order in scheduler.cpp). No plan lands
// before floor_d + latency(d): the plan's slowest_ns is at least receiver_floor_ns. Balanced also
// tries keeping all of a receiver-bound destination's items on one worker, issued first.
// simulate_sharing() evaluates a plan with a work-conserving link instead of fixed shares.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ubep/topology.hpp"

namespace ubep::sched {

enum class Policy : uint8_t {
  // CANN-EP-like: units (destinations or experts, in id order) are cut into W contiguous runs of
  // equal unit count; worker w sends run w whole. Blind to both hops and row counts.
  kNaive,
  // UBEP's (worker x expert) remap: instead of giving each worker a run of experts (naive),
  // cut the token sequence into W equal slices and give slice w of every destination to worker
  // w, so every worker gets an even mix of near and far destinations and an equal share of
  // rows, hot experts included. The scheduler sees row counts, not token ids: a unit's n rows
  // are taken as spread evenly over the sequence (slice s holds rows [n*s/W, n*(s+1)/W)), and
  // slice s of unit u goes to worker (s + u) mod W. A unit too small for W slices of the piece
  // floor (SchedulerOptions::min_piece_bytes) is cut into the k pieces it fills, piece j going
  // where the last of the W-slices it covers would (scheduler_static.cpp). Blind to costs. Far
  // destinations first within a worker.
  kColumnMajor,
  // Cost-aware: units are cut into slices so that no slice dominates, then placed longest
  // first on the least-loaded worker (LPT on issue time); the best of several slice
  // granularities (including none), and of the two static policies, is kept. Far destinations
  // first within a worker. Bound: see scheduler.cpp.
  kBalanced,
};

const char* policy_name(Policy policy);  // "naive", "column_major", "balanced"
// Accepts "naive", "column_major" / "column-major", "balanced"; throws InvalidArgument otherwise.
Policy parse_policy(const std::string& name);

// One source rank's send work for one call.
struct SendWork {
  int src_rank = 0;
  // 0: one unit per destination rank (throughput layout: a token travels to a rank once).
  // E > 0: one unit per global expert (latency layout), E experts per rank; expert e lives on
  // rank e / E, as in DESIGN §2.
  int experts_per_rank = 0;
  // Rows to send per unit, indexed by destination rank (size = ranks) or by global expert id
  // (size = ranks * experts_per_rank). A unit's rows are its row list in the caller's order
  // (e.g. source token order); plan items name slices [row_begin, row_end) of it.
  std::span<const int64_t> rows;
  int64_t row_bytes = 0;  // bytes of one row on the wire (> 0)
  // Optional: rows each destination rank receives in this call from all sources, this one
  // included (size = ranks), e.g. from expert-load statistics; it feeds the receiver term of
  // the cost model. Empty: receivers are not modelled (every port keeps up with its senders).
  std::span<const int64_t> recv_rows = {};
};

// A destination is receiver-bound when its port's drain time exceeds the source's own send time
// by more than this factor (below it, random routing alone puts half the ports slightly above
// the mean, and none of them holds back a sender).
inline constexpr double kReceiverMargin = 1.1;
// Balanced keeps column-major's plan (every destination spread over every worker) unless an LPT
// candidate is better by this factor under the model (see plan_balanced in scheduler.cpp).
inline constexpr double kSpreadPreference = 0.02;
// The same under the work-conserving model (SchedulerOptions::worker_gbps > 0). Measured in
// ubep-sim's hot-expert sweep: LPT plans this model put 2-3% ahead of column-major ran 0.1% behind
// to 0.1% ahead (EP64 hot 0: 2.8% predicted, 0.06% simulated; EP256 8 hot at weight 2: > 2%
// predicted, 0.1% behind), and at EP64 32 hot at weight 2 one put 5.1% ahead ran 0.02% behind
// (issue 30, session f), so a smaller predicted gain is within its error between candidates.
inline constexpr double kSharedSpreadPreference = 0.06;

struct PlanItem {
  int32_t dest_rank = 0;
  int32_t expert = -1;  // global expert id; -1 for a per-destination unit
  int32_t level = 0;    // topology level between source and destination
  int64_t row_begin = 0;
  int64_t row_end = 0;
  double bytes = 0;  // (row_end - row_begin) * row_bytes
  // The worker's time on it: bytes / (bandwidth(level) / workers), or longer where the
  // receiver's port limits it (receiver_bound; see the cost model above).
  double issue_ns = 0;
  bool receiver_bound = false;
  double latency_ns = 0;  // latency(level): flight time after the last byte left
  double finish_ns = 0;   // when it lands: issue times of the worker's items so far + latency
  int64_t rows() const { return row_end - row_begin; }
};

struct Plan {
  Policy policy = Policy::kBalanced;
  int src_rank = 0;
  int workers = 0;
  // Items of every worker, grouped by worker in execution order: worker w runs
  // items[worker_begin[w] .. worker_begin[w+1]).
  std::vector<PlanItem> items;
  std::vector<int32_t> worker_begin;   // workers + 1 entries
  std::vector<double> worker_cost_ns;  // when the worker's last item lands (max finish_ns)
  double slowest_ns = 0;               // max over workers, and >= receiver_floor_ns
  double mean_ns = 0;                  // mean over workers (idle workers count as 0)
  double imbalance = 1;                // slowest / mean (1 when there is no work)
  double total_issue_ns = 0;           // sum of issue_ns over items
  double receiver_floor_ns = 0;        // largest floor_d + latency among receiver-bound ones

  std::span<const PlanItem> worker_items(int worker) const;
  int64_t total_rows() const;
  // Multi-line human-readable listing, for logs and tests' failure messages.
  std::string describe() const;
};

// Smallest piece a policy cuts a unit into (SchedulerOptions::min_piece_bytes): a piece pays a
// fixed cost however small it is (a copy descriptor or loop set-up, ubep-sim's issue_ns = 50 ns
// [ASSUME]; a completion the receiver handles; a flow in the simulator), and at a worker's share
// of a UB port (392 GB/s over 36 sending workers = 10.9 GB/s) 64 KiB take 6 us, so that cost stays
// under 1% of the piece. One row of DeepSeek-V3's hidden size (7168 bf16 = 14 KiB) would pay 3.5%.
inline constexpr int64_t kDefaultMinPieceBytes = 64 * 1024;
// The floor never makes a piece larger than 1/kMinPiecesPerWorker of a worker's equal share of
// the call's rows: a piece lands (and the receiver consumes it) only once its last byte is in, so
// a worker's last piece is a tail of the call. Without this cap, the 64 KiB floor made ubep-sim's
// cm384 EP64 combine 13-14% slower at BS 32-64 (a worker's 7-14 rows in 1-3 whole pieces, each
// landing at its end, instead of single rows); with it, BS <= 64 keep one row per piece there.
inline constexpr int64_t kMinPiecesPerWorker = 8;

struct SchedulerOptions {
  int workers = 1;
  Policy policy = Policy::kBalanced;
  // Work-conserving links (issue 30). 0: the fixed 1/W shares of the cost model above. > 0:
  // the workers issuing on one of the rank's links share it max-min fairly, each at most
  // worker_gbps (its own engine: an AIV core's share of HBM, a CPU thread's copy rate), and the
  // items to a receiver-bound destination d together deliver at most own_d * t / floor_d bytes
  // by time t (this source's share of d's port, lent over time: a worker that reaches d after
  // the others finds their unused credit; src/sched/fluid.hpp), scaled down where the plan
  // sends d's units over fewer concurrent flows than it has units there (ports share per flow;
  // not for naive, whose peers all serialise alike; scheduler_receivers.cpp):
  // simulate_sharing's fluid model. Every plan's worker_cost_ns,
  // mean_ns and slowest_ns are then that model's finish times (items keep their fixed-share
  // issue_ns and finish_ns), and balanced compares its candidates with it: a worker with a few
  // more rows than the others costs little while the others keep the link busy, which the
  // fixed shares overcharge.
  double worker_gbps = 0;
  // Fluid model only: the physical link (port) of each level, levels sharing a port sharing its
  // bandwidth (the largest of theirs), e.g. CloudMatrix's one- and two-hop UB traffic leaving a
  // die through the same UB links. Empty: one link per level. Level 0 is always its own link.
  std::vector<int> link_of_level = {};
  // Fluid model only: the receiver's work on an item once it landed (reorder copy, reduction,
  // tag checks), per row, done by one of its workers: an item is complete that long after it
  // lands, so a plan of big items ends with a longer tail than one of small items.
  double consume_row_ns = 0;
  // Column-major and balanced cut no unit into pieces smaller than this (a unit smaller than it
  // stays whole; see kDefaultMinPieceBytes), unless a worker's share of the call's rows would
  // then make fewer than kMinPiecesPerWorker pieces (the floor drops to that share / 8 rows).
  // At least one row per piece; 0 or one row's bytes: every row may be its own piece (the plans
  // before issue 28's third session).
  int64_t min_piece_bytes = kDefaultMinPieceBytes;
};

// Reusable planner for one rank. plan() keeps its scratch and the Plan's storage between calls,
// so in steady state (same or smaller work) it does not allocate (except with the fluid model,
// SchedulerOptions::worker_gbps > 0, whose evaluation allocates its items). Not thread-safe: one
// per rank.
class Scheduler {
 public:
  Scheduler(Topology topology, SchedulerOptions options);

  const Topology& topology() const { return topology_; }
  const SchedulerOptions& options() const { return options_; }
  void set_policy(Policy policy) { options_.policy = policy; }

  // Plans `work` into `out`. Throws InvalidArgument (naming the value) for a bad source rank,
  // a rows span of the wrong size, a negative row count or row_bytes <= 0.
  void plan(const SendWork& work, Plan& out);
  Plan plan(const SendWork& work);

  // Predicted cost of sending `rows` rows of `row_bytes` from src to dest as a worker's only
  // item: latency + bytes / (bandwidth / workers).
  double item_cost_ns(int src, int dest, int64_t rows, int64_t row_bytes) const;

 private:
  struct Unit {
    int32_t dest_rank;
    int32_t expert;
    int32_t level;
    int32_t index;  // unit index in SendWork::rows
    int64_t rows;
  };
  struct Piece {  // a slice of a unit before it is given a worker
    int32_t unit;
    int32_t worker;
    int64_t row_begin;
    int64_t row_end;
    double issue_ns;  // sender share only (bytes / (bandwidth / W))
    double key = 0;   // LPT order: its issue time, or its group's cost (receiver-bound)
  };

  void collect_units(const SendWork& work);
  void collect_receivers(const SendWork& work);
  double issue_ns(const Unit& unit, int64_t rows) const;
  // The call's piece floor in rows (scheduler_static.cpp), into min_piece_rows_.
  void set_piece_floor();
  // Most pieces a unit of `rows` rows may be cut into: each at least min_piece_rows_ (>= 1).
  int64_t max_pieces(int64_t rows) const;
  bool bound(const Unit& unit) const { return floor_ns_[static_cast<size_t>(unit.dest_rank)] > 0; }
  // Worker time of a piece under the cost model (with the receiver term).
  double piece_ns(const Piece& p) const;
  void plan_naive();
  void plan_column_major();
  void plan_balanced();
  // LPT over the units cut into slices of at most max_slice_ns issue time; leaves the
  // assignment in pieces_ and returns its makespan.
  // group_receivers: every receiver-bound destination's units go whole onto one worker.
  double lpt(double max_slice_ns, bool group_receivers = false);
  // Slowest worker of the assignment in pieces_, items far first; receiver-bound ones first
  // of all when asked (the order emit() gives a grouped candidate).
  double makespan(bool receivers_first = false);
  // Sorts pieces_ into the order a plan runs them: grouped by worker, then (see emit) receivers
  // first, far first with rotated destinations.
  void order_pieces(bool far_first, bool receivers_first);
  void emit(Plan& out, bool far_first, bool receivers_first);
  void fill_plan(Plan& out);  // the Plan of pieces_ in their order, with its costs
  // Fluid model (SchedulerOptions::worker_gbps > 0; scheduler_fluid.cpp): finish time of every
  // worker running pieces_ in their order, into fluid_finish_; returns the slowest, at least the
  // receiver floor.
  bool fluid() const { return options_.worker_gbps > 0; }
  void init_fluid_links();  // checks link_of_level, fills fluid_links_
  // credit: receiver-bound destinations lend their port over time (the envelope of
  // src/sched/fluid.hpp); false: each item at most own_d / floor_d (no credit).
  // A receiver-bound destination's share is scaled by flow_share_ (set_flow_share).
  double fluid_span(bool credit = true);
  // Ports share per flow (scheduler_receivers.cpp): with pieces_ grouped by worker, the number
  // of distinct workers sending to each receiver-bound destination, into out (per rank).
  void count_flows(std::vector<int32_t>& out) const;
  // flow_share_[d] = min(1, flows of pieces_ to d / this source's units to d).
  void set_flow_share();
  // A candidate's makespan as balanced compares them: makespan() under fixed shares (far
  // first), or fluid_span() of the candidate in plan order (pieces_ are left in that order).
  // With receiver-bound destinations it also leaves the no-credit span in no_credit_span_.
  double candidate_span(bool receivers_first, bool far_first = true);
  double no_credit_span_ = 0;

  Topology topology_;
  SchedulerOptions options_;
  int src_rank_ = 0;
  int64_t row_bytes_ = 0;
  int units_per_rank_ = 0;                        // SendWork::experts_per_rank of the current call
  int64_t min_piece_rows_ = 1;                    // the current call's piece floor
  std::vector<Unit> units_;                       // non-empty units of the current call
  std::vector<Piece> pieces_;                     // current assignment
  std::vector<Piece> best_pieces_;                // best assignment found by plan_balanced
  std::vector<double> load_;                      // per-worker issue time during LPT
  std::vector<double> level_load_;                // [worker][level] issue time, for makespan()
  std::vector<int32_t> order_;                    // per-worker offsets scratch in emit()
  std::vector<std::pair<double, int32_t>> heap_;  // (load, worker) min-heap of LPT
  // Receivers of the current call, per destination rank: floor_d (0 = not receiver-bound),
  // this source's bytes to it, the LPT group's worker.
  std::vector<double> floor_ns_, own_bytes_;
  std::vector<int32_t> group_worker_;
  // Per dest: this source's non-empty units to it, the current plan's flows to it, and the
  // plan's share of the proportional envelope (set_flow_share).
  std::vector<int32_t> units_to_, flows_;
  std::vector<double> flow_share_;
  double max_floor_ns_ = 0;  // largest floor_d + latency(d)
  std::vector<int32_t> bound_dests_;
  std::vector<double> group_ns_;  // per dest: max(its issue time, floor_d) on one worker
  std::vector<double> rx_load_, rx_latency_;  // per worker, makespan() scratch
  bool any_bound_ = false;
  std::vector<Piece> sorted_;  // order_pieces() scratch
  // Fluid model scratch: links' bandwidths, worker offsets of pieces_, finish times.
  std::vector<double> fluid_links_, fluid_finish_;
  std::vector<int32_t> fluid_begin_;
  std::vector<int32_t> group_of_;  // per destination rank: its fluid receiver group, -1 none
  bool receivers_first_ = false;   // balanced chose a grouped candidate: emit them first
  bool far_first_ = true;          // emit far first (all but naive's own order)
};

// ---- Link sharing: evaluating a plan with a work-conserving link -----------------------------

// Finish time of every worker when all of them start together and issue their items in order:
// an item's bytes go through the source rank's link of its level, shared max-min fairly by the
// workers issuing on it at that moment (each at most worker_cap_gbps; 0 = uncapped), and it
// lands its level's latency later. Unlike the plan's fixed 1/W shares, a worker's share grows
// when others are idle, so with no cap out[w] <= plan.worker_cost_ns[w]; with a cap of
// bandwidth / W on a one-level topology the two agree. out.size() must equal plan.workers.
void simulate_sharing(const Plan& plan, const Topology& topology, double worker_cap_gbps,
                      std::span<double> out);

// ---- The paper's scheduling ablation ---------------------------------------------------------

// Random top-k routing with hot experts. Each token draws topk distinct experts without
// replacement; a hot expert is hot_weight times as likely to be drawn as a cold one.
struct RoutingConfig {
  int ranks = 64;
  int experts = 256;
  int topk = 8;
  int hot_experts = 8;
  double hot_weight = 4;
  int tokens_per_rank = 128;
  uint64_t seed = 1;
};
// The hot experts' ids, drawn from the seed (ascending).
std::vector<int32_t> hot_expert_ids(const RoutingConfig& config);
// topk expert ids of every token of `rank`: [tokens_per_rank * topk], token-major.
// Deterministic in (config, rank).
std::vector<int32_t> draw_routing(const RoutingConfig& config, int rank);
// Rows per global expert (latency layout) of one rank's routing; -1 entries are skipped.
std::vector<int64_t> rows_per_expert(std::span<const int32_t> topk_ids, int experts);
// Rows per destination rank (throughput layout: a token counts once per rank it goes to).
std::vector<int64_t> rows_per_destination(std::span<const int32_t> topk_ids, int topk, int ranks,
                                          int experts);

struct AblationConfig {
  std::string topology = "cm384";
  RoutingConfig routing;
  int hidden = 7168;
  int elem_bytes = 2;      // bf16
  int workers = 48;        // AIV vector cores of one Ascend 910C die
  bool per_expert = true;  // latency layout: one unit per (destination, expert)
};

struct PolicyFigures {
  Policy policy = Policy::kNaive;
  double slowest_ns = 0;         // max over source ranks of the plan's slowest worker
  double mean_slowest_ns = 0;    // mean over source ranks of the plan's slowest worker
  double mean_imbalance = 0;     // mean over source ranks of slowest / mean
  double shared_slowest_ns = 0;  // like slowest_ns, evaluated with simulate_sharing (uncapped)
};

struct AblationResult {
  AblationConfig config;
  PolicyFigures naive, column_major, balanced;
  std::string describe() const;  // a table, one line per policy
};

// Plans every source rank's routing with each policy and reports the predicted slowest worker.
AblationResult scheduling_ablation(const AblationConfig& config = {});

}  // namespace ubep::sched
