// Subcommands: single call, the latency / sync / scheduling experiments, bench and params.
// (tpot.cpp: the decode TPOT experiment; calibrate.cpp: calibrate and predict.)
#include "sim/experiments.hpp"

#include <sys/resource.h>
#include <algorithm>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "sim/json.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

CallConfig call_config(const Options& o, Algo algo, Op op) {
  CallConfig c;
  c.op = op;
  c.algo = algo;
  c.sync = o.sync;
  c.policy = algo == Algo::kBsp ? o.bsp_policy : o.ubep_policy;
  c.latency_layout = o.latency_layout;
  c.hidden = o.hidden;
  c.elem_bytes = o.elem_bytes;
  c.workers = o.workers;
  c.resolve_ns = o.resolve_ns;
  c.plan_receivers = o.plan_receivers;
  c.plan_sharing = o.plan_sharing;
  c.min_piece_bytes = o.min_piece_bytes;
  return c;
}

void progress(const Options& o, int done, int total, const std::string& what) {
  if (o.quiet) return;
  std::fprintf(stderr, "[%d/%d] %s\n", done, total, what.c_str());
}

namespace {

std::vector<int> or_default(const std::vector<int>& v, std::vector<int> d) {
  return v.empty() ? d : v;
}

Traffic traffic_for(const Options& o, int ranks, int batch, uint64_t seed_offset = 0) {
  return draw_traffic(ranks, o.experts, o.topk, batch, o.hot, o.hot_weight, o.seed + seed_offset);
}

// DeepEP-style bandwidth: payload bytes one rank receives / call time (GB/s = bytes/ns).
double gbps(const CallResult& r, int ranks) { return r.payload_bytes / ranks / r.makespan_ns; }

void header(const Options& o, const Preset& p) {
  std::printf("# preset %s: %s\n", p.cost.preset.c_str(), p.topology.describe().c_str());
  std::printf(
      "# hidden %d x %d B, top-%d of %d experts, hot experts %d (weight %.1f), seed %llu, layout "
      "%s\n",
      o.hidden, o.elem_bytes, o.topk, o.experts, o.hot, o.hot_weight,
      static_cast<unsigned long long>(o.seed), o.latency_layout ? "latency" : "throughput");
}

}  // namespace

int cmd_call(const Options& o) {
  const int R = or_default(o.ranks, {64})[0];
  const int B = or_default(o.batch, {128})[0];
  const Preset p = make_preset(o.preset, R, o.calibration);
  header(o, p);
  const Traffic t = traffic_for(o, R, B);
  CallConfig cfg = call_config(o, o.algo, o.op);
  cfg.progress = !o.quiet;
  const CallResult r = simulate_call(p, cfg, t);
  std::printf(
      "%s %s (%s, policy %s): %.2f us, %.1f GB/s per rank; planned slowest worker %.2f us, "
      "simulated slowest sender %.2f us; %llu items planned, %llu simulated, %llu events\n",
      algo_name(o.algo), op_name(o.op), sync_name(o.sync), sched::policy_name(cfg.policy),
      r.makespan_ns / 1e3, gbps(r, R), r.planned_slowest_ns / 1e3, r.slowest_sender_ns / 1e3,
      static_cast<unsigned long long>(r.planned_items),
      static_cast<unsigned long long>(r.simulated_items),
      static_cast<unsigned long long>(r.events));
  if (!o.json.empty()) {
    Json j;
    j.begin_object()
        .kv("experiment", "call")
        .kv("preset", o.preset)
        .kv("ranks", R)
        .kv("batch", B)
        .kv("algo", algo_name(o.algo))
        .kv("op", op_name(o.op))
        .kv("sync", sync_name(o.sync))
        .kv("us", r.makespan_ns / 1e3)
        .kv("planned_slowest_us", r.planned_slowest_ns / 1e3)
        .kv("slowest_sender_us", r.slowest_sender_ns / 1e3)
        .kv("items", static_cast<double>(r.simulated_items))
        .end_object();
    j.write(o.json);
  }
  return 0;
}

int cmd_latency(const Options& o) {
  const auto ranks = or_default(o.ranks, {64, 128, 256});
  const auto batch = or_default(o.batch, {8, 16, 32, 64, 128, 256});
  Json j;
  j.begin_object()
      .kv("experiment", "latency")
      .kv("preset", o.preset)
      .kv("op", op_name(o.op))
      .kv("bsp_policy", sched::policy_name(o.bsp_policy))
      .kv("ubep_policy", sched::policy_name(o.ubep_policy))
      .key("rows")
      .begin_array();
  const int total = static_cast<int>(ranks.size() * batch.size());
  int done = 0;
  std::printf("%6s %6s %10s %10s %9s %9s %9s\n", "ranks", "batch", "bsp_us", "ubep_us", "change",
              "bsp_GBps", "ubep_GBps");
  for (int R : ranks) {
    const Preset p = make_preset(o.preset, R, o.calibration);
    if (done == 0) header(o, p);
    for (int B : batch) {
      progress(o, ++done, total, detail::concat("EP", R, " batch ", B));
      const Traffic t = traffic_for(o, R, B);
      const CallResult bsp = simulate_call(p, call_config(o, Algo::kBsp, o.op), t);
      const CallResult ub = simulate_call(p, call_config(o, Algo::kUbep, o.op), t);
      const double change = (ub.makespan_ns / bsp.makespan_ns - 1) * 100;
      std::printf("%6d %6d %10.2f %10.2f %8.1f%% %9.1f %9.1f\n", R, B, bsp.makespan_ns / 1e3,
                  ub.makespan_ns / 1e3, change, gbps(bsp, R), gbps(ub, R));
      std::fflush(stdout);
      j.begin_object()
          .kv("ranks", R)
          .kv("batch", B)
          .kv("bsp_us", bsp.makespan_ns / 1e3)
          .kv("ubep_us", ub.makespan_ns / 1e3)
          .kv("change_pct", change)
          .kv("bsp_gbps", gbps(bsp, R))
          .kv("ubep_gbps", gbps(ub, R))
          .kv("bsp_barrier_us", bsp.barrier_ns / 1e3)
          .end_object();
    }
  }
  j.end_array().end_object();
  if (!o.json.empty()) j.write(o.json);
  return 0;
}

int cmd_sync(const Options& o) {
  const auto ranks = or_default(o.ranks, {64});
  const auto batch = or_default(o.batch, {8, 16, 32, 64, 128, 256});
  const Sync modes[] = {Sync::kStopAndWait, Sync::kFused, Sync::kSentinel};
  Json j;
  j.begin_object()
      .kv("experiment", "sync")
      .kv("preset", o.preset)
      .kv("op", op_name(o.op))
      .kv("policy", sched::policy_name(o.ubep_policy))
      .key("rows")
      .begin_array();
  const int total = static_cast<int>(ranks.size() * batch.size());
  int done = 0;
  std::printf("%6s %6s %14s %10s %10s %12s %12s\n", "ranks", "batch", "stop_wait_us", "fused_us",
              "sentinel_us", "fused_vs_sw", "sent_vs_sw");
  for (int R : ranks) {
    const Preset p = make_preset(o.preset, R, o.calibration);
    if (done == 0) header(o, p);
    for (int B : batch) {
      progress(o, ++done, total, detail::concat("EP", R, " batch ", B));
      const Traffic t = traffic_for(o, R, B);
      double us[3];
      for (int m = 0; m < 3; ++m) {
        Options om = o;
        om.sync = modes[m];
        us[m] = simulate_call(p, call_config(om, Algo::kUbep, o.op), t).makespan_ns / 1e3;
      }
      const double fused = (us[1] / us[0] - 1) * 100, sent = (us[2] / us[0] - 1) * 100;
      std::printf("%6d %6d %14.2f %10.2f %10.2f %11.1f%% %11.1f%%\n", R, B, us[0], us[1], us[2],
                  fused, sent);
      std::fflush(stdout);
      j.begin_object()
          .kv("ranks", R)
          .kv("batch", B)
          .kv("stop_and_wait_us", us[0])
          .kv("fused_us", us[1])
          .kv("sentinel_us", us[2])
          .kv("fused_change_pct", fused)
          .kv("sentinel_change_pct", sent)
          .end_object();
    }
  }
  j.end_array().end_object();
  if (!o.json.empty()) j.write(o.json);
  return 0;
}

int cmd_sched(const Options& o) {
  const int R = or_default(o.ranks, {64})[0];
  const int B = or_default(o.batch, {128})[0];
  Options oo = o;
  if (oo.hot == 0) oo.hot = 8;
  Preset p = make_preset(o.preset, R, o.calibration);
  // The paper's ablation measures the send workers: every worker sends (no reorder split).
  p.cost.ubep_reorder_workers = 0;
  header(oo, p);
  const Traffic t = traffic_for(oo, R, B);
  const sched::Policy policies[] = {sched::Policy::kNaive, sched::Policy::kColumnMajor,
                                    sched::Policy::kBalanced};
  const double paper[] = {62.2, 48.1, 43.5};
  Json j;
  j.begin_object()
      .kv("experiment", "sched")
      .kv("preset", o.preset)
      .kv("ranks", R)
      .kv("batch", B)
      .kv("hot", oo.hot)
      .kv("hot_weight", oo.hot_weight)
      .key("rows")
      .begin_array();
  std::printf("%-13s %12s %14s %14s %12s %9s\n", "policy", "planned_us", "sim_sender_us",
              "dispatch_us", "imbalance", "paper_us");
  for (int i = 0; i < 3; ++i) {
    progress(o, i + 1, 3, sched::policy_name(policies[i]));
    Options op = oo;
    op.ubep_policy = policies[i];
    CallConfig cfg = call_config(op, Algo::kUbep, Op::kDispatch);
    cfg.record_transfers = true;  // keeps the plans, for the imbalance column
    const CallResult r = simulate_call(p, cfg, t);
    double imb = 0;
    for (const auto& plan : r.plans) imb += plan.imbalance;
    imb /= static_cast<double>(r.plans.size());
    std::printf("%-13s %12.2f %14.2f %14.2f %12.2f %9.1f\n", sched::policy_name(policies[i]),
                r.planned_slowest_ns / 1e3, r.slowest_sender_ns / 1e3, r.makespan_ns / 1e3, imb,
                paper[i]);
    j.begin_object()
        .kv("policy", sched::policy_name(policies[i]))
        .kv("planned_slowest_us", r.planned_slowest_ns / 1e3)
        .kv("sim_slowest_sender_us", r.slowest_sender_ns / 1e3)
        .kv("dispatch_us", r.makespan_ns / 1e3)
        .kv("mean_imbalance", imb)
        .kv("paper_us", paper[i])
        .end_object();
  }
  j.end_array().end_object();
  if (!o.json.empty()) j.write(o.json);
  return 0;
}

namespace {

// A hash of every rank's finish time, bit for bit: the part of a call the flow trace does not
// see (ubep's receive pools finish after the last flow). Equal hashes: the same finish times.
uint64_t finish_hash(const std::vector<double>& finish_ns) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (double t : finish_ns) {
    uint64_t bits;
    std::memcpy(&bits, &t, sizeof bits);
    h = (h ^ bits) * 0x100000001b3ull;
  }
  return h;
}

}  // namespace

int cmd_bench(const Options& o) {
  const int R = or_default(o.ranks, {256})[0];
  const int B = or_default(o.batch, {128})[0];
  const Preset p = make_preset(o.preset, R, o.calibration);
  header(o, p);
  const Traffic t = traffic_for(o, R, B);
  Json j;
  j.begin_object()
      .kv("experiment", "bench")
      .kv("preset", o.preset)
      .kv("ranks", R)
      .kv("batch", B)
      .key("rows")
      .begin_array();
  const int total = 4 * o.repeats;
  int done = 0;
  const auto bench_start = std::chrono::steady_clock::now();
  for (Algo a : {Algo::kUbep, Algo::kBsp}) {
    for (Op op : {Op::kDispatch, Op::kCombine}) {
      // CPU time of this (single-threaded) process: the machine may be shared, so wall time
      // would include waiting for a core. Memory: the process's peak resident set so far.
      std::vector<double> secs, walls;
      CallResult last;
      for (int i = 0; i < o.repeats; ++i) {
        const std::clock_t c0 = std::clock();
        const auto t0 = std::chrono::steady_clock::now();
        last = simulate_call(p, call_config(o, a, op), t);
        secs.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
        walls.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        const double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count();
        if (++done < total && elapsed > 2 && !o.quiet)
          std::fprintf(stderr, "[%d/%d calls] %.1f s, ETA %.0f s\n", done, total, elapsed,
                       elapsed / done * (total - done));
      }
      std::sort(secs.begin(), secs.end());
      std::sort(walls.begin(), walls.end());
      const double med = secs[secs.size() / 2];
      rusage ru{};
      getrusage(RUSAGE_SELF, &ru);
      const double peak_gib = static_cast<double>(ru.ru_maxrss) / (1024.0 * 1024.0);  // KiB
      std::printf(
          "%-5s %-8s %3d ranks x %4d tokens x top-%d: %.3f s CPU median of %d (wall %.3f s), "
          "peak RSS %.2f GiB; %llu items, %llu events, %llu resolves refilling %llu flows; "
          "simulated %.2f us; trace %016llx, finish %016llx\n",
          algo_name(a), op_name(op), R, B, o.topk, med, o.repeats, walls[walls.size() / 2],
          peak_gib, static_cast<unsigned long long>(last.simulated_items),
          static_cast<unsigned long long>(last.events),
          static_cast<unsigned long long>(last.resolves),
          static_cast<unsigned long long>(last.flows_refilled), last.makespan_ns / 1e3,
          static_cast<unsigned long long>(last.trace),
          static_cast<unsigned long long>(finish_hash(last.finish_ns)));
      std::fflush(stdout);
      j.begin_object()
          .kv("algo", algo_name(a))
          .kv("op", op_name(op))
          .kv("cpu_median_s", med)
          .kv("wall_median_s", walls[walls.size() / 2])
          .kv("peak_rss_gib", peak_gib)
          .kv("items", static_cast<double>(last.simulated_items))
          .kv("events", static_cast<double>(last.events))
          .end_object();
    }
  }
  j.end_array().end_object();
  if (!o.json.empty()) j.write(o.json);
  return 0;
}

int cmd_params(const Options& o) {
  const int R = or_default(o.ranks, {64})[0];
  const Preset p = make_preset(o.preset, R, o.calibration);
  std::printf("preset %s, %d ranks\ntopology: %s\n", o.preset.c_str(), R,
              p.topology.describe().c_str());
  for (int l = 0; l < p.topology.num_levels(); ++l) {
    const auto& lv = p.topology.level(l);
    std::printf("  level %d %-8s latency %8.1f ns  bandwidth %8.2f GB/s  port %d\n", l,
                lv.name.c_str(), lv.latency_ns, lv.bandwidth_gbps,
                p.port_of_level[static_cast<size_t>(l)]);
  }
  const auto& c = p.cost;
  std::printf(
      "cost parameters:\n  workers_per_rank %d, worker_GBps %.2f, window %d, issue_ns %.1f,\n"
      "  local_copy_GBps %.2f, local_row_ns %.1f, fence_ns %.1f, poll_ns %.1f, "
      "barrier_round_extra_ns %.1f,\n"
      "  layout_ns_per_entry %.1f, prefix_ns_per_entry %.1f, fused %g/%g B, flag_bytes %g,\n"
      "  ubep_reorder_workers %d, attention_us %.1f, expert_weight_us %.2f, expert_ns_per_row "
      "%.1f, "
      "compute_jitter %.3f\nsources:\n",
      c.workers_per_rank, c.worker_GBps, c.window, c.issue_ns, c.local_copy_GBps, c.local_row_ns,
      c.fence_ns, c.poll_ns, c.barrier_round_extra_ns, c.layout_ns_per_entry, c.prefix_ns_per_entry,
      c.fused_payload_bytes, c.fused_unit_bytes, c.flag_bytes, c.ubep_reorder_workers,
      c.attention_us, c.expert_weight_us, c.expert_ns_per_row, c.compute_jitter);
  for (const auto& [k, v] : c.sources) std::printf("  %-24s %s\n", k.c_str(), v.c_str());
  return 0;
}

}  // namespace ubep::sim
