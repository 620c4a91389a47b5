// ubep-sim executes exactly the scheduler's plan: every planned item is simulated once, by
// the worker the plan gave it to, in the plan's order; and orchestration-level sanity.
#include <gtest/gtest.h>

#include "temp_files.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <tuple>

#include "sim/call.hpp"
#include "ubep/error.hpp"

using namespace ubep;
using namespace ubep::sim;

namespace {

using Key = std::tuple<int, int, int, int64_t, int64_t>;  // src, dest, expert, row_begin, row_end

void expect_plan_executed_once(Algo algo, Op op, sched::Policy policy, bool latency_layout) {
  const Preset p = make_preset("cm384", 32);
  const Traffic t = draw_traffic(32, 256, 8, 64, 8, 4.0, 7);
  CallConfig cfg;
  cfg.algo = algo;
  cfg.op = op;
  cfg.policy = policy;
  cfg.latency_layout = latency_layout;
  cfg.record_transfers = true;
  const CallResult r = simulate_call(p, cfg, t);
  ASSERT_EQ(r.plans.size(), 32u);
  std::map<Key, int> planned;
  std::map<std::pair<int, int>, std::vector<Key>> planned_order;  // (src, worker) -> items in order
  uint64_t n = 0;
  for (const auto& plan : r.plans) {
    for (int w = 0; w < plan.workers; ++w)
      for (const auto& it : plan.worker_items(w)) {
        const Key k{plan.src_rank, it.dest_rank, it.expert, it.row_begin, it.row_end};
        ++planned[k];
        planned_order[{plan.src_rank, w}].push_back(k);
        ++n;
      }
  }
  EXPECT_EQ(r.planned_items, n);
  EXPECT_EQ(r.simulated_items, n);
  ASSERT_EQ(r.transfers.size(), n);
  std::map<Key, int> simulated;
  std::map<std::pair<int, int>, std::vector<std::pair<double, Key>>> issued;
  for (const auto& tr : r.transfers) {
    const Key k{tr.src, tr.dest, tr.expert, tr.row_begin, tr.row_end};
    ++simulated[k];
    issued[{tr.src, tr.worker}].push_back({tr.issue_ns, k});
    EXPECT_GE(tr.visible_ns, tr.issue_ns);
  }
  EXPECT_EQ(simulated, planned);   // every planned item exactly once, nothing else
  for (auto& [key, v] : issued) {  // each worker ran its own items, in the plan's order (window 1)
    std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first < b.first; });
    std::vector<Key> got;
    for (auto& [tm, k] : v) got.push_back(k);
    EXPECT_EQ(got, planned_order[key]) << "src " << key.first << " worker " << key.second;
  }
}

}  // namespace

TEST(SimCall, ExecutesThePlanOnceUbepDispatchLatencyLayout) {
  expect_plan_executed_once(Algo::kUbep, Op::kDispatch, sched::Policy::kColumnMajor, true);
}
TEST(SimCall, ExecutesThePlanOnceBspDispatchThroughput) {
  expect_plan_executed_once(Algo::kBsp, Op::kDispatch, sched::Policy::kNaive, false);
}
TEST(SimCall, ExecutesThePlanOnceUbepCombineBalanced) {
  expect_plan_executed_once(Algo::kUbep, Op::kCombine, sched::Policy::kBalanced, true);
}

// Rows on the wire add up to the routing: a token goes once per (token, expert) in the latency
// layout and once per (token, destination rank) in the throughput layout.
TEST(SimCall, RowsMatchTheRouting) {
  const Preset p = make_preset("cm384", 16);
  const Traffic t = draw_traffic(16, 64, 4, 32, 0, 1.0, 3);
  for (bool latency : {true, false}) {
    CallConfig cfg;
    cfg.latency_layout = latency;
    const CallResult r = simulate_call(p, cfg, t);
    double rows = 0;
    for (double x : r.recv_rows) rows += x;
    double expect = 0;
    for (const auto& ids : t.ids) {
      if (latency) {
        for (int32_t e : ids) expect += e >= 0;
      } else {
        for (size_t tok = 0; tok < ids.size() / 4; ++tok) {
          std::vector<int> ranks;
          for (int k = 0; k < 4; ++k)
            if (ids[tok * 4 + k] >= 0) ranks.push_back(ids[tok * 4 + k] / 4);
          std::sort(ranks.begin(), ranks.end());
          expect += static_cast<double>(std::unique(ranks.begin(), ranks.end()) - ranks.begin());
        }
      }
    }
    EXPECT_EQ(rows, expect) << (latency ? "latency" : "throughput");
  }
}

// Orchestration sanity: bsp pays barriers, so with everything else equal ubep is faster; a
// late rank delays a ubep call by no more than its lateness, and bsp by at least it.
TEST(SimCall, BarriersAndLateRanks) {
  const Preset p = make_preset("cm384", 64);
  const Traffic t = draw_traffic(64, 256, 8, 32, 0, 1.0, 5);
  CallConfig bsp, ub;
  bsp.algo = Algo::kBsp;
  bsp.policy = ub.policy = sched::Policy::kColumnMajor;
  const double tb = simulate_call(p, bsp, t).makespan_ns;
  const double tu = simulate_call(p, ub, t).makespan_ns;
  EXPECT_LT(tu, tb);
  std::vector<double> start(64, 0.0);
  start[5] = 20000;  // rank 5 arrives 20 us late
  const CallResult lu = simulate_call(p, ub, t, start);
  const CallResult lb = simulate_call(p, bsp, t, start);
  EXPECT_LE(lu.makespan_ns, tu + 20000 + 1);
  EXPECT_GE(lb.makespan_ns, tb + 20000 - 1);
  // In ubep a rank that receives nothing from rank 5 before... every rank receives from 5 in
  // the count exchange, so every rank waits for it; but rank 5's own finish is the latest.
  EXPECT_GE(lu.finish_ns[5], *std::min_element(lu.finish_ns.begin(), lu.finish_ns.end()));
}

// The sentinel modes put no framing on the wire (payload only, unlike fused's 480/512); the
// in-call reset is one more pass over every received row at local_copy_GBps, the deferred mode
// leaves it out. EP8 BS 256 is receive-bound (each rank receives ~2,048 rows over few workers),
// so the reset must show as most of its own size: rows received x bytes / (receivers x rate).
TEST(SimCall, SentinelResetInCallOrDeferred) {
  const Preset p = make_preset("cm384", 8);
  const Traffic t = draw_traffic(8, 64, 8, 256, 0, 1.0, 3);
  CallConfig cfg;
  cfg.policy = sched::Policy::kColumnMajor;
  cfg.latency_layout = true;
  cfg.sync = Sync::kFused;
  const CallResult fused = simulate_call(p, cfg, t);
  cfg.sync = Sync::kSentinel;
  const CallResult in_call = simulate_call(p, cfg, t);
  cfg.sync = Sync::kSentinelDeferred;
  const CallResult deferred = simulate_call(p, cfg, t);
  EXPECT_NEAR(deferred.wire_bytes, deferred.payload_bytes, 1e-9 * deferred.payload_bytes);
  EXPECT_DOUBLE_EQ(in_call.wire_bytes, deferred.wire_bytes);
  EXPECT_GT(fused.wire_bytes, deferred.wire_bytes);
  // The reset of the busiest receiver, if all W workers of a rank shared it perfectly.
  double most_rows = 0;
  for (double r : deferred.recv_rows) most_rows = std::max(most_rows, r);
  const double payload = row_payload_bytes(Op::kDispatch, 7168, 2, 8);
  const double reset_floor = most_rows * payload / p.cost.local_copy_GBps / p.cost.workers_per_rank;
  ASSERT_GT(reset_floor, 1000);  // > 1 us: the shape is big enough to show it
  EXPECT_GE(in_call.makespan_ns - deferred.makespan_ns, 0.9 * reset_floor);
  EXPECT_LE(deferred.makespan_ns, fused.makespan_ns);  // fewer bytes, same receive work
}

TEST(SimCall, RejectsBadInput) {
  const Preset p = make_preset("cm384", 8);
  const Traffic t = draw_traffic(16, 64, 4, 8, 0, 1.0, 1);
  EXPECT_THROW(simulate_call(p, CallConfig{}, t), InvalidArgument);  // 16-rank traffic on 8 ranks
  EXPECT_THROW(make_preset("nope", 8), InvalidArgument);
  EXPECT_THROW(parse_sync("maybe"), InvalidArgument);
}

// One name table per enum (core/enum_names.hpp): names round-trip, the alias parses but is never
// printed, and the error lists the accepted names.
TEST(SimCall, NamesRoundTrip) {
  for (Sync s : {Sync::kFused, Sync::kStopAndWait, Sync::kSentinel, Sync::kSentinelDeferred})
    EXPECT_EQ(parse_sync(sync_name(s)), s);
  for (Algo a : {Algo::kBsp, Algo::kUbep}) EXPECT_EQ(parse_algo(algo_name(a)), a);
  EXPECT_EQ(parse_sync("stop_and_wait"), Sync::kStopAndWait);
  EXPECT_STREQ(sync_name(Sync::kStopAndWait), "stop-and-wait");
  try {
    parse_algo("fast");
    ADD_FAILURE() << "parse_algo accepted 'fast'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'fast' (expected bsp or ubep)"), std::string::npos)
        << e.what();
  }
}

// The local preset models the CPU implementation as it is: one copy per dispatched row (at the
// non-temporal rate for large calls, no receive-side reorder), bsp with 3 + 2 barriers, ubep's
// combine reading the experts' rows in place (nothing on the wire) and reducing them.
TEST(SimCall, LocalPresetModelsTheCpuImplementation) {
  const std::string path = ubep::sim::test::temp_path("ubep-sim-test-calibration.json");
  {
    std::ofstream f(path);
    f << "{\"decode_bytes\": 14680064, \"decode_copy_GBps\": 10, \"decode_stream_GBps\": 20, "
         "\"decode_reduce_GBps\": 8,"
         " \"decode_staged_reduce_GBps\": 8, \"prefill_staged_reduce_GBps\": 3,"
         " \"prefill_bytes\": 117440512, \"prefill_copy_GBps\": 4, \"prefill_stream_GBps\": 5,"
         " \"prefill_reduce_GBps\": 3, \"handoff_ns\": 100}";
  }
  const Preset p = make_preset("local", 2, path);
  const Traffic t = draw_traffic(2, 256, 8, 128, 0, 1.0, 1);  // the bench's decode shape
  CallConfig cfg;
  cfg.latency_layout = true;
  const double rows = 128.0 * 8;  // latency layout: one row per (token, k), per rank
  const double payload = row_payload_bytes(Op::kDispatch, 7168, 2, 8);
  // Dispatch: > 4 MiB per rank, so every row is one non-temporal copy at 20 GB/s; nothing else
  // costs more than a few microseconds.
  for (Algo a : {Algo::kBsp, Algo::kUbep}) {
    cfg.algo = a;
    cfg.op = Op::kDispatch;
    const Preset eff = effective_preset(p, cfg, t);
    EXPECT_EQ(eff.cost.rate_set, "decode");
    EXPECT_DOUBLE_EQ(eff.cost.worker_GBps, 20);
    const CallResult r = simulate_call(p, cfg, t);
    EXPECT_NEAR(r.makespan_ns, rows * payload / 20, 0.02 * r.makespan_ns) << algo_name(a);
    EXPECT_GE(r.makespan_ns, rows * payload / 20);
  }
  // Combine: ubep moves nothing on the wire and reduces at 8 GB/s; bsp copies at 10 GB/s first.
  cfg.op = Op::kCombine;
  cfg.algo = Algo::kUbep;
  const CallResult u = simulate_call(p, cfg, t);
  EXPECT_EQ(u.wire_bytes, 0);
  const double row = 7168 * 2;
  EXPECT_NEAR(u.makespan_ns, rows * row / 8, 0.05 * u.makespan_ns);
  cfg.algo = Algo::kBsp;
  const CallResult b = simulate_call(p, cfg, t);
  EXPECT_DOUBLE_EQ(b.wire_bytes, 2 * rows * row);  // both ranks
  // (an expert rank sends back what it received, which differs from 1024 rows by a few %)
  EXPECT_NEAR(b.makespan_ns, rows * row / 10 + rows * row / 8, 0.05 * b.makespan_ns);
  cfg.op = Op::kDispatch;
  const CallResult bd = simulate_call(p, cfg, t);
  EXPECT_NEAR(bd.barrier_ns / b.barrier_ns, 1.5, 1e-9);  // 3 barriers per dispatch, 2 per combine
  // Prefill-sized calls use the prefill rates.
  const Traffic big = draw_traffic(2, 256, 8, 4096, 0, 1.0, 1);
  cfg.latency_layout = false;
  cfg.op = Op::kDispatch;
  EXPECT_EQ(effective_preset(p, cfg, big).cost.rate_set, "prefill");
  EXPECT_DOUBLE_EQ(effective_preset(p, cfg, big).cost.worker_GBps, 5);
  std::remove(path.c_str());
}
