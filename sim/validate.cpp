// `validate`: the local preset against ubep-bench runs of shapes the calibration never timed.
// `sensitivity`: how much each paper comparison moves when one [ASSUME] parameter of the cm384
// preset moves over its plausible range.
//
// `calibrate` times the library's kernels on two shapes only (decode: 2 ranks x 128 tokens,
// top-8, latency layout; prefill: 2 ranks x 4096 tokens, throughput; hidden 7168 bf16). Cases of
// exactly those shapes are marked used_for_calibration; every other case (other token counts,
// hidden sizes, top-k, rank counts) is a prediction of something never timed, and the summary
// counts those separately. Nothing here changes a parameter to fit a measurement.
//
// --round-calibrations (sim/validate.sh): one calibration per round, each with the small call's
// rates of that round's own run of it (calibrate_rounds.hpp). The small calls of this
// machine run in one of two states that last minutes (EXPERIMENTS.md section 6.6: a fast combine
// with a slow streamed dispatch, or the reverse), so a round's 32-token run is judged against the
// 2 MiB call of the same minutes, not against the best of each field over all rounds (which
// paired a combine of one state with a dispatch of the other). The row's measured value is still
// its least disturbed run; that run's round picks the calibration. No unseen measurement enters
// any calibration (calibrate_bench.hpp refuses them), so the prediction of a round is the same
// whatever the unseen shape measured in it.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>

#include "sim/calibrate_bench.hpp"
#include "sim/experiments.hpp"
#include "sim/json.hpp"
#include "sim/json_read.hpp"
#include "sim/rates.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

int round_of_file(const std::string& path) {
  if (!path.ends_with(".json")) return 0;
  size_t end = path.size() - 5, begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(path[begin - 1]))) --begin;
  if (begin == end || begin < 2 || path.compare(begin - 2, 2, "_r") || end - begin > 6) return 0;
  return std::stoi(path.substr(begin, end - begin));
}

namespace {

struct BenchCase {
  std::string file, group, layout, dtype;
  int round = 0;  // sim/validate.sh's round, from the file name (0: none)
  int ranks = 0, topk = 0, experts = 0, hidden = 0;
  int64_t tokens = 0;
  std::map<std::pair<std::string, std::string>, double> median;  // (impl, op) -> µs
};

BenchCase read_case(const std::string& path) {
  const BenchJson b = read_bench_json(path);
  BenchCase c;
  c.file = path;
  c.round = round_of_file(path);
  c.group = b.config_str("group");
  c.layout = b.config_str("layout");
  c.dtype = b.config_str("dtype");
  c.ranks = static_cast<int>(b.config_num("ranks"));
  c.tokens = static_cast<int64_t>(b.config_num("tokens"));
  c.hidden = static_cast<int>(b.config_num("hidden"));
  c.topk = static_cast<int>(b.config_num("topk"));
  c.experts = static_cast<int>(b.config_num("experts"));
  c.median = b.medians();
  UBEP_CHECK_ARG(!c.median.empty(), "validate: no result rows found in ", path,
                 " (not ubep-bench --json output, or its row format changed)");
  return c;
}

// The two shapes `calibrate` times (calibrate_bench.hpp).
bool calibrated_shape(const BenchCase& c) {
  return !calibrated_shape_name(c.ranks, c.tokens, c.hidden, c.topk, c.experts, c.dtype, c.layout)
              .empty();
}

std::string case_name(const BenchCase& c) {
  return detail::concat(c.group, " ", c.ranks, "r ", c.tokens, "t h", c.hidden, " top", c.topk, " ",
                        c.layout);
}

}  // namespace

int cmd_validate(const Options& o) {
  UBEP_CHECK_ARG(!o.measured.empty(),
                 "validate needs --measured FILE[,FILE...] (ubep-bench --json)");
  // Files of the same shape are repeats (sim/validate.sh runs each case in several rounds, since
  // this machine is shared with other people's compile jobs). The model describes the machine
  // undisturbed, so the measured value is the least disturbed run: the smallest of the runs'
  // medians (the median over runs is kept too, and the spread is printed).
  std::vector<std::vector<BenchCase>> cases;
  for (const std::string& f : measured_files(o)) {
    BenchCase c = read_case(f);
    auto it = std::find_if(cases.begin(), cases.end(),
                           [&](const auto& v) { return case_name(v[0]) == case_name(c); });
    if (it == cases.end())
      cases.push_back({std::move(c)});
    else
      it->push_back(std::move(c));
  }
  Json j;
  j.begin_object().kv("experiment", "validate").key("rows").begin_array();
  std::printf("%-40s %-5s %-9s %6s %12s %17s %12s %8s  %s\n", "case", "algo", "op", "calib",
              "min_of_runs_us", "(..max, runs)", "predicted_us", "error", "rate set, core share");
  int unseen = 0, unseen_ok = 0, seen = 0, seen_ok = 0, unseen_ok_median = 0;
  double worst_unseen = 0;
  const std::vector<std::string> round_cals = comma_list(o.round_calibrations);
  for (const auto& runs : cases)
    for (const BenchCase& r : runs)
      UBEP_CHECK_ARG(round_cals.empty() || (r.round >= 1 && r.round <= int(round_cals.size())),
                     "validate --round-calibrations: '", r.file, "' is ",
                     r.round ? detail::concat("round ", r.round) : std::string("of no round"),
                     " (a name ending in _r<N>.json, N from 1 to ", round_cals.size(), ")");
  for (const auto& runs : cases) {
    const BenchCase& c = runs[0];
    // The preset of each run: its round's calibration, or the one --calibration.
    std::vector<Preset> presets;
    for (const BenchCase& r : runs)
      presets.push_back(make_preset(
          "local", c.ranks,
          round_cals.empty() ? o.calibration : round_cals[static_cast<size_t>(r.round - 1)]));
    Options oc = o;
    oc.latency_layout = c.layout == "latency";
    oc.hidden = c.hidden;
    oc.elem_bytes = c.dtype == "fp32" ? 4 : 2;
    oc.hot = 0;
    const Traffic t = draw_traffic(c.ranks, c.experts, c.topk, c.tokens, 0, 1.0, o.seed);
    const bool calib = calibrated_shape(c);
    for (Algo a : {Algo::kBsp, Algo::kUbep}) {
      for (Op op : {Op::kDispatch, Op::kCombine}) {
        std::vector<double> meds;
        size_t least = runs.size();  // the least disturbed run
        for (size_t i = 0; i < runs.size(); ++i) {
          auto it = runs[i].median.find({algo_name(a), op_name(op)});
          if (it == runs[i].median.end()) continue;
          if (meds.empty() || it->second < meds.front()) least = i;
          meds.push_back(it->second);
          std::sort(meds.begin(), meds.end());
        }
        if (meds.empty()) continue;
        const Preset& p = presets[least];
        const double measured = meds.front();
        const double median_of_runs = meds.size() % 2
                                          ? meds[meds.size() / 2]
                                          : (meds[meds.size() / 2 - 1] + meds[meds.size() / 2]) / 2;
        const CallConfig cc = call_config(oc, a, op);
        const Preset eff = effective_preset(p, cc, t);
        double pred = simulate_call(p, cc, t).makespan_ns / 1e3;
        // More ranks than cores: every op of the bench starts on all ranks at once (a group
        // barrier), so each rank gets cores / ranks of a core for the op (the preset's core
        // share, effective_preset); no loop term (the bench's untimed steps are not in the op).
        const double err = (pred / measured - 1) * 100;
        const bool ok = std::abs(err) <= 25;
        (calib ? seen : unseen) += 1;
        (calib ? seen_ok : unseen_ok) += ok;
        // The same against the median of the runs (a stricter reading under load).
        const double err_median = (pred / median_of_runs - 1) * 100;
        if (!calib) unseen_ok_median += std::abs(err_median) <= 25;
        if (!calib) worst_unseen = std::max(worst_unseen, std::abs(err));
        const std::string spread =
            detail::concat("(..", static_cast<int>(meds.back()), ", ", meds.size(), ")");
        const std::string round =
            round_cals.empty() ? "" : detail::concat(", r", runs[least].round);
        std::printf("%-40s %-5s %-9s %6s %12.1f %17s %12.1f %+7.1f%%  %s, %.2f%s\n",
                    case_name(c).c_str(), algo_name(a), op_name(op), calib ? "yes" : "no", measured,
                    spread.c_str(), pred, err, eff.cost.rate_set.c_str(), eff.cost.core_share,
                    round.c_str());
        j.begin_object()
            .kv("case", case_name(c))
            .kv("group", c.group)
            .kv("ranks", c.ranks)
            .kv("tokens", static_cast<double>(c.tokens))
            .kv("hidden", c.hidden)
            .kv("topk", c.topk)
            .kv("experts", c.experts)
            .kv("layout", c.layout)
            .kv("algo", algo_name(a))
            .kv("op", op_name(op))
            .kv("measured_us", measured)
            .kv("runs", static_cast<int>(meds.size()))
            .kv("measured_median_of_runs_us", median_of_runs)
            .kv("measured_max_us", meds.back())
            .kv("round", runs[least].round)
            .kv("calibration_of_its_round", !round_cals.empty())
            .kv("predicted_us", pred)
            .kv("error_pct", err)
            .kv("error_vs_median_of_runs_pct", err_median)
            .kv("used_for_calibration", calib)
            .kv("rate_set", eff.cost.rate_set)
            .kv("core_share", eff.cost.core_share)
            .end_object();
      }
    }
  }
  j.end_array()
      .kv("unseen_cases", unseen)
      .kv("unseen_within_25pct", unseen_ok)
      .kv("unseen_within_25pct_of_median_of_runs", unseen_ok_median)
      .kv("calibrated_cases", seen)
      .kv("calibrated_within_25pct", seen_ok)
      .end_object();
  std::printf(
      "unseen shapes: %d of %d within 25%% (%.0f%%; largest error %.1f%%); calibrated shapes: %d "
      "of %d\nagainst the median of the runs instead: unseen %d of %d within 25%%\n",
      unseen_ok, unseen, unseen ? 100.0 * unseen_ok / unseen : 0.0, worst_unseen, seen_ok, seen,
      unseen_ok_median, unseen);
  if (!o.json.empty()) j.write(o.json);
  return 0;
}

}  // namespace ubep::sim
