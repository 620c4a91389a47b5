// How one call is simulated. Both orchestrations run the same scheduler plans through the same
// links; they differ in what surrounds the data (see DESIGN §1 and issue 5):
// bsp dispatch:  layout -> counts (posted stores) -> BARRIER -> token items -> BARRIER -> set
//                flags, fence, verify every peer's flag -> BARRIER -> prefix sum -> reorder ->
//                BARRIER.
// bsp combine:   row items -> BARRIER -> set flags, fence, verify -> BARRIER -> reduce -> BARRIER.
// ubep dispatch: layout -> one sender posts the count records, then every sender runs its items;
//                each receiver computes its prefix sum once it holds every peer's count record
//                (point-to-point); its reorder workers consume items as they land. No barrier.
// ubep combine:  row items; the owner reduces rows as they become visible. No barrier.
// The CPU implementation (`local` preset, CostParams::dispatch_reorder = false etc.) differs:
// dispatch rows are written straight into their final place (no reorder; ubep receivers only
// check one tag per row), bsp has no final barrier (double-buffered outputs: 3 + 2 barriers),
// and ubep's combine moves no data on the expert side (a tag per row): owners reduce the rows
// in place; bsp's combine copies rows into the owners' staging, then they reduce.
// Small messages (counts, flags) are posted stores: the worker pays issue_ns per store and moves
// on; they are visible after the pair's latency, not routed through the link model. Data items
// are the scheduler's plan items, each one flow through (worker engine, sender port, receiver
// port); a worker pushes `window` items at a time (1 = the scheduler's model).
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "sim/barrier.hpp"
#include "sim/call.hpp"
#include "sim/receive_pool.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

namespace {

class CallSim {
 public:
  CallSim(const Preset& preset, const CallConfig& cfg, const Traffic& traffic,
          std::span<const double> start)
      : preset_(preset),
        eff_(effective_preset(preset, cfg, traffic)),
        c_(eff_.cost),
        cfg_(cfg),
        tr_(traffic),
        net_(q_),
        R_(preset.topology.ranks()) {
    UBEP_CHECK_ARG(traffic.ranks == R_, "traffic has ", traffic.ranks, " ranks, topology ", R_);
    UBEP_CHECK_ARG(traffic.experts % R_ == 0, "experts (", traffic.experts,
                   ") must divide evenly over ", R_, " ranks");
    UBEP_CHECK_ARG(start.empty() || static_cast<int>(start.size()) == R_,
                   "start times: ", start.size(), " entries for ", R_, " ranks");
    W_ = cfg.workers > 0 ? cfg.workers : c_.workers_per_rank;
    UBEP_CHECK_ARG(W_ >= 1, "workers per rank must be >= 1, got ", W_);
    split_ = cfg.algo == Algo::kUbep && c_.ubep_reorder_workers > 0 && c_.ubep_reorder_workers < W_;
    senders_ = split_ ? W_ - c_.ubep_reorder_workers : W_;
    start_.assign(static_cast<size_t>(R_), 0.0);
    if (!start.empty()) start_.assign(start.begin(), start.end());
    machine_ = std::make_unique<Machine>(eff_, net_, W_);
    net_.set_resolve_quantum(cfg.resolve_ns);
    net_.reserve_homes(R_ * senders_);  // a flow's home: its worker's slot (start_item)
    El_ = tr_.experts / R_;
  }

  CallResult run();

 private:
  // ---- plans ----
  void make_plans();
  // ---- data items ----
  void start_worker(int r, int w, double at, std::function<void()> on_done);
  void issue_next(int r, int w);
  void start_item(int slot, int idx);    // worker slot r * senders_ + w, item idx of r's plan
  void item_sent(int slot, int idx);     // its last byte left: it lands, the worker moves on
  void item_visible(int dst, int rows);  // its rows join dst's receive pool
  // ---- receive pools ----
  void pool_add_server(int r, int n);
  void open_gate(int r);
  // Receive-side work for `rows` landed rows: dispatch reorder copy (or only a tag check when
  // senders place rows in their final position), combine reduction.
  double row_cost(double rows, double bytes_per_row) const {
    double ns;
    if (cfg_.op == Op::kDispatch)
      ns = c_.dispatch_reorder ? rows * (c_.local_row_ns + bytes_per_row / c_.local_copy_GBps)
                               : rows * c_.tag_ns;
    else
      ns = rows * (c_.local_row_ns + bytes_per_row / reduce_GBps());
    if (cfg_.algo == Algo::kUbep && cfg_.sync == Sync::kSentinel)
      ns += rows * bytes_per_row / c_.local_copy_GBps;  // reset the sentinels for the next call
    // (kSentinelDeferred resets after the call returns: not on this call's receive path)
    return ns;
  }
  double reduce_GBps() const { return c_.reduce_GBps > 0 ? c_.reduce_GBps : c_.local_copy_GBps; }
  bool in_place() const {
    return cfg_.algo == Algo::kUbep && cfg_.op == Op::kCombine && c_.combine_in_place;
  }
  void check_rank_done(int r);
  CallProgress progress_;  // long calls (8,192 ranks) show how far they are
  // ---- orchestrations ----
  void run_bsp();
  void run_ubep();
  // An all-to-all flag barrier (DeepEP's barrier_block, our FlagBarrier, the bsp flag stage):
  // every rank posts a flag to every peer, spread over its workers, and polls every peer's
  // flag; it grows with R through the posts and polls, plus the farthest latency once.
  double barrier_cost() const {
    return posted_ns(R_, W_) + machine_->max_latency_ns() +
           std::ceil(static_cast<double>(R_) / W_) * c_.poll_ns + c_.barrier_round_extra_ns;
  }
  double layout_ns() const {
    return cfg_.op == Op::kDispatch
               ? static_cast<double>(tr_.tokens_per_rank) * tr_.topk * c_.layout_ns_per_entry / W_
               : 0.0;
  }
  // Time for `n` posted stores spread over `workers`.
  double posted_ns(int n, int workers) const {
    return std::ceil(static_cast<double>(n) / workers) * c_.issue_ns;
  }

  const Preset& preset_;
  Preset eff_;  // the preset with this call's rates (CostParams::rate_sets)
  const CostParams& c_;
  const CallConfig& cfg_;
  const Traffic& tr_;
  EventQueue q_;
  Network net_;
  std::unique_ptr<Machine> machine_;
  int R_, W_ = 1, senders_ = 1, El_ = 1;
  bool split_ = false;
  std::vector<double> start_;
  double payload_ = 0, wire_ = 0;

  std::vector<sched::Plan> plans_;           // per source rank
  std::vector<double> recv_rows_;            // per rank: rows it receives
  std::vector<uint64_t> recv_tasks_;         // per rank: receive-pool tasks (rows it receives)
  std::vector<std::vector<double>> issued_;  // [rank][item]: issue time (record_transfers only)

  struct WorkerState {
    int next = 0, end = 0, outstanding = 0;
    std::function<void()> on_done;
    double done_at = 0;
    double last_land = 0;  // when the worker's last item becomes visible at its receiver
    bool finished = false;
  };
  std::vector<WorkerState> workers_;  // [r * senders + w]
  std::vector<int> senders_left_;     // per rank: workers still sending
  std::vector<double> send_done_;     // per rank
  std::vector<ReceivePool> pools_;
  std::vector<double> finish_;
  std::vector<bool> rank_done_;
  CallResult res_;
};

void CallSim::make_plans() {
  const auto& topo = preset_.topology;
  payload_ = row_payload_bytes(cfg_.op, cfg_.hidden, cfg_.elem_bytes, tr_.topk);
  wire_ = wire_bytes(payload_, cfg_.algo, cfg_.sync, c_);
  const auto row_bytes = static_cast<int64_t>(std::llround(wire_));
  // Rows each source sends to each destination rank (combine: the reverse direction).
  std::vector<std::vector<int64_t>> per_dest(static_cast<size_t>(R_));
  std::vector<std::vector<int64_t>> per_expert(static_cast<size_t>(R_));
  for (int s = 0; s < R_; ++s) {
    const auto& ids = tr_.ids[static_cast<size_t>(s)];
    per_expert[static_cast<size_t>(s)] = sched::rows_per_expert(ids, tr_.experts);
    if (cfg_.latency_layout) {
      auto& d = per_dest[static_cast<size_t>(s)];
      d.assign(static_cast<size_t>(R_), 0);
      for (int e = 0; e < tr_.experts; ++e)
        d[static_cast<size_t>(e / El_)] +=
            per_expert[static_cast<size_t>(s)][static_cast<size_t>(e)];
    } else {
      per_dest[static_cast<size_t>(s)] =
          sched::rows_per_destination(ids, tr_.topk, R_, tr_.experts);
    }
  }
  // Rows each rank receives from all sources: the receiver term of the scheduler's cost model
  // (dispatch: what every source sends it; combine: what it dispatched, coming back).
  std::vector<int64_t> recv_total(static_cast<size_t>(R_), 0);
  for (int s = 0; s < R_; ++s)
    for (int d = 0; d < R_; ++d)
      recv_total[static_cast<size_t>(cfg_.op == Op::kDispatch ? d : s)] +=
          per_dest[static_cast<size_t>(s)][static_cast<size_t>(d)];
  // The planner sees the machine's links as they are: work-conserving ports (levels mapped onto
  // them as here), each worker at most its engine's rate (SchedulerOptions::worker_gbps).
  sched::SchedulerOptions options{senders_, cfg_.policy};
  options.min_piece_bytes = cfg_.min_piece_bytes;
  if (cfg_.plan_sharing) {
    options.worker_gbps = c_.worker_GBps;
    options.link_of_level = preset_.port_of_level;
    // What a receiver does with an item's rows once it lands (item_visible).
    if (cfg_.algo == Algo::kUbep) options.consume_row_ns = row_cost(1.0, payload_);
  }
  sched::Scheduler scheduler(topo, options);
  plans_.resize(static_cast<size_t>(R_));
  recv_rows_.assign(static_cast<size_t>(R_), 0.0);
  recv_tasks_.assign(static_cast<size_t>(R_), 0);
  std::vector<int64_t> rows(static_cast<size_t>(R_));
  for (int src = 0; src < R_; ++src) {
    sched::SendWork work;
    work.src_rank = src;
    work.row_bytes = row_bytes;
    if (cfg_.plan_receivers) work.recv_rows = recv_total;
    if (cfg_.op == Op::kDispatch) {
      if (cfg_.latency_layout) {
        work.experts_per_rank = El_;
        work.rows = per_expert[static_cast<size_t>(src)];
      } else {
        work.rows = per_dest[static_cast<size_t>(src)];
      }
    } else {
      for (int d = 0; d < R_; ++d)
        rows[static_cast<size_t>(d)] = per_dest[static_cast<size_t>(d)][static_cast<size_t>(src)];
      work.rows = rows;
    }
    scheduler.plan(work, plans_[static_cast<size_t>(src)]);
    const auto& plan = plans_[static_cast<size_t>(src)];
    for (const auto& it : plan.items) {
      recv_rows_[static_cast<size_t>(it.dest_rank)] += static_cast<double>(it.rows());
      recv_tasks_[static_cast<size_t>(it.dest_rank)] += static_cast<uint64_t>(it.rows());
    }
    res_.planned_items += plan.items.size();
    if (cfg_.record_transfers) issued_.emplace_back(plan.items.size(), 0.0);
    res_.planned_slowest_ns = std::max(res_.planned_slowest_ns, plan.slowest_ns);
  }
}

void CallSim::start_worker(int r, int w, double at, std::function<void()> on_done) {
  auto& ws = workers_[static_cast<size_t>(r * senders_ + w)];
  const auto& plan = plans_[static_cast<size_t>(r)];
  ws.next = plan.worker_begin[static_cast<size_t>(w)];
  ws.end = plan.worker_begin[static_cast<size_t>(w) + 1];
  ws.on_done = std::move(on_done);
  q_.at(at, [this, r, w] { issue_next(r, w); });
}

// Posted stores, as the scheduler's cost model has them: a worker pushes an item's bytes
// through its links (sharing them with every other flow), then moves on; the item lands one
// latency later. Stop-and-wait instead holds the worker until the data's acknowledgment is back
// (a fence), then posts the separate flag, which lands one more latency later.
void CallSim::issue_next(int r, int w) {
  auto& ws = workers_[static_cast<size_t>(r * senders_ + w)];
  if (ws.finished) return;
  if (ws.next >= ws.end && ws.outstanding == 0) {
    ws.finished = true;
    ws.done_at = q_.now();
    res_.slowest_sender_ns =
        std::max(res_.slowest_sender_ns, ws.last_land - start_[static_cast<size_t>(r)]);
    auto done = std::move(ws.on_done);
    if (done) done();
    return;
  }
  while (ws.outstanding < std::max(1, c_.window) && ws.next < ws.end) {
    const int idx = ws.next++;
    ++ws.outstanding;
    const int slot = r * senders_ + w;
    q_.after(c_.issue_ns, [this, slot, idx] { start_item(slot, idx); });  // a lane (engine.hpp)
  }
}

// An item's closures hold `this` and two ints: 16 bytes, which std::function stores in place
// (with the issue time or more ints in them, each was a heap allocation, three per item).
// The issue time is kept aside only when transfers are recorded.
void CallSim::start_item(int slot, int idx) {
  const int r = slot / senders_, w = slot % senders_;
  const auto& it = plans_[static_cast<size_t>(r)].items[static_cast<size_t>(idx)];
  if ((++res_.simulated_items & 0x3fff) == 0 && cfg_.progress)
    progress_.report(res_.simulated_items, res_.planned_items);
  if (cfg_.record_transfers) issued_[static_cast<size_t>(r)][static_cast<size_t>(idx)] = q_.now();
  // In-place combine: the rows stay where the expert wrote them; the worker only tags them.
  const double bytes = in_place() ? 0.0 : static_cast<double>(it.bytes);
  const double hold = in_place() ? static_cast<double>(it.rows()) * c_.tag_ns : 0.0;
  res_.wire_bytes += bytes;
  net_.start_flow(
      machine_->path(r, w, it.dest_rank), bytes, hold, [this, slot, idx] { item_sent(slot, idx); },
      slot);
}

void CallSim::item_sent(int slot, int idx) {
  const int r = slot / senders_;
  const auto& item = plans_[static_cast<size_t>(r)].items[static_cast<size_t>(idx)];
  const int dst = item.dest_rank;
  const double lat = machine_->latency_ns(r, dst);
  auto& ws = workers_[static_cast<size_t>(slot)];
  double visible_at = q_.now() + lat, resume_at = q_.now();
  if (cfg_.algo == Algo::kUbep && cfg_.sync == Sync::kStopAndWait) {
    resume_at =
        q_.now() + 2 * lat + c_.fence_ns + c_.issue_ns;  // data lands, ack returns, flag posted
    visible_at = resume_at + lat;
  }
  ws.last_land = std::max(ws.last_land, visible_at);
  if (cfg_.record_transfers) {
    q_.at(visible_at, [this, slot, idx] {
      const int r3 = slot / senders_;
      const auto& i3 = plans_[static_cast<size_t>(r3)].items[static_cast<size_t>(idx)];
      res_.transfers.push_back(
          Transfer{r3, slot % senders_, i3.dest_rank, i3.expert, i3.row_begin, i3.row_end,
                   issued_[static_cast<size_t>(r3)][static_cast<size_t>(idx)], q_.now()});
      item_visible(i3.dest_rank, static_cast<int>(i3.rows()));
    });
  } else {
    const int rows = static_cast<int>(item.rows());
    // after(lat) is at(now + lat) = at(visible_at), in a lane when not stop-and-wait.
    if (visible_at == q_.now() + lat)
      q_.after(lat, [this, dst, rows] { item_visible(dst, rows); });
    else
      q_.at(visible_at, [this, dst, rows] { item_visible(dst, rows); });
  }
  q_.at(resume_at, [this, slot] {
    --workers_[static_cast<size_t>(slot)].outstanding;
    issue_next(slot / senders_, slot % senders_);
  });
}

// One task per row, not per item: a row's reorder or reduction does not depend on the item's
// other rows, so the receiver's idle workers share a large item's rows (the same work, in
// parallel), as they shared the one-row items of plans before the scheduler's piece floor.
void CallSim::item_visible(int dst, int rows) {
  if (cfg_.algo == Algo::kBsp) return;  // bsp consumes after its barriers
  pools_[static_cast<size_t>(dst)].arrive(q_.now(), static_cast<uint64_t>(rows));
  check_rank_done(dst);
}

void CallSim::pool_add_server(int r, int n) {
  pools_[static_cast<size_t>(r)].add_servers(q_.now(), n);
}

void CallSim::open_gate(int r) {
  pools_[static_cast<size_t>(r)].open_gate(q_.now());
  check_rank_done(r);
}

// The rank is done when its senders are, its gate is open and its pool has every row: at the
// last of those events, or when the pool's last row completes, if later (the pool computes its
// completions ahead: receive_pool.hpp).
void CallSim::check_rank_done(int r) {
  if (rank_done_[static_cast<size_t>(r)]) return;
  const auto& p = pools_[static_cast<size_t>(r)];
  if (senders_left_[static_cast<size_t>(r)] > 0 || !p.gate_open() ||
      p.started() < recv_tasks_[static_cast<size_t>(r)])
    return;
  rank_done_[static_cast<size_t>(r)] = true;
  finish_[static_cast<size_t>(r)] = std::max(q_.now(), p.last_done());
}

void CallSim::run_ubep() {
  const bool dispatch = cfg_.op == Op::kDispatch;
  // Count records: the count-sender role (spread over the senders, like bsp's count stage)
  // posts one record to every rank before the tokens; a receiver's prefix sum waits for all of
  // them: a point-to-point dependency, polled by its workers in parallel as bsp verifies flags.
  double sw_extra = 0;  // stop-and-wait: each count record is fenced and flagged too
  if (cfg_.sync == Sync::kStopAndWait) sw_extra = c_.fence_ns + c_.issue_ns;
  const int per_sender = (R_ + senders_ - 1) / senders_;
  std::vector<double> counts_ready(static_cast<size_t>(R_), 0.0);
  for (int s = 0; s < R_ && dispatch; ++s) {
    const double t0 = start_[static_cast<size_t>(s)] + layout_ns();
    for (int k = 1; k <= R_; ++k) {
      const int d = (s + k) % R_;
      const double lat = machine_->latency_ns(s, d);
      const double posted = t0 + ((k - 1) % per_sender + 1) * c_.issue_ns;
      const double land = posted + lat + (sw_extra > 0 ? sw_extra + 2 * lat : 0.0);
      counts_ready[static_cast<size_t>(d)] = std::max(counts_ready[static_cast<size_t>(d)], land);
    }
  }
  for (int r = 0; r < R_; ++r) {
    const double s = start_[static_cast<size_t>(r)];
    const double gate = dispatch ? std::max(counts_ready[static_cast<size_t>(r)], s) +
                                       std::ceil(static_cast<double>(R_) / W_) * c_.poll_ns +
                                       static_cast<double>(R_) * El_ * c_.prefix_ns_per_entry
                                 : s;
    q_.at(gate, [this, r] { open_gate(r); });
    // Split roles: the reorder workers are all the pool's servers (sealed: none joins later).
    if (split_)
      q_.at(s, [this, r] {
        pool_add_server(r, c_.ubep_reorder_workers);
        pools_[static_cast<size_t>(r)].seal(q_.now());
      });
    const double t0 = s + layout_ns();
    for (int w = 0; w < senders_; ++w) {
      const double begin = t0 + (dispatch ? per_sender * c_.issue_ns : 0.0);
      start_worker(r, w, begin, [this, r] {
        // Shared roles: a worker that has sent everything turns to receiving.
        if (!split_) pool_add_server(r, 1);
        if (--senders_left_[static_cast<size_t>(r)] == 0) {
          if (!split_) pools_[static_cast<size_t>(r)].seal(q_.now());  // every sender joined
          send_done_[static_cast<size_t>(r)] = q_.now();
          check_rank_done(r);
        }
      });
    }
  }
  q_.run();
}

void CallSim::run_bsp() {
  const bool dispatch = cfg_.op == Op::kDispatch;
  const double bcost = barrier_cost();
  auto b1 = std::make_shared<Barrier>(q_, R_, bcost);
  auto b2 = std::make_shared<Barrier>(q_, R_, bcost);
  auto b3 = std::make_shared<Barrier>(q_, R_, bcost);
  auto b4 = std::make_shared<Barrier>(q_, R_, bcost);
  const double fence_all = machine_->max_latency_ns() + c_.fence_ns;  // acks of posted stores
  // Set-flag & verify: post R flags, fence, and wait for every peer's flag (all ranks left the
  // previous barrier together, so the last peer flag lands posted + farthest latency).
  const double flag_stage =
      posted_ns(R_, W_) + std::max(fence_all, machine_->max_latency_ns() + R_ * c_.poll_ns / W_);
  auto consume_ns = [this, dispatch](int r) {
    const double rows = recv_rows_[static_cast<size_t>(r)];
    if (dispatch && !c_.dispatch_reorder) return 0.0;  // rows are already in their final place
    const double reduce =
        c_.staged_reduce_GBps > 0 ? c_.staged_reduce_GBps : reduce_GBps();  // from staging
    return std::ceil(rows / W_) *
           (c_.local_row_ns + payload_ / (dispatch ? c_.local_copy_GBps : reduce));
  };
  for (int r = 0; r < R_; ++r) {
    const double s = start_[static_cast<size_t>(r)];
    auto after_send = [this, r, b2, b3, b4, flag_stage, consume_ns, dispatch] {
      // All items of this rank landed; fence them before announcing.
      q_.after(c_.fence_ns, [this, r, b2, b3, b4, flag_stage, consume_ns, dispatch] {
        b2->arrive([this, r, b3, b4, flag_stage, consume_ns, dispatch] {
          q_.after(flag_stage, [this, r, b3, b4, consume_ns, dispatch] {
            b3->arrive([this, r, b4, consume_ns, dispatch] {
              const double prefix =
                  dispatch ? static_cast<double>(R_) * El_ * c_.prefix_ns_per_entry : 0.0;
              q_.after(prefix + consume_ns(r), [this, r, b4] {
                auto finish = [this, r] {
                  finish_[static_cast<size_t>(r)] = q_.now();
                  rank_done_[static_cast<size_t>(r)] = true;
                };
                if (c_.bsp_final_barrier)
                  b4->arrive(finish);
                else
                  finish();
              });
            });
          });
        });
      });
    };
    auto send_stage = [this, r, after_send] {
      for (int w = 0; w < senders_; ++w)
        start_worker(r, w, q_.now(), [this, r, after_send] {
          if (--senders_left_[static_cast<size_t>(r)] == 0) {
            // Posted stores: the stage ends when the rank's last item has landed.
            double land = q_.now();
            for (int v = 0; v < senders_; ++v)
              land = std::max(land, workers_[static_cast<size_t>(r * senders_ + v)].last_land);
            send_done_[static_cast<size_t>(r)] = land;
            q_.at(land, after_send);
          }
        });
    };
    if (dispatch) {
      // Layout, then the count exchange: posted count stores, fenced, then a barrier.
      q_.at(s + layout_ns() + posted_ns(R_, W_) + fence_all,
            [b1, send_stage] { b1->arrive(send_stage); });
    } else {
      q_.at(s, send_stage);
    }
  }
  q_.run();
  // Barrier time as rank 0 sees it: each barrier's cost plus its wait for the last arrival is
  // not separable here; report the pure barrier cost times the barriers crossed.
  res_.barrier_ns = bcost * ((dispatch ? 3 : 2) + (c_.bsp_final_barrier ? 1 : 0));
}

CallResult CallSim::run() {
  make_plans();
  workers_.assign(static_cast<size_t>(R_ * senders_), WorkerState{});
  senders_left_.assign(static_cast<size_t>(R_), senders_);
  send_done_.assign(static_cast<size_t>(R_), 0.0);
  pools_.assign(static_cast<size_t>(R_), ReceivePool(row_cost(1.0, payload_)));
  finish_.assign(static_cast<size_t>(R_), 0.0);
  rank_done_.assign(static_cast<size_t>(R_), false);
  if (cfg_.algo == Algo::kBsp)
    run_bsp();
  else
    run_ubep();
  for (int r = 0; r < R_; ++r)
    UBEP_CHECK(rank_done_[static_cast<size_t>(r)], Error, "simulation ended with rank ", r,
               " unfinished (a modelling bug)");
  res_.finish_ns = finish_;
  res_.recv_rows = recv_rows_;
  res_.start_ns = *std::min_element(start_.begin(), start_.end());
  res_.makespan_ns = *std::max_element(finish_.begin(), finish_.end()) - res_.start_ns;
  res_.events = q_.executed();
  res_.resolves = net_.resolves();
  res_.flows_refilled = net_.flows_refilled();
  res_.trace = net_.trace();
  res_.payload_bytes = 0;
  for (int r = 0; r < R_; ++r) res_.payload_bytes += recv_rows_[static_cast<size_t>(r)] * payload_;
  if (cfg_.record_transfers) res_.plans = plans_;
  return std::move(res_);
}

}  // namespace

CallResult simulate_call(const Preset& preset, const CallConfig& config, const Traffic& traffic,
                         std::span<const double> start_ns) {
  CallSim sim(preset, config, traffic, start_ns);
  return sim.run();
}

}  // namespace ubep::sim
