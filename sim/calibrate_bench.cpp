// calibrate_bench.hpp: the calibrated shapes' rates from call times (calibrate's or ubep-bench's).
#include "sim/calibrate_bench.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "sim/json.hpp"
#include "sim/json_read.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

int64_t cache_call_tokens() {
  return std::max<int64_t>(1, static_cast<int64_t>(2.0 * (1 << 20) / (7168 * 2) / 8));
}

std::string calibrated_shape_name(int ranks, int64_t tokens, int hidden, int topk, int experts,
                                  const std::string& dtype, const std::string& layout) {
  const bool common =
      ranks == 2 && hidden == 7168 && topk == 8 && experts == 256 && dtype == "bf16";
  if (common && tokens == 128 && layout == "latency") return "decode";
  if (common && tokens == 4096 && layout == "throughput") return "prefill";
  if (common && tokens == cache_call_tokens() && layout == "latency") return "cache";
  return "";
}

std::vector<std::pair<std::string, double>> shape_rate_fields(const std::string& shape,
                                                              double bytes, double tokens,
                                                              double row_bytes,
                                                              const CallTimes& t) {
  // bsp and ubep place the rows alike (one copy into the final place): the faster of the two is
  // the less disturbed reading of the same placement. Rates in GB/s = bytes per ns.
  const double place_us = std::min(t.bsp_dispatch_us, t.ubep_dispatch_us);
  const std::string k = shape + "_";
  return {{k + "bytes", bytes},
          {k + "copy_GBps", bytes / t.bsp_combine_send_us / 1e3},
          {k + "stream_GBps", bytes / place_us / 1e3},
          {k + "reduce_GBps", bytes / t.ubep_combine_us / 1e3},
          {k + "staged_reduce_GBps",
           bytes / std::max(1.0, t.bsp_combine_us - t.bsp_combine_send_us) / 1e3},
          {k + "source_bytes", tokens * row_bytes},
          {k + "output_bytes", tokens * row_bytes},
          {k + "bsp_dispatch_us", t.bsp_dispatch_us},
          {k + "ubep_dispatch_us", t.ubep_dispatch_us},
          {k + "bsp_combine_us", t.bsp_combine_us},
          {k + "bsp_combine_send_us", t.bsp_combine_send_us},
          {k + "ubep_combine_us", t.ubep_combine_us}};
}

namespace {

using Kind = JsonValue::Kind;

struct BenchRun {
  std::map<std::pair<std::string, std::string>, double> median;  // (impl, op) -> µs
  double row_send_us = 0;  // bsp combine's row send, slowest rank (0: not reported)
  double bytes = 0;        // the dispatch's bytes_per_rank
  double tokens = 0;       // per rank, from the run's config
};

// The result row of (impl, op) in the fused sync mode, or nullptr.
const JsonValue* result_row(const BenchJson& b, const std::string& impl, const std::string& op) {
  const JsonValue* results = b.doc.find("results");
  if (!results || results->kind != Kind::kArray) return nullptr;
  for (const JsonValue& row : results->array) {
    const JsonValue *i = row.find("impl"), *o = row.find("op"), *s = row.find("sync");
    if (!i || !o || i->kind != Kind::kString || o->kind != Kind::kString) continue;
    if (s && s->kind == Kind::kString && s->text != "fused") continue;
    if (i->text == impl && o->text == op) return &row;
  }
  return nullptr;
}

// The slowest rank's median of `stage` (per-rank medians, ubep-bench's "ranks" breakdown), else
// the row's own "stages_us" entry; 0 when neither is there.
double slowest_rank_stage(const JsonValue& row, const std::string& stage, const std::string& path) {
  double slowest = 0;
  if (const JsonValue* ranks = row.find("ranks"); ranks && ranks->kind == Kind::kArray)
    for (const JsonValue& r : ranks->array)
      if (const JsonValue* st = r.find("stages_us"))
        if (const JsonValue* v = number_member(*st, stage, path))
          slowest = std::max(slowest, v->number);
  if (slowest > 0) return slowest;
  if (const JsonValue* st = row.find("stages_us"))
    if (const JsonValue* v = number_member(*st, stage, path)) return v->number;
  return 0;
}

}  // namespace

std::vector<BenchShapeTimes> shape_times_from_bench(const std::vector<std::string>& files) {
  std::map<std::string, std::vector<BenchRun>> runs;  // shape -> runs
  for (const std::string& f : files) {
    const BenchJson b = read_bench_json(f);
    const std::string shape = calibrated_shape_name(
        static_cast<int>(b.config_num("ranks")), static_cast<int64_t>(b.config_num("tokens")),
        static_cast<int>(b.config_num("hidden")), static_cast<int>(b.config_num("topk")),
        static_cast<int>(b.config_num("experts")), b.config_str("dtype"), b.config_str("layout"));
    // The separation that keeps `validate` a test of predictions: only runs of the shapes
    // `calibrate` would time may set rates; an unseen shape's run must never reach the model.
    UBEP_CHECK_ARG(!shape.empty(), "'", f,
                   "' is not a run of a calibrated shape (decode: 2 ranks x 128 tokens latency, "
                   "prefill: 2 x 4096 throughput, cache: 2 x ",
                   cache_call_tokens(),
                   " latency; hidden 7168, top-8, 256 experts, bf16): only those may set the "
                   "model's rates");
    BenchRun run;
    run.tokens = b.config_num("tokens");
    run.median = b.medians();
    for (const char* impl : {"bsp", "ubep"})
      for (const char* op : {"dispatch", "combine"})
        UBEP_CHECK_ARG(run.median.count({impl, op}), "'", f, "' has no ", impl, " ", op,
                       " result (run ubep-bench with --algo bsp,ubep)");
    const JsonValue* comb = result_row(b, "bsp", "combine");
    run.row_send_us = comb ? slowest_rank_stage(*comb, "row send", f) : 0;
    UBEP_CHECK_ARG(run.row_send_us > 0, "'", f,
                   "': bsp combine has no \"row send\" stage time (an older ubep-bench?)");
    const JsonValue* disp = result_row(b, "ubep", "dispatch");
    const JsonValue* bytes = disp ? number_member(*disp, "bytes_per_rank", f) : nullptr;
    UBEP_CHECK_ARG(bytes && bytes->number > 0, "'", f, "': ubep dispatch has no bytes_per_rank");
    run.bytes = bytes->number;
    runs[shape].push_back(std::move(run));
  }
  std::vector<BenchShapeTimes> out;
  for (const auto& [shape, rs] : runs) {
    BenchShapeTimes s;
    s.shape = shape;
    s.runs = static_cast<int>(rs.size());
    s.tokens = rs.front().tokens;
    s.bytes = rs.front().bytes;
    auto least = [&](const char* impl, const char* op) {
      double m = std::numeric_limits<double>::infinity();
      for (const BenchRun& r : rs) m = std::min(m, r.median.at({impl, op}));
      return m;
    };
    s.times.bsp_dispatch_us = least("bsp", "dispatch");
    s.times.ubep_dispatch_us = least("ubep", "dispatch");
    s.times.bsp_combine_us = least("bsp", "combine");
    s.times.ubep_combine_us = least("ubep", "combine");
    // The row send of the same run as the bsp combine taken: the rest of that combine is the
    // staged reduction (a row send from another run could exceed the combine it is cut from).
    for (const BenchRun& r : rs)
      if (r.median.at({"bsp", "combine"}) == s.times.bsp_combine_us)
        s.times.bsp_combine_send_us = std::min(r.row_send_us, s.times.bsp_combine_us);
    out.push_back(s);
  }
  return out;
}

void write_calibration_with_bench_rates(const std::string& calibration_path,
                                        const std::vector<BenchShapeTimes>& bench,
                                        const std::string& out_path) {
  const JsonValue doc = read_json_file(calibration_path, "calibration file");
  UBEP_CHECK_ARG(doc.kind == Kind::kObject, "calibration file '", calibration_path,
                 "' is not a JSON object, got ", doc.kind_name());
  const JsonValue* row = number_member(doc, "row_bytes", calibration_path);
  const double row_bytes = row ? row->number : 7168 * 2;
  std::map<std::string, double> replaced;
  for (const BenchShapeTimes& s : bench) {
    for (const auto& [k, v] : shape_rate_fields(s.shape, s.bytes, s.tokens, row_bytes, s.times))
      replaced[k] = v;
    replaced[s.shape + "_rates_from_bench_runs"] = s.runs;
  }
  Json j;
  j.begin_object();
  std::set<std::string> written;
  for (const auto& m : doc.object) {
    UBEP_CHECK_ARG(m.second.kind == Kind::kNumber || m.second.kind == Kind::kNull,
                   "calibration file '", calibration_path, "': \"", m.first,
                   "\" must be a number, got ", m.second.kind_name());
    auto it = replaced.find(m.first);
    const double kept = m.second.kind == Kind::kNull ? std::numeric_limits<double>::quiet_NaN()
                                                     : m.second.number;  // NaN is written null
    j.kv(m.first, it != replaced.end() ? it->second : kept);
    written.insert(m.first);
  }
  for (const auto& [k, v] : replaced)
    if (!written.count(k)) j.kv(k, v);
  j.end_object();
  j.write(out_path);
}

}  // namespace ubep::sim
