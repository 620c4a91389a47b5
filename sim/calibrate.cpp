// `calibrate`: measures what the local preset needs from this machine; `predict`: runs the
// local preset on ubep-bench's workloads and compares with measured medians.
//
// The rates of the calibrated shapes are the library's own calls, timed as ubep-bench times them
// (calibrate_calls.hpp): on 2 thread ranks, each op alone between group barriers, the identity
// expert in between. Per shape, with B = rows one rank receives x row bytes:
//  * stream: B over the dispatch (bsp and ubep place rows alike: the faster of the two);
//  * reduce: B over ubep's combine (the owners reduce the experts' rows in place);
//  * copy: B over bsp combine's "row send" stage (plain stores into the owners' staging);
//  * staged reduce: B over the rest of bsp's combine (its flag round is microseconds);
// and the same on a small call of 2 MiB (the cache regime of small calls). Machine figures:
//  * handoff: two threads bounce a cache line; one-way latency = round trip / 2 (what a flag
//    or an epoch tag costs to become visible);
//  * L2 (sysfs), the reuse capacity of the shared cache and the scheduler's makespan with more
//    threads than cores (calibrate_calls.hpp).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "sim/calibrate_bench.hpp"
#include "sim/calibrate_calls.hpp"
#include "sim/calibrate_rounds.hpp"
#include "sim/experiments.hpp"
#include "sim/json.hpp"
#include "sim/json_read.hpp"
#include "sim/rates.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kRow = 7168 * 2;  // a bf16 row of hidden 7168

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort
}

// L2 size of cpu0 from sysfs (0 when unknown: the model then treats every source as uncached).
double l2_bytes() {
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int l = 0;
    std::string sz;
    if (!(level >> l) || !(size >> sz) || l != 2 || sz.empty()) continue;
    const char unit = sz.back();
    const double v = std::stod(sz);
    return unit == 'K' ? v * 1024 : unit == 'M' ? v * 1024 * 1024 : v;
  }
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double handoff_ns(int iters) {
  struct alignas(64) Line {
    std::atomic<uint64_t> v{0};
  };
  Line ping, pong;
  std::thread other([&] {
    pin(1);
    for (uint64_t i = 1; i <= static_cast<uint64_t>(iters); ++i) {
      while (ping.v.load(std::memory_order_acquire) != i) {
      }
      pong.v.store(i, std::memory_order_release);
    }
  });
  pin(0);
  const auto t0 = Clock::now();
  for (uint64_t i = 1; i <= static_cast<uint64_t>(iters); ++i) {
    ping.v.store(i, std::memory_order_release);
    while (pong.v.load(std::memory_order_acquire) != i) {
    }
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  other.join();
  return ns / iters / 2;
}

}  // namespace

int cmd_calibrate(const Options& o) {
  if (!o.rounds.empty()) {
    // `calibrate --rounds R1,R2,... --out OUT`: OUT from the rounds' calibrate files, each figure
    // from its least disturbed round, and OUT_round<N>.json, round N's own (calibrate_rounds.hpp).
    const std::vector<std::string> names = comma_list(o.rounds);
    std::vector<CalibrationFields> rounds;
    for (const std::string& f : names) rounds.push_back(read_calibration_fields(f));
    const CalibrationFields best = best_of_rounds(rounds, names);
    write_calibration_fields(best, o.out);
    const std::string stem = o.out.ends_with(".json") ? o.out.substr(0, o.out.size() - 5) : o.out;
    for (size_t i = 0; i < rounds.size(); ++i)
      write_calibration_fields(round_calibration(best, rounds[i]),
                               stem + "_round" + std::to_string(i + 1) + ".json");
    std::printf("wrote %s and %s_round1..%zu.json\n", o.out.c_str(), stem.c_str(), rounds.size());
    return 0;
  }
  if (!o.measured.empty()) {
    // `calibrate --calibration FILE --measured RUNS --out OUT`: FILE with the calibrated shapes'
    // rates taken from ubep-bench runs of those shapes (calibrate_bench.hpp); nothing is timed.
    const std::vector<BenchShapeTimes> bench = shape_times_from_bench(measured_files(o));
    write_calibration_with_bench_rates(
        o.calibration.empty() ? "sim-calibration.json" : o.calibration, bench, o.out);
    std::printf("rates of the calibrated shapes from ubep-bench runs (us; least disturbed run):\n");
    std::printf("%-8s %5s %12s %12s %12s %12s %12s\n", "shape", "runs", "bsp disp", "ubep disp",
                "bsp comb", "(row send)", "ubep comb");
    for (const BenchShapeTimes& s : bench)
      std::printf("%-8s %5d %12.1f %12.1f %12.1f %12.1f %12.1f\n", s.shape.c_str(), s.runs,
                  s.times.bsp_dispatch_us, s.times.ubep_dispatch_us, s.times.bsp_combine_us,
                  s.times.bsp_combine_send_us, s.times.ubep_combine_us);
    std::printf("wrote %s\n", o.out.c_str());
    return 0;
  }
  // The library's calls on the two calibrated shapes, and a small call of 2 MiB (18 tokens x 8
  // rows; the regime of small calls, whose sources and outputs stay in cache). Until 2026-12-03
  // the library wrote a small dispatch's rows with plain stores; it streams them at every size
  // now (dispatch_call.hpp), so a calibration made before that holds the plain-store rate for
  // small dispatches and must be made again. Each rate is the call's bytes per rank over its
  // time (calibrate_calls.hpp).
  struct Named {
    const char* name;
    CallShape shape;
  };
  const int64_t cache_tokens = cache_call_tokens();
  const Named shapes[] = {{"decode", {128, 8, true, 30, 5}},
                          {"prefill", {4096, 8, false, 8, 2}},
                          {"cache", {cache_tokens, 8, true, 60, 10}}};
  Json j;
  j.begin_object();
  std::map<std::string, CallTimes> got;
  for (const Named& n : shapes) {
    progress(o, 1, 1, std::string(n.name) + " calls");
    const CallTimes t = time_library_calls(n.shape);
    got[n.name] = t;
    const double bytes = t.dispatch_rows * static_cast<double>(kRow);
    for (const auto& [key, value] :
         shape_rate_fields(n.name, bytes, static_cast<double>(n.shape.tokens), kRow, t))
      j.kv(key, value);
  }
  progress(o, 1, 1, "reuse capacity");
  std::vector<std::pair<double, double>> curve;
  const double reuse = reuse_capacity_bytes(&curve);
  // The curve's in-cache rate says which state the cache was in (calibrate_rounds.hpp).
  j.kv("l2_bytes", l2_bytes())
      .kv("reuse_capacity_bytes", reuse)
      .kv("reuse_in_cache_GBps", resident_rate(curve));
  // More ranks than cores: the scheduler's makespan for cores + 1 equal threads released
  // together, spinning as long as a decode call takes (calibrate_calls.hpp): whole threads in
  // rounds, or fair sharing (params.cpp decides which the machine does).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const CallTimes& d = got["decode"];
  const double work_us = (d.ubep_dispatch_us + d.ubep_combine_us) / 2;
  std::vector<std::pair<int, double>> oversub;
  for (int r = cores + 1; r <= cores + 1; ++r) {
    oversub.emplace_back(r, oversubscribed_makespan_ratio(r, work_us));
    j.kv(("oversubscribed_ratio_" + std::to_string(r)).c_str(), oversub.back().second);
  }
  std::vector<double> hand;
  for (int p = 0; p < 7; ++p) hand.push_back(handoff_ns(100000));
  j.kv("handoff_ns", median(hand))
      .kv("row_bytes", static_cast<double>(kRow))
      .kv("cores", cores)
      .end_object();
  j.write(o.out);
  std::printf("the library's calls on 2 thread ranks (us; slowest rank, median of iterations):\n");
  std::printf("%-8s %8s %12s %12s %12s %12s %12s\n", "shape", "MB/rank", "bsp disp", "ubep disp",
              "bsp comb", "(row send)", "ubep comb");
  for (const Named& n : shapes) {
    const CallTimes& t = got[n.name];
    std::printf("%-8s %8.2f %12.1f %12.1f %12.1f %12.1f %12.1f\n", n.name,
                t.dispatch_rows * kRow / 1e6, t.bsp_dispatch_us, t.ubep_dispatch_us,
                t.bsp_combine_us, t.bsp_combine_send_us, t.ubep_combine_us);
  }
  std::printf("L2 %.1f MiB (sysfs); write-then-read reuse capacity %.1f MiB per core\n",
              l2_bytes() / (1 << 20), reuse / (1 << 20));
  std::printf("re-read GB/s per core by MiB per core:");
  for (const auto& [b, r] : curve) std::printf(" %g:%.1f", b / (1 << 20), r);
  std::printf("\n");
  for (const auto& [r, x] : oversub)
    std::printf("%d threads on %d cores: makespan %.2f x one thread (%.0f us of work)\n", r, cores,
                x, work_us);
  std::printf("cross-core handoff (one way): %.1f ns\nwrote %s\n", median(hand), o.out.c_str());
  return 0;
}

int cmd_predict(const Options& o) {
  const int R = o.ranks.empty() ? 2 : o.ranks[0];
  const Preset p = make_preset("local", R, o.calibration);
  std::map<std::string, std::map<std::pair<std::string, std::string>, double>> measured;
  for (const std::string& f : measured_files(o)) {
    const BenchJson b = read_bench_json(f);
    measured[b.workload()] = b.medians();
  }
  struct Workload {
    const char* name;
    int tokens;
    bool latency_layout;
  };
  const Workload workloads[] = {{"decode", 128, true}, {"prefill", 4096, false}};
  Json j;
  j.begin_object().kv("experiment", "predict").kv("ranks", R).key("rows").begin_array();
  std::printf("# local preset, %d ranks: %s\n", R, p.topology.describe().c_str());
  std::printf("%-8s %-5s %-9s %12s %12s %9s  %s\n", "workload", "algo", "op", "predicted_us",
              "measured_us", "error", "rates used (shape copy/reduce)");
  for (const auto& w : workloads) {
    Options ow = o;
    ow.latency_layout = w.latency_layout;
    ow.hot = 0;
    const Traffic t = draw_traffic(R, o.experts, o.topk, w.tokens, 0, 1.0, o.seed);
    for (Algo a : {Algo::kBsp, Algo::kUbep}) {
      for (Op op : {Op::kDispatch, Op::kCombine}) {
        const CallConfig cc = call_config(ow, a, op);
        const double us = simulate_call(p, cc, t).makespan_ns / 1e3;
        const Preset eff = effective_preset(p, cc, t);
        const std::string rates = detail::concat(eff.cost.rate_set, " ", eff.cost.worker_GBps, "/",
                                                 eff.cost.reduce_GBps, " GB/s");
        double meas = -1;
        auto wit = measured.find(w.name);
        if (wit != measured.end()) {
          auto it = wit->second.find({algo_name(a), op_name(op)});
          if (it != wit->second.end()) meas = it->second;
        }
        if (meas > 0)
          std::printf("%-8s %-5s %-9s %12.1f %12.1f %8.1f%%  %s\n", w.name, algo_name(a),
                      op_name(op), us, meas, (us / meas - 1) * 100, rates.c_str());
        else
          std::printf("%-8s %-5s %-9s %12.1f %12s %9s  %s\n", w.name, algo_name(a), op_name(op), us,
                      "-", "-", rates.c_str());
        j.begin_object()
            .kv("workload", w.name)
            .kv("algo", algo_name(a))
            .kv("op", op_name(op))
            .kv("predicted_us", us)
            .kv("rate_set", eff.cost.rate_set)
            .kv("copy_GBps", eff.cost.worker_GBps)
            .kv("reduce_GBps", eff.cost.reduce_GBps);
        if (meas > 0) j.kv("measured_us", meas).kv("error_pct", (us / meas - 1) * 100);
        j.end_object();
      }
    }
  }
  j.end_array().end_object();
  if (!o.json.empty()) j.write(o.json);
  return 0;
}

}  // namespace ubep::sim
