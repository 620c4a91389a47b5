// `calibrate`: measures what the local preset needs from this machine; `predict`: runs the
// local preset on ubep-bench's workloads and compares with measured medians.
//
// Measurements (each the median of several passes, because the machine is shared):
//  * memcpy GB/s of 14 KB rows (a bf16 row of hidden 7168) into a record-strided destination
//    larger than the caches, by one core alone and per core while both cores copy at once;
//  * fixed cost per row: rows vs one bulk memcpy of the same bytes;
//  * cross-core handoff: two threads pinned to different cores bounce a cache line; one-way
//    latency = round trip / 2 (what a flag or an epoch tag costs to become visible).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "sim/experiments.hpp"
#include "sim/json.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kRow = 7168 * 2, kStride = 14464, kRows = 4096;  // 56 MB of records

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort
}

double copy_rows_ns(std::vector<char>& src, std::vector<char>& dst) {
  const auto t0 = Clock::now();
  for (size_t i = 0; i < kRows; ++i) std::memcpy(&dst[i * kStride], &src[i * kRow], kRow);
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}
double copy_bulk_ns(std::vector<char>& src, std::vector<char>& dst) {
  const auto t0 = Clock::now();
  std::memcpy(dst.data(), src.data(), kRows * kRow);
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double handoff_ns(int iters) {
  struct alignas(64) Line { std::atomic<uint64_t> v{0}; };
  Line ping, pong;
  std::thread other([&] {
    pin(1);
    for (uint64_t i = 1; i <= static_cast<uint64_t>(iters); ++i) {
      while (ping.v.load(std::memory_order_acquire) != i) {}
      pong.v.store(i, std::memory_order_release);
    }
  });
  pin(0);
  const auto t0 = Clock::now();
  for (uint64_t i = 1; i <= static_cast<uint64_t>(iters); ++i) {
    ping.v.store(i, std::memory_order_release);
    while (pong.v.load(std::memory_order_acquire) != i) {}
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  other.join();
  return ns / iters / 2;
}

}  // namespace

int cmd_calibrate(const Options& o) {
  const int passes = 7;
  std::vector<char> src(kRows * kRow, 1), dst(kRows * kStride, 0), src2(kRows * kRow, 2), dst2(kRows * kStride, 0);
  pin(0);
  std::vector<double> alone, both, bulk, hand;
  for (int p = 0; p < passes; ++p) {
    progress(o, p + 1, passes, "memcpy and handoff passes");
    alone.push_back(static_cast<double>(kRows * kRow) / copy_rows_ns(src, dst));
    bulk.push_back(copy_bulk_ns(src, dst));
    double other_gbps = 0;
    std::thread t([&] {
      pin(1);
      other_gbps = static_cast<double>(kRows * kRow) / copy_rows_ns(src2, dst2);
    });
    const double mine = static_cast<double>(kRows * kRow) / copy_rows_ns(src, dst);
    t.join();
    both.push_back((mine + other_gbps) / 2);
    hand.push_back(handoff_ns(100000));
  }
  const double rows_ns = static_cast<double>(kRows * kRow) / median(alone);
  const double overhead = std::max(0.0, (rows_ns - median(bulk)) / kRows);
  Json j;
  j.begin_object().kv("memcpy_GBps", median(alone)).kv("memcpy_both_GBps", median(both))
      .kv("handoff_ns", median(hand)).kv("row_overhead_ns", overhead).kv("passes", passes)
      .kv("row_bytes", static_cast<double>(kRow)).kv("rows", static_cast<double>(kRows)).end_object();
  j.write(o.out);
  std::printf("memcpy of 14 KB rows: %.2f GB/s alone, %.2f GB/s per core with both cores copying\n"
              "fixed cost per row: %.1f ns; cross-core handoff (one way): %.1f ns\nwrote %s\n",
              median(alone), median(both), overhead, median(hand), o.out.c_str());
  return 0;
}

namespace {

// (impl, op) -> median_us from ubep-bench --json files.
std::map<std::pair<std::string, std::string>, double> read_bench(const std::string& path) {
  std::ifstream in(path);
  UBEP_CHECK_ARG(in.good(), "cannot read ubep-bench JSON '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::map<std::pair<std::string, std::string>, double> out;
  const std::regex re("\"impl\":\\s*\"([a-z0-9_]+)\",\\s*\"op\":\\s*\"([a-z]+)\",\\s*\"median_us\":\\s*([-+0-9.eE]+)"
                      "[^}]*?(\"sync\":\\s*\"([a-z-]+)\")?");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    if (m[5].matched && m[5].str() != "fused") continue;
    out[{m[1].str(), m[2].str()}] = std::stod(m[3].str());
  }
  return out;
}

std::string workload_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::smatch m;
  const std::string text = ss.str();
  if (std::regex_search(text, m, std::regex("\"workload\":\\s*\"([a-z]+)\""))) return m[1].str();
  return "";
}

}  // namespace

int cmd_predict(const Options& o) {
  const int R = o.ranks.empty() ? 2 : o.ranks[0];
  const Preset p = make_preset("local", R, o.calibration);
  std::map<std::string, std::map<std::pair<std::string, std::string>, double>> measured;
  if (!o.measured.empty()) {
    std::stringstream ss(o.measured);
    std::string f;
    while (std::getline(ss, f, ',')) measured[workload_of(f)] = read_bench(f);
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
  std::printf("%-8s %-5s %-9s %12s %12s %9s\n", "workload", "algo", "op", "predicted_us", "measured_us", "error");
  for (const auto& w : workloads) {
    Options ow = o;
    ow.latency_layout = w.latency_layout;
    ow.hot = 0;
    const Traffic t = draw_traffic(R, o.experts, o.topk, w.tokens, 0, 1.0, o.seed);
    for (Algo a : {Algo::kBsp, Algo::kUbep}) {
      for (Op op : {Op::kDispatch, Op::kCombine}) {
        const double us = simulate_call(p, call_config(ow, a, op), t).makespan_ns / 1e3;
        double meas = -1;
        auto wit = measured.find(w.name);
        if (wit != measured.end()) {
          auto it = wit->second.find({algo_name(a), op_name(op)});
          if (it != wit->second.end()) meas = it->second;
        }
        if (meas > 0)
          std::printf("%-8s %-5s %-9s %12.1f %12.1f %8.1f%%\n", w.name, algo_name(a), op_name(op), us, meas,
                      (us / meas - 1) * 100);
        else
          std::printf("%-8s %-5s %-9s %12.1f %12s %9s\n", w.name, algo_name(a), op_name(op), us, "-", "-");
        j.begin_object().kv("workload", w.name).kv("algo", algo_name(a)).kv("op", op_name(op)).kv("predicted_us", us);
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
