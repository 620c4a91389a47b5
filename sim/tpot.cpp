// Decode TPOT of a DeepSeek-V3-like model (61 layers: 3 dense + 58 MoE, hidden 7168, 256
// experts, top-8), BSP vs UBEP, over many steps with fresh random routing every layer.
//
// Each rank keeps its own clock. A MoE layer on rank r: attention (attention_us x noise), then
// dispatch starting at r's clock (the simulator takes per-rank start times, so a late rank
// delays exactly the peers that wait for its data, and bsp's barriers make everyone wait),
// then its experts (local experts' weight loads + per-row GEMM, x noise), then combine. A step
// begins with all ranks aligned (sampling is a global step) and its TPOT is the last rank's
// finish. Noise is Gaussian around 1 with sigma compute_jitter, clamped at 0.5x.
#include <algorithm>
#include <cstdio>
#include <random>

#include "sim/experiments.hpp"
#include "sim/json.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

namespace {

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

int cmd_tpot(const Options& o) {
  const int R = o.ranks.empty() ? 64 : o.ranks[0];
  const int B = o.batch.empty() ? 64 : o.batch[0];
  const Preset p = make_preset(o.preset, R, o.calibration);
  const auto& c = p.cost;
  const int El = o.experts / R;
  UBEP_CHECK_ARG(o.experts % R == 0, "experts (", o.experts, ") must divide over ", R, " ranks");
  // A deferred reset runs inside the expert compute, which this model does not charge for it.
  UBEP_CHECK_ARG(o.sync != Sync::kSentinelDeferred,
                 "tpot: --sync sentinel-deferred would leave the reset uncharged; use sentinel");
  std::printf(
      "# preset %s, EP%d, batch %d per rank, %d dense + %d MoE layers, %d steps, jitter %.0f%%\n",
      o.preset.c_str(), R, B, o.dense_layers, o.moe_layers, o.steps, c.compute_jitter * 100);
  Json j;
  j.begin_object()
      .kv("experiment", "tpot")
      .kv("preset", o.preset)
      .kv("ranks", R)
      .kv("batch", B)
      .kv("steps", o.steps)
      .kv("moe_layers", o.moe_layers)
      .kv("dense_layers", o.dense_layers)
      .key("algos")
      .begin_array();
  std::printf("%-5s %10s %10s %10s %12s %12s\n", "algo", "p50_ms", "p99_ms", "mean_ms",
              "comm_ms/step", "moe_layers");
  // comm_ms/step: sum of call makespans (first start to last finish of each call) per step.
  double p99[2] = {0, 0};
  int ai = 0;
  for (Algo algo : {Algo::kBsp, Algo::kUbep}) {
    // Same noise and routing for both algorithms: a paired comparison.
    std::mt19937_64 rng(o.seed * 7919 + 17);
    std::normal_distribution<double> noise(1.0, c.compute_jitter);
    auto jitter = [&] { return std::max(0.5, noise(rng)); };
    std::vector<double> tpot, comm;
    for (int step = 0; step < o.steps; ++step) {
      if (step % 10 == 0)
        progress(o, step + 1, o.steps, detail::concat(algo_name(algo), " step ", step + 1));
      std::vector<double> clock(static_cast<size_t>(R), 0.0);
      double comm_ns = 0;
      for (int layer = 0; layer < o.dense_layers + o.moe_layers; ++layer) {
        for (auto& t : clock) t += c.attention_us * 1e3 * jitter();
        if (layer < o.dense_layers) continue;
        const uint64_t seed =
            o.seed + 1000003ull * static_cast<uint64_t>(step) + static_cast<uint64_t>(layer);
        const Traffic t = draw_traffic(R, o.experts, o.topk, B, o.hot, o.hot_weight, seed);
        const double before = *std::max_element(clock.begin(), clock.end());
        const CallResult d = simulate_call(p, call_config(o, algo, Op::kDispatch), t, clock);
        for (int r = 0; r < R; ++r)
          clock[static_cast<size_t>(r)] =
              d.finish_ns[static_cast<size_t>(r)] +
              (El * c.expert_weight_us * 1e3 +
               d.recv_rows[static_cast<size_t>(r)] * c.expert_ns_per_row) *
                  jitter();
        const CallResult cb = simulate_call(p, call_config(o, algo, Op::kCombine), t, clock);
        clock = cb.finish_ns;
        comm_ns += d.makespan_ns + cb.makespan_ns;
        (void)before;
      }
      tpot.push_back(*std::max_element(clock.begin(), clock.end()) / 1e6);
      comm.push_back(comm_ns / 1e6);
    }
    double mean = 0, cm = 0;
    for (double x : tpot) mean += x / static_cast<double>(tpot.size());
    for (double x : comm) cm += x / static_cast<double>(comm.size());
    p99[ai++] = pct(tpot, 0.99);
    std::printf("%-5s %10.3f %10.3f %10.3f %12.3f %12d\n", algo_name(algo), pct(tpot, 0.5),
                pct(tpot, 0.99), mean, cm, o.moe_layers);
    std::fflush(stdout);
    j.begin_object()
        .kv("algo", algo_name(algo))
        .kv("p50_ms", pct(tpot, 0.5))
        .kv("p99_ms", pct(tpot, 0.99))
        .kv("mean_ms", mean)
        .kv("comm_ms_per_step", cm)
        .key("tpot_ms")
        .begin_array();
    for (double x : tpot) j.value(x);
    j.end_array().end_object();
  }
  std::printf("P99 TPOT change ubep vs bsp: %.1f%%\n", (p99[1] / p99[0] - 1) * 100);
  j.end_array().kv("p99_change_pct", (p99[1] / p99[0] - 1) * 100).end_object();
  if (!o.json.empty()) j.write(o.json);
  return 0;
}

}  // namespace ubep::sim
