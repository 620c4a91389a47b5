// `calibrate`: measures what the local preset needs from this machine; `predict`: runs the
// local preset on ubep-bench's workloads and compares with measured medians.
//
// The rates are measured with the library's own row kernels (src/backend/cpu/row_kernels.hpp), on
// two threads pinned to cores 0 and 1 doing the same work at once (as the bench's two ranks do), at
// the working-set sizes of the bench's two workloads (this machine has a large shared L3, so
// rates depend on the size). Each is the median of several passes. Per shape (rows per rank =
// tokens x copies of each token; half the rows go into the thread's own window, half into the
// other's, in destination order, as ubep/bsp dispatch does):
//  * stream: dispatch's row placement: kernels::copy_row_to_peer (non-temporal stores + sfence)
//    per row, plus the row's metadata and a release store of its tag (place_row);
//  * then, untimed, each thread copies its placed rows into its combine input (the bench's
//    expert writes the combine buffer the same way);
//  * reduce: kernels::reduce_rows over each token's rows (decode: 8 weighted rows, k order;
//    prefill: 2 rows), half of them in the other thread's combine input: ubep's in-place
//    combine; rate = input bytes per ns;
//  * copy: bsp's combine staging: plain memcpy of the combine rows into the owners' staging;
//  * staged reduce: the same reduction over the staging (bsp's combine);
// Each pass uses the window set of its parity, as the bench's calls alternate window halves.
//  * handoff: two threads bounce a cache line; one-way latency = round trip / 2 (what a flag
//    or an epoch tag costs to become visible).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "backend/cpu/row_kernels.hpp"
#include "sim/experiments.hpp"
#include "sim/json.hpp"
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

struct Shape {
  const char* name;
  int64_t tokens;  // tokens per rank
  int copies;      // rows per token (decode: top-8 in the latency layout; prefill: 2 ranks)
  bool weighted;   // reduce with weights (latency layout)
};

struct ShapeRates {
  double bytes = 0, copy = 0, stream = 0, reduce = 0, staged_reduce = 0;
};

// One thread's buffers ("rank"): its tokens, its window of placed rows, metadata, output.
struct RankMem {
  // Windows used by alternate passes, as the bench's calls alternate the window halves (so a
  // pass touches lines last touched two passes ago): win[0..1] dispatch outputs, win[2..3] the
  // experts' combine input (comb_x), win[4..5] bsp's combine staging.
  static constexpr int kWins = 6;
  std::vector<char> x, win[kWins], y;
  std::vector<int64_t> src;
  std::vector<std::atomic<uint32_t>> tags;
  RankMem(const Shape& s)
      : x(static_cast<size_t>(s.tokens) * kRow + 64, 1),
        y(static_cast<size_t>(s.tokens) * kRow + 64, 0),
        src(static_cast<size_t>(2 * s.tokens * s.copies), 0),
        tags(static_cast<size_t>(s.tokens * s.copies)) {
    for (auto& w : win) w.assign(static_cast<size_t>(s.tokens * s.copies) * kRow + 64, 0);
    // Token values like the bench's (bf16 in [-1, 1)): constant bytes would be subnormal bf16
    // values, and subnormal arithmetic would make the reduction look many times slower.
    uint32_t h = 12345;
    for (size_t i = 0; i + 1 < x.size(); i += 2) {
      h = h * 1664525u + 1013904223u;
      const uint16_t v =
          static_cast<uint16_t>(0x3C00u | (h >> 25)) | static_cast<uint16_t>((h >> 16) & 0x8000u);
      std::memcpy(&x[i], &v, 2);
    }
  }
  char* row(int w, int64_t i) {  // 64-byte aligned rows, as in the shared window
    auto base = reinterpret_cast<uintptr_t>(win[w].data());
    return reinterpret_cast<char*>((base + 63) & ~uintptr_t(63)) + static_cast<size_t>(i) * kRow;
  }
};

ShapeRates measure_shape(const Options& o, const Shape& s, int passes) {
  RankMem m0(s), m1(s);
  RankMem* mem[2] = {&m0, &m1};
  const int64_t rows = s.tokens * s.copies, half = rows / 2;
  std::barrier sync(2);
  std::vector<double> t_stream[2], t_copy[2], t_reduce[2], t_staged[2];
  // Rows to both "ranks" (half each), from the tokens (src < 0) or from window src's rows.
  auto place = [&](int me, bool stream, uint32_t tag, int w, int src) {
    // Destinations in rotated order (the peer first), each destination's rows in token order.
    for (int k = 1; k <= 2; ++k) {
      const int d = (me + k) % 2;
      RankMem& dst = *mem[d];
      for (int64_t i = 0; i < half; ++i) {
        const int64_t pos = me * half + i;  // my rows at d follow the lower rank's
        const char* row =
            src < 0
                ? mem[me]->x.data() + static_cast<size_t>((i * 2 + d) / s.copies % s.tokens) * kRow
                : mem[me]->row(src, d * half + i);
        if (stream)
          kernels::copy_row_to_peer(dst.row(w, pos), row, kRow);
        else
          std::memcpy(dst.row(w, pos), row, kRow);
        dst.src[static_cast<size_t>(2 * pos)] = me;
        dst.src[static_cast<size_t>(2 * pos + 1)] = i;
        dst.tags[static_cast<size_t>(pos)].store(tag, std::memory_order_release);
      }
    }
  };
  auto reduce = [&](int me, int win) {
    const void* ptrs[64];
    float w[64];
    for (int j = 0; j < s.copies; ++j) w[j] = 0.1f * static_cast<float>(j + 1);
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int j = 0; j < s.copies; ++j) {  // alternate between the two windows
        const int r = (j + static_cast<int>(t)) % 2;
        ptrs[j] = mem[r]->row(win, (me * half + (t * s.copies + j) / 2) % rows);
      }
      kernels::reduce_rows(mem[me]->y.data() + static_cast<size_t>(t) * kRow, DType::kBF16, 7168,
                           ptrs, s.weighted ? w : nullptr, s.copies);
    }
  };
  auto ms_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  };
  auto body = [&](int me) {
    pin(me);
    for (int p = 0; p < passes; ++p) {
      if (me == 0) progress(o, p + 1, passes, std::string(s.name) + " shape passes");
      const uint32_t tag = static_cast<uint32_t>(p + 1);
      const int par = p % 2;
      // Dispatch: rows into their final place (non-temporal), as both algorithms do.
      sync.arrive_and_wait();
      auto t0 = Clock::now();
      place(me, true, tag, par, -1);
      t_stream[me].push_back(ms_since(t0));
      // The bench's expert (untimed): its received rows into its own combine input, plain.
      std::memcpy(mem[me]->row(2 + par, 0), mem[me]->row(par, 0), static_cast<size_t>(rows) * kRow);
      // ubep combine: reduce the experts' rows in place (half in the other thread's window).
      sync.arrive_and_wait();
      t0 = Clock::now();
      reduce(me, 2 + par);
      t_reduce[me].push_back(ms_since(t0));
      // bsp combine: push the rows into the owners' staging (plain stores), then reduce there.
      sync.arrive_and_wait();
      t0 = Clock::now();
      place(me, false, tag, 4 + par, 2 + par);
      t_copy[me].push_back(ms_since(t0));
      sync.arrive_and_wait();
      t0 = Clock::now();
      reduce(me, 4 + par);
      t_staged[me].push_back(ms_since(t0));
    }
  };
  std::thread other(body, 1);
  body(0);
  other.join();
  const double bytes = static_cast<double>(rows) * kRow;
  auto rate = [&](std::vector<double>* t) {  // per-core GB/s, mean of the two cores' medians
    return (bytes / median(t[0]) + bytes / median(t[1])) / 2;
  };
  return ShapeRates{bytes, rate(t_copy), rate(t_stream), rate(t_reduce), rate(t_staged)};
}

}  // namespace

int cmd_calibrate(const Options& o) {
  const Shape shapes[] = {{"decode", 128, 8, true}, {"prefill", 4096, 2, false}};
  Json j;
  j.begin_object();
  std::map<std::string, ShapeRates> got;
  for (const Shape& s : shapes) {
    const ShapeRates r = measure_shape(o, s, std::string(s.name) == "decode" ? 15 : 7);
    got[s.name] = r;
    const std::string n = s.name;
    j.kv((n + "_bytes").c_str(), r.bytes)
        .kv((n + "_copy_GBps").c_str(), r.copy)
        .kv((n + "_stream_GBps").c_str(), r.stream)
        .kv((n + "_reduce_GBps").c_str(), r.reduce)
        .kv((n + "_staged_reduce_GBps").c_str(), r.staged_reduce)
        .kv((n + "_source_bytes").c_str(), static_cast<double>(s.tokens) * kRow)
        .kv((n + "_output_bytes").c_str(), static_cast<double>(s.tokens) * kRow);
  }
  // A plain-store call of half the library's non-temporal threshold (call_state.hpp): the regime
  // of small calls, whose rows stay in cache (rates.hpp). Its plain row copies set the rate.
  const int64_t cache_tokens =
      std::max<int64_t>(1, static_cast<int64_t>(2.0 * (1 << 20) / kRow / 8));
  const ShapeRates cache = measure_shape(o, Shape{"cache", cache_tokens, 8, true}, 31);
  j.kv("cache_copy_GBps", cache.copy).kv("cache_bytes", cache.bytes).kv("l2_bytes", l2_bytes());
  std::vector<double> hand;
  for (int p = 0; p < 7; ++p) hand.push_back(handoff_ns(100000));
  j.kv("handoff_ns", median(hand))
      .kv("row_bytes", static_cast<double>(kRow))
      .kv("cores", static_cast<int>(std::max(1u, std::thread::hardware_concurrency())))
      .end_object();
  j.write(o.out);
  std::printf("per core, both cores working at once (GB/s):\n%-8s %10s %10s %10s %10s %14s\n",
              "shape", "MB/rank", "copy", "stream", "reduce", "staged_reduce");
  for (const Shape& s : shapes) {
    const ShapeRates& r = got[s.name];
    std::printf("%-8s %10.1f %10.2f %10.2f %10.2f %14.2f\n", s.name, r.bytes / 1e6, r.copy,
                r.stream, r.reduce, r.staged_reduce);
  }
  std::printf("plain copies of a %.1f MB call (cache-resident): %.2f GB/s; L2 %.1f MiB\n",
              cache.bytes / 1e6, cache.copy, l2_bytes() / (1 << 20));
  std::printf("cross-core handoff (one way): %.1f ns\nwrote %s\n", median(hand), o.out.c_str());
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
  // Fields may sit between op and median_us (the row's dtype does).
  const std::regex re(
      "\"impl\":\\s*\"([a-z0-9_]+)\",\\s*\"op\":\\s*\"([a-z]+)\"[^}]*?\"median_us\":\\s*([-+0-"
      "9.eE]+)"
      "[^}]*?(\"sync\":\\s*\"([a-z-]+)\")?");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
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
