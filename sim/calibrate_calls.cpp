// calibrate_calls.hpp: the library's calls timed on thread ranks, the reuse capacity of the
// shared cache, and the scheduler's makespan for more threads than cores.
#include "sim/calibrate_calls.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/row_kernels.hpp"
#include "bench/workload.hpp"
#include "sim/rates.hpp"
#include "ubep/bf16.hpp"
#include "ubep/buffer.hpp"
#include "ubep/group.hpp"

namespace ubep::sim {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kHidden = 7168, kExperts = 256;
constexpr size_t kRow = kHidden * 2;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Slowest rank per iteration (the call's time), then the median over iterations.
double call_us(Group& g, const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * static_cast<size_t>(g.size()));
  g.allgather(mine.data(), all.data(), mine.size() * sizeof(double));
  std::vector<double> slow(mine.size(), 0.0);
  for (int r = 0; r < g.size(); ++r)
    for (size_t i = 0; i < mine.size(); ++i)
      slow[i] = std::max(slow[i], all[static_cast<size_t>(r) * mine.size() + i]);
  return median(slow);
}

// Pins the calling thread to one core (best effort).
void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort
}

}  // namespace

CallTimes time_library_calls(const CallShape& s) {
  CallTimes out;
  run_on_threads(2, [&](Group& g) {
    // Rank r on core r, as mpirun binds ubep-bench's two process ranks (its default for 2
    // processes: one core each; `mpirun --report-bindings`). Unpinned, the two ranks may share
    // a core while the other runs other people's (niced) jobs, and the calls then take up to
    // twice the bench's time: 2026-12-03, decode ubep dispatch 2869-3825 us in calibrate against
    // 1718-1944 in ubep-bench in the same minutes (EXPERIMENTS.md section 6.5).
    pin(g.rank());
    // Inputs like ubep-bench's: bf16 values in [-1, 1) (constant bytes would be subnormal and
    // slow the reduction), distinct uniform experts per token.
    std::mt19937 rng(977u + static_cast<unsigned>(g.rank()));
    std::uniform_real_distribution<float> v(-1.0f, 1.0f);
    std::vector<uint16_t> x(static_cast<size_t>(s.tokens * kHidden));
    for (auto& b : x) b = float_to_bf16(v(rng));
    std::vector<int64_t> idx;
    std::vector<float> w;
    std::uniform_real_distribution<float> wd(0.05f, 1.0f);
    for (int64_t t = 0; t < s.tokens; ++t) {
      std::vector<int64_t> chosen;
      while (static_cast<int>(chosen.size()) < s.topk) {
        const auto e = static_cast<int64_t>(rng() % kExperts);
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      for (int64_t e : chosen) {
        idx.push_back(e);
        w.push_back(wd(rng));
      }
    }
    DispatchArgs args;
    args.x = TensorView(x.data(), DType::kBF16, {s.tokens, kHidden});
    args.topk_idx = TensorView(idx.data(), DType::kInt64, {s.tokens, s.topk});
    args.topk_weights = TensorView(w.data(), DType::kFP32, {s.tokens, s.topk});
    args.layout = s.latency ? Layout::kLatency : Layout::kThroughput;
    BufferConfig cfg;
    cfg.max_tokens_per_rank = s.tokens;
    cfg.hidden = kHidden;
    cfg.num_experts = static_cast<int>(kExperts);
    cfg.max_topk = s.topk;
    cfg.enable_latency_layout = s.latency;
    for (Algorithm a : {Algorithm::kBsp, Algorithm::kUbep}) {
      cfg.algorithm = a;
      Buffer buf(g, cfg);
      std::vector<double> td, tc, tsend;
      double rows = 0;
      for (int i = 0; i < s.warmup + s.iters; ++i) {
        g.barrier();
        auto t0 = Clock::now();
        const DispatchResult r = buf.dispatch(args);
        const double d = us_since(t0);
        g.barrier();
        if (r.layout == Layout::kThroughput) {
          rows = static_cast<double>(r.num_recv_rows);
        } else {
          rows = 0;
          for (int64_t e = 0; e < r.recv_count.dim(0); ++e)
            rows += static_cast<double>(r.recv_count.as<int64_t>()[e]);
        }
        const CombineArgs ca = tools::expert_identity(r, &buf, kRow);  // ubep-bench's expert
        g.barrier();
        t0 = Clock::now();
        buf.combine(ca);
        const double c = us_since(t0);
        g.barrier();
        double send = 0;
        for (const auto& [name, us] : buf.last_stats().stage_us)
          if (std::strcmp(name, "row send") == 0) send = us;
        if (i >= s.warmup) {
          td.push_back(d);
          tc.push_back(c);
          tsend.push_back(send);
        }
      }
      const double dus = call_us(g, td), cus = call_us(g, tc), sus = call_us(g, tsend);
      double both[2] = {rows, 0};
      std::vector<double> all_rows(static_cast<size_t>(g.size()) * 2);
      g.allgather(both, all_rows.data(), sizeof both);
      if (g.rank() != 0) continue;
      out.dispatch_rows = (all_rows[0] + all_rows[2]) / 2;
      if (a == Algorithm::kBsp) {
        out.bsp_dispatch_us = dus;
        out.bsp_combine_us = cus;
        out.bsp_combine_send_us = sus;
      } else {
        out.ubep_dispatch_us = dus;
        out.ubep_combine_us = cus;
      }
    }
  });
  return out;
}

namespace {

// Per-core GB/s of re-reading `bytes` just written, every core at once: each pass copies a
// source into the buffer (plain stores, as the expert writes the combine rows), then times the
// library's reduction over it in groups of 8 rows into one output row (the combine's reads).
double reread_GBps(size_t bytes, int passes) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t rows = std::max<size_t>(8, bytes / kRow / 8 * 8);
  std::vector<double> rate(static_cast<size_t>(cores), 0);
  std::vector<std::vector<char>> bufs(static_cast<size_t>(cores));
  std::atomic<int> arrived{0};
  auto sync = [&](int round) {  // every core at the same point before going on
    arrived.fetch_add(1);
    while (arrived.load() < cores * round) std::this_thread::yield();
  };
  auto body = [&](int me) {
    pin(me);
    std::vector<char> src(rows * kRow + 64, 0), acc(kRow + 64, 0);
    std::vector<char>& buf = bufs[static_cast<size_t>(me)];
    buf.assign(rows * kRow + 64, 0);
    for (size_t i = 0; i < src.size(); i += 2) src[i + 1] = 0x3c;  // bf16 ~1.0, not subnormal
    std::vector<double> t;
    int round = 0;
    for (int p = 0; p < passes; ++p) {
      sync(++round);
      std::memcpy(buf.data(), src.data(), rows * kRow);
      sync(++round);  // all cores written, then all read together
      const void* ptrs[8];
      const auto t0 = Clock::now();
      // Half the rows from the next core's buffer, as an owner reads its peers' rows in place.
      for (size_t r = 0; r < rows; r += 8) {
        for (int j = 0; j < 8; ++j)
          ptrs[j] = bufs[static_cast<size_t>((me + j) % cores)].data() +
                    (r + static_cast<size_t>(j)) * kRow;
        kernels::reduce_rows(acc.data(), DType::kBF16, kHidden, ptrs, nullptr, 8);
      }
      t.push_back(us_since(t0));
    }
    rate[static_cast<size_t>(me)] = static_cast<double>(rows * kRow) / median(t) / 1e3;
  };
  // Fresh threads for every core: pinning the caller would pin every thread it starts later.
  std::vector<std::thread> th;
  for (int c = 0; c < cores; ++c) th.emplace_back(body, c);
  for (auto& x : th) x.join();
  double sum = 0;
  for (double r : rate) sum += r;
  return sum / cores;
}

}  // namespace

double reuse_capacity_bytes(std::vector<std::pair<double, double>>* curve) {
  // Sizes per core from 1 to 64 MiB; the in-cache rate is read from the small sizes (the
  // shared cache's, once a size passes the private L2), the memory rate the largest size's.
  std::vector<std::pair<double, double>> pts;
  for (double mib : {1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 12.0, 16.0, 64.0}) {
    const size_t b = static_cast<size_t>(mib * (1 << 20));
    pts.emplace_back(static_cast<double>(b), reread_GBps(b, mib <= 8 ? 9 : 5));
  }
  if (curve) *curve = pts;
  return resident_capacity(pts);
}

double oversubscribed_makespan_ratio(int threads, double work_us) {
  // Iterations of a dependent integer loop per µs, alone on a core.
  auto spin = [](uint64_t n) {
    uint64_t x = 1;
    for (uint64_t i = 0; i < n; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x;
  };
  uint64_t n = 1 << 20;
  auto t0 = Clock::now();
  volatile uint64_t sink = spin(n);
  const double per_us = static_cast<double>(n) / us_since(t0);
  n = static_cast<uint64_t>(per_us * work_us);
  double alone = 1e300;  // the least disturbed of a few runs alone
  for (int i = 0; i < 5; ++i) {
    t0 = Clock::now();
    sink = spin(n);
    alone = std::min(alone, us_since(t0));
  }
  // Long-lived threads, released together every round by a yielding barrier, as the bench's
  // thread ranks are between its ops: fresh threads would start on their creator's core and
  // measure the load balancer's first placement instead (4 threads: 3.0x where 2.0x is due).
  constexpr int kWarmup = 5, kRounds = 15;
  std::atomic<int> arrived{0};
  std::vector<double> end(static_cast<size_t>(threads) * (kWarmup + kRounds), 0);
  std::vector<Clock::time_point> begin(kWarmup + kRounds);
  auto barrier = [&](int round) {
    if (arrived.fetch_add(1) + 1 == threads * round)
      begin[static_cast<size_t>(round - 1)] = Clock::now();
    while (arrived.load() < threads * round) std::this_thread::yield();
  };
  std::vector<std::thread> th;
  for (int i = 0; i < threads; ++i)
    th.emplace_back([&, i] {
      for (int k = 0; k < kWarmup + kRounds; ++k) {
        barrier(k + 1);
        sink = spin(n);
        end[static_cast<size_t>(k * threads + i)] =
            std::chrono::duration<double, std::micro>(Clock::now() - begin[static_cast<size_t>(k)])
                .count();
      }
    });
  for (auto& x : th) x.join();
  std::vector<double> ratios;
  for (int k = kWarmup; k < kWarmup + kRounds; ++k) {
    double last = 0;
    for (int i = 0; i < threads; ++i)
      last = std::max(last, end[static_cast<size_t>(k * threads + i)]);
    ratios.push_back(last / alone);
  }
  (void)sink;
  return median(ratios);
}

}  // namespace ubep::sim
