#include "sim/options.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "ubep/error.hpp"

namespace ubep::sim {

void print_help() {
  std::puts(R"(usage: ubep-sim COMMAND [options]
Discrete-event simulator of ubep's dispatch/combine on superpods, driving the library's own
topology model and hop-aware scheduler (ubep::sched). Times are per call, in microseconds.

Commands (each prints a table; --json FILE also writes it as JSON for sim/plot.py):
  call        simulate one call with the options below
  latency     dispatch latency vs batch size, BSP vs UBEP          (default: EP 64,128,256; BS 8..256)
  sync        sync ablation: stop-and-wait vs fused vs sentinel   (default: EP 64; BS 8..256)
  sched       scheduling ablation: naive / column_major / balanced (64 ranks, 8 hot experts, BS 128)
  sched-sweep the ablation over hot 0/8/32 x weight 2/4/8 (default EP 64,256; BS 128)
  tpot        decode TPOT P50/P99 of a DeepSeek-V3-like model, BSP vs UBEP (default EP 64, BS 64)
  calibrate   measure this machine (memcpy GB/s, cross-core handoff) -> --out FILE; with
              --measured FILES (ubep-bench runs of the calibrated shapes only), copy
              --calibration FILE with those shapes' rates taken from the runs instead
  predict     predict ubep-bench decode/prefill medians (local preset, 2 ranks); with
              --measured FILE (ubep-bench --json output) print the error
  validate    local preset vs ubep-bench runs (--measured FILES), one row per (case, algo, op):
              measured, predicted, and whether the shape was one `calibrate` timed
  sensitivity each [ASSUME] parameter of cm384 over its plausible range: how each paper
              comparison moves
  bench       time the simulator itself on one call (default 256 ranks x 128 tokens x top-8)
  params      print the preset's topology, every cost parameter and its source

Machine:
  --preset P          cm384 (<= 768 ranks) | ubmesh8k (<= 8192) | nvl72 (<= 72 ranks) | h800 |
                      local | FILE.json, your own pod (docs/sim/TOPOLOGY.md) (default cm384)
  --calibration FILE  calibration file of the local preset (default sim-calibration.json)
  --workers N         workers per rank (default: the preset's)
Workload:
  --ranks LIST        comma list of EP sizes (call/bench: the first)
  --batch LIST        comma list of tokens per rank
  --hidden N          hidden size (default 7168)    --elem-bytes N  bytes per element (default 2, bf16)
  --topk K            experts per token (default 8) --experts E     total experts (default 256)
  --hot N             hot experts (default 0 = uniform; sched: 8)
  --hot-weight X      a hot expert is X times as likely as a cold one (default 4)
  --points LIST       sched-sweep: only these hot:weight points, e.g. 0:1,8:2 (default: all)
  --seed N            routing seed (default 1)
  --layout L          latency (one unit per destination expert, default) | throughput
Call:
  --op O              dispatch (default) | combine
  --algo A            bsp | ubep (call only; experiments run both)
  --sync S            fused (default) | stop-and-wait | sentinel | sentinel-deferred (ubep)
  --bsp-policy P      scheduler policy of the BSP baseline (default naive)
  --ubep-policy P     scheduler policy of UBEP (default column_major)
  --receivers on|off  the scheduler sees every rank's receive totals (default on; off: the
                      sender-only cost model before issue 30)
  --sharing on|off    the scheduler models ports as work-conserving, each worker at most its
                      engine's rate (default on; off: its fixed 1/W link shares)
  --min-piece-bytes N the scheduler cuts no unit into pieces under N bytes (default 65536;
                      0: a row may be its own piece, one flow per row)
TPOT:
  --steps N           decode steps (default 100)
  --moe-layers N      MoE layers (default 58)       --dense-layers N  dense layers (default 3)
Other:
  --repeats N         bench: timed repetitions (default 3)
  --resolve-ns N      recompute the max-min link rates at most once per N ns (default 0: at
                      every flow start and finish, exact; N > 0 trades bounded error for speed
                      on large pods, docs/sim/MODEL.md)
  --measured FILE     predict, validate: ubep-bench --json file(s), comma list
  --rounds FILES      calibrate: combine calibrate files of several rounds into --out (each
                      figure from its least disturbed round) and --out's _round<N>.json
                      (round N's own small-call figures)
  --round-calibrations FILES
                      validate: one calibration per round (comma list, round 1 first); a
                      measured file named *_r<N>.json is predicted with the N-th, so a row's
                      least disturbed run is judged against the calibration of its own round
  --out FILE          calibrate: output file (default sim-calibration.json)
  --json FILE         write results as JSON
  --quiet             no progress lines on stderr
  -h, --help          this text)");
}

namespace {

long to_long(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  UBEP_CHECK_ARG(!v.empty() && end && *end == '\0', "flag ", flag, ": '", v, "' is not an integer");
  return x;
}
double to_double(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  UBEP_CHECK_ARG(!v.empty() && end && *end == '\0', "flag ", flag, ": '", v, "' is not a number");
  return x;
}
std::vector<int> to_list(const std::string& flag, const std::string& v) {
  std::vector<int> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const long x = to_long(flag, item);
    UBEP_CHECK_ARG(x >= 1, "flag ", flag, ": values must be >= 1, got ", x);
    out.push_back(static_cast<int>(x));
  }
  UBEP_CHECK_ARG(!out.empty(), "flag ", flag, " needs a comma list of integers");
  return out;
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  int i = 1;
  if (argc > 1 && argv[1][0] != '-') o.command = argv[i++];
  for (; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      print_help();
      std::exit(0);
    }
    if (f == "--quiet") {
      o.quiet = true;
      continue;
    }
    UBEP_CHECK_ARG(i + 1 < argc, "flag ", f, " needs a value (see --help)");
    const std::string v = argv[++i];
    auto pos_int = [&](int lo) {
      const long x = to_long(f, v);
      UBEP_CHECK_ARG(x >= lo, "flag ", f, " must be >= ", lo, ", got ", x);
      return static_cast<int>(x);
    };
    if (f == "--preset")
      o.preset = v;
    else if (f == "--calibration")
      o.calibration = v;
    else if (f == "--workers")
      o.workers = pos_int(1);
    else if (f == "--ranks")
      o.ranks = to_list(f, v);
    else if (f == "--batch")
      o.batch = to_list(f, v);
    else if (f == "--hidden")
      o.hidden = pos_int(1);
    else if (f == "--elem-bytes")
      o.elem_bytes = pos_int(1);
    else if (f == "--topk")
      o.topk = pos_int(1);
    else if (f == "--experts")
      o.experts = pos_int(1);
    else if (f == "--hot")
      o.hot = pos_int(0);
    else if (f == "--hot-weight")
      o.hot_weight = to_double(f, v);
    else if (f == "--points")
      o.points = v;
    else if (f == "--receivers") {
      UBEP_CHECK_ARG(v == "on" || v == "off", "flag --receivers must be on or off, got '", v, "'");
      o.plan_receivers = v == "on";
    } else if (f == "--sharing") {
      UBEP_CHECK_ARG(v == "on" || v == "off", "flag --sharing must be on or off, got '", v, "'");
      o.plan_sharing = v == "on";
    } else if (f == "--seed")
      o.seed = static_cast<uint64_t>(pos_int(0));
    else if (f == "--layout") {
      UBEP_CHECK_ARG(v == "latency" || v == "throughput", "flag --layout: '", v,
                     "' (latency | throughput)");
      o.latency_layout = v == "latency";
    } else if (f == "--op") {
      UBEP_CHECK_ARG(v == "dispatch" || v == "combine", "flag --op: '", v,
                     "' (dispatch | combine)");
      o.op = v == "dispatch" ? Op::kDispatch : Op::kCombine;
    } else if (f == "--algo")
      o.algo = parse_algo(v);
    else if (f == "--sync")
      o.sync = parse_sync(v);
    else if (f == "--bsp-policy")
      o.bsp_policy = sched::parse_policy(v);
    else if (f == "--ubep-policy")
      o.ubep_policy = sched::parse_policy(v);
    else if (f == "--steps")
      o.steps = pos_int(1);
    else if (f == "--moe-layers")
      o.moe_layers = pos_int(0);
    else if (f == "--dense-layers")
      o.dense_layers = pos_int(0);
    else if (f == "--repeats")
      o.repeats = pos_int(1);
    else if (f == "--resolve-ns")
      o.resolve_ns = pos_int(0);
    else if (f == "--min-piece-bytes")
      o.min_piece_bytes = pos_int(0);

    else if (f == "--json")
      o.json = v;
    else if (f == "--measured")
      o.measured = v;
    else if (f == "--round-calibrations")
      o.round_calibrations = v;
    else if (f == "--rounds")
      o.rounds = v;
    else if (f == "--out")
      o.out = v;
    else
      throw InvalidArgument(detail::concat("unknown flag '", f, "' (see --help)"));
  }
  UBEP_CHECK_ARG(o.hot_weight > 0, "flag --hot-weight must be > 0, got ", o.hot_weight);
  return o;
}

std::vector<std::string> comma_list(const std::string& list) {
  std::vector<std::string> items;
  std::stringstream ss(list);
  for (std::string f; std::getline(ss, f, ',');)
    if (!f.empty()) items.push_back(f);
  return items;
}

std::vector<std::string> measured_files(const Options& o) { return comma_list(o.measured); }

}  // namespace ubep::sim
