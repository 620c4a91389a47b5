// `sensitivity`: every [ASSUME] cost parameter of the cm384 preset (sim/params.cpp), moved alone
// to the low and the high end of its plausible range, and what that does to each comparison with
// the paper. A comparison that moves a lot under one assumption is only as good as it; one that
// does not move is a property of the model's structure, not of the guess.
#include <cstdio>
#include <functional>

#include "sim/experiments.hpp"
#include "sim/json.hpp"

namespace ubep::sim {

namespace {

struct Knob {
  const char* name;
  double low, base, high;
  const char* why;  // why this range is plausible
  std::function<void(CostParams&, double)> set;
};

std::vector<Knob> knobs() {
  return {
      {"issue_ns", 10, 50, 200, "a few scalar instructions .. an uncached descriptor write",
       [](CostParams& c, double v) { c.issue_ns = v; }},
      {"local_row_ns", 0, 20, 100, "loop only .. a TLB miss per row",
       [](CostParams& c, double v) { c.local_row_ns = v; }},
      {"fence_ns", 20, 100, 500, "an x86 mfence .. a system-scope GPU fence",
       [](CostParams& c, double v) { c.fence_ns = v; }},
      {"barrier_round_extra_ns", 0, 0, 5000, "none .. a few µs of runtime (event/notify) per barrier",
       [](CostParams& c, double v) { c.barrier_round_extra_ns = v; }},
      {"layout_ns_per_entry", 0.5, 2, 10, "vectorised .. one cache miss per (token, k)",
       [](CostParams& c, double v) { c.layout_ns_per_entry = v; }},
      {"prefix_ns_per_entry", 0.5, 1, 5, "one add .. one remote read per count",
       [](CostParams& c, double v) { c.prefix_ns_per_entry = v; }},
      {"ubep_reorder_workers", 4, 12, 24, "1/12 .. 1/2 of the 48 AIV cores",
       [](CostParams& c, double v) { c.ubep_reorder_workers = static_cast<int>(v); }},
  };
}

// The paper comparisons the simulator makes, for one cost setting: EP64 dispatch change of
// UBEP vs BSP at BS 8 / 64 / 256 (paper -34.7% .. -52.4%), fused vs stop-and-wait at BS 8 / 256
// (paper -31% .. -57%), and the scheduling ablation's slowest sender, naive vs balanced (paper
// 62.2 -> 43.5 µs: -30%).
std::vector<double> comparisons(const Options& o, const CostParams& cost) {
  Preset p = make_preset("cm384", 64, "");
  p.cost = cost;
  std::vector<double> out;
  std::vector<double> ubep_us;
  for (int B : {8, 64, 256}) {
    const Traffic t = draw_traffic(64, o.experts, o.topk, B, 0, 1.0, o.seed);
    const double bsp = simulate_call(p, call_config(o, Algo::kBsp, Op::kDispatch), t).makespan_ns;
    const double ub = simulate_call(p, call_config(o, Algo::kUbep, Op::kDispatch), t).makespan_ns;
    out.push_back((ub / bsp - 1) * 100);
    ubep_us.push_back(ub);
  }
  for (int i : {0, 2}) {
    const int B = i == 0 ? 8 : 256;
    const Traffic t = draw_traffic(64, o.experts, o.topk, B, 0, 1.0, o.seed);
    Options os = o;
    os.sync = Sync::kStopAndWait;
    const double sw = simulate_call(p, call_config(os, Algo::kUbep, Op::kDispatch), t).makespan_ns;
    out.push_back((ubep_us[static_cast<size_t>(i)] / sw - 1) * 100);
  }
  Preset ps = p;
  ps.cost.ubep_reorder_workers = 0;  // as cmd_sched: every worker sends
  const Traffic hot = draw_traffic(64, o.experts, o.topk, 128, 8, o.hot_weight, o.seed);
  double sender[2];
  int k = 0;
  for (sched::Policy pol : {sched::Policy::kNaive, sched::Policy::kBalanced}) {
    Options op = o;
    op.ubep_policy = pol;
    sender[k++] =
        simulate_call(ps, call_config(op, Algo::kUbep, Op::kDispatch), hot).slowest_sender_ns;
  }
  out.push_back((sender[1] / sender[0] - 1) * 100);
  return out;
}

}  // namespace

int cmd_sensitivity(const Options& o) {
  const char* names[] = {"EP64 BS8 ubep vs bsp", "EP64 BS64", "EP64 BS256",
                         "fused vs s&w BS8", "fused vs s&w BS256", "balanced vs naive sender"};
  const char* paper[] = {"-34.7..-52.4%", "-34.7..-52.4%", "-34.7..-52.4%",
                         "-31..-57%", "-31..-57%", "-30.1%"};
  const CostParams base = make_preset("cm384", 64, "").cost;
  const auto knob_list = knobs();
  Json j;
  j.begin_object().kv("experiment", "sensitivity").kv("preset", "cm384").key("rows").begin_array();
  progress(o, 1, 1 + 2 * static_cast<int>(knob_list.size()), "base");
  const auto b = comparisons(o, base);
  std::printf("# cm384, EP64; change in %% (negative: UBEP / fused / balanced faster)\n");
  std::printf("%-26s %-22s", "parameter", "value (base)");
  for (const char* n : names) std::printf(" %24s", n);
  std::printf("\n%-26s %-22s", "paper", "");
  for (const char* n : paper) std::printf(" %24s", n);
  std::printf("\n%-26s %-22s", "base", "");
  for (double v : b) std::printf(" %23.1f%%", v);
  std::printf("\n");
  int step = 1;
  for (const Knob& k : knob_list) {
    std::vector<double> lo, hi;
    for (double v : {k.low, k.high}) {
      progress(o, ++step, 1 + 2 * static_cast<int>(knob_list.size()),
               detail::concat(k.name, " = ", v));
      CostParams c = base;
      k.set(c, v);
      (v == k.low ? lo : hi) = comparisons(o, c);
    }
    char range[64];
    std::snprintf(range, sizeof range, "%g .. %g (%g)", k.low, k.high, k.base);
    std::printf("%-26s %-22s", k.name, range);
    for (size_t i = 0; i < b.size(); ++i) std::printf(" %11.1f .. %8.1f%%", lo[i], hi[i]);
    std::printf("\n");
    j.begin_object()
        .kv("parameter", k.name)
        .kv("low", k.low)
        .kv("base", k.base)
        .kv("high", k.high)
        .kv("why", k.why);
    j.key("comparisons").begin_array();
    for (size_t i = 0; i < b.size(); ++i)
      j.begin_object()
          .kv("name", names[i])
          .kv("paper", paper[i])
          .kv("base_pct", b[i])
          .kv("at_low_pct", lo[i])
          .kv("at_high_pct", hi[i])
          .end_object();
    j.end_array().end_object();
  }
  j.end_array().end_object();
  for (const Knob& k : knob_list) std::printf("  %-24s range: %s\n", k.name, k.why);
  if (!o.json.empty()) j.write(o.json);
  return 0;
}

}  // namespace ubep::sim
