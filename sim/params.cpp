// The presets: every cost parameter of ubep-sim is set here, with its source. Topology figures
// (level latencies and bandwidths) come from the library's presets in src/sched (derived in
// docs/SCHEDULING.md); the `local` preset replaces them with this machine's measurements.
//
// Source tags used below:
//   [UBEP]   the UBEP paper (SIGCOMM'26), as summarised in DESIGN.md §1 and issue 5
//   [CMI]    "Serving Large Language Models on Huawei CloudMatrix384" (arXiv 2506.12708)
//   [DS]     DeepEP README / DeepSeek-V3 technical report (model shape, measured NVLink/RDMA GB/s)
//   [SPEC]   vendor datasheets (HBM bandwidth, SM / core counts)
//   [MEAS]   measured on this machine by `ubep-sim calibrate`
//   [ASSUME] an engineering estimate with no published figure; named so it can be varied
#include <cmath>
#include <fstream>

#include "sim/json_read.hpp"
#include "sim/machine.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

namespace {

void src(CostParams& c, const char* name, const char* text) { c.sources.emplace_back(name, text); }

// Values shared by the accelerator presets; each preset overrides what differs.
CostParams accelerator_common(const char* name) {
  CostParams c;
  c.preset = name;
  c.window = 1;
  src(c, "window",
      "1 [scheduler]: a worker pushes one item's bytes at a time, back to back; stores are posted, "
      "so latencies overlap (the scheduler's cost model)");
  c.issue_ns = 50;
  src(c, "issue_ns", "50 ns [ASSUME]: a DMA descriptor / a few scalar instructions per message");
  c.local_row_ns = 20;
  src(c, "local_row_ns", "20 ns [ASSUME]: index lookup + loop overhead per copied row");
  c.fence_ns = 100;
  src(c, "fence_ns",
      "100 ns [ASSUME] on top of waiting for the write's acknowledgment (one latency back)");
  c.barrier_round_extra_ns = 0;
  src(c, "barrier_round_extra_ns",
      "0 [ASSUME]: barrier = R flag posts + farthest latency + R polls, over W workers");
  c.layout_ns_per_entry = 2;
  src(c, "layout_ns_per_entry",
      "2 ns [ASSUME]: routing metadata per (token, k), spread over the workers");
  c.prefix_ns_per_entry = 1;
  src(c, "prefix_ns_per_entry", "1 ns [ASSUME]: one add per (source rank, local expert) count");
  c.fused_payload_bytes = 480;
  c.fused_unit_bytes = 512;
  src(c, "fused_payload/unit",
      "480/512 B [UBEP]: UB 512 B atomic write = 480 B payload + 32 B flag");
  c.flag_bytes = 32;
  src(c, "flag_bytes", "32 B [UBEP]: the flag part of a UB atomic write");
  return c;
}

CostParams cm384_cost() {
  CostParams c = accelerator_common("cm384");
  c.workers_per_rank = 48;
  src(c, "workers_per_rank",
      "48 [SPEC]: AIV vector cores of one Ascend 910C die (same as the scheduler ablation)");
  c.worker_GBps = 1600.0 / 48;
  src(c, "worker_GBps", "33.3 GB/s [SPEC]: a die's 1.6 TB/s HBM shared by its 48 AIV cores");
  c.local_copy_GBps = c.worker_GBps;
  src(c, "local_copy_GBps",
      "33.3 GB/s [SPEC]: as worker_GBps (reorder/reduce copies are HBM to HBM)");
  c.poll_ns = 218;
  src(c, "poll_ns", "218 ns [UBEP]: one local memory access per flag read");
  c.ubep_reorder_workers = 12;
  src(c, "ubep_reorder_workers",
      "12 of 48 [ASSUME]: the paper splits roles but does not publish the split");
  c.attention_us = 400;
  src(c, "attention_us",
      "400 us/layer [ASSUME from CMI]: non-MoE decode compute so a step is ~tens of ms, "
      "the range CMI reports for DeepSeek decode on CM384 (TPOT ~50 ms)");
  c.expert_weight_us = 44.0 * 1024 * 1024 / 1.6e3 / 1e3;  // 44 MB int8 weights / 1.6 TB/s
  src(c, "expert_weight_us",
      "27.5 us [DS+SPEC]: one expert = 3 x 7168 x 2048 int8 weights (44 MB) at 1.6 TB/s");
  c.expert_ns_per_row = 300;
  src(c, "expert_ns_per_row", "300 ns [SPEC]: 88 MFLOP per row at ~300 TFLOPS int8 per die");
  c.compute_jitter = 0.03;
  src(c, "compute_jitter",
      "3% sigma [ASSUME]: per-rank, per-layer compute noise (clocks, OS, HBM refresh)");
  return c;
}

CostParams gpu_cost(const char* name, int sms, double hbm_GBps, int comm_sms) {
  CostParams c = accelerator_common(name);
  c.workers_per_rank = comm_sms;
  src(c, "workers_per_rank",
      "SMs given to communication [DS]: DeepEP's default 24 (H800) / 24 (B200)");
  c.worker_GBps = hbm_GBps / sms;
  src(c, "worker_GBps", "HBM bandwidth / SM count [SPEC]: H800 3.35 TB/s / 132, B200 8 TB/s / 148");
  c.local_copy_GBps = c.worker_GBps;
  src(c, "local_copy_GBps", "as worker_GBps [SPEC]");
  c.poll_ns = 500;
  src(c, "poll_ns", "500 ns [ASSUME]: an uncached global-memory read on a GPU (~600-800 cycles)");
  c.fence_ns = 500;
  src(c, "fence_ns", "500 ns [ASSUME]: __threadfence_system on top of the acknowledgment");
  c.ubep_reorder_workers = comm_sms / 4;
  src(c, "ubep_reorder_workers", "a quarter of the communication SMs [ASSUME]");
  c.fused_payload_bytes = 480;
  c.fused_unit_bytes = 512;
  src(c, "fused_payload/unit",
      "480/512 [UBEP], kept on GPUs so the comparison isolates orchestration");
  c.attention_us = 150;
  src(c, "attention_us", "150 us/layer [ASSUME]: faster GPUs than CM384 dies");
  c.expert_weight_us = 44.0 * 1024 * 1024 / hbm_GBps / 1e3;
  src(c, "expert_weight_us", "44 MB of fp8/int8 expert weights / HBM bandwidth [DS+SPEC]");
  c.expert_ns_per_row = 100;
  src(c, "expert_ns_per_row", "100 ns [SPEC]: 88 MFLOP per row at ~1 PFLOPS fp8");
  c.compute_jitter = 0.03;
  src(c, "compute_jitter", "3% sigma [ASSUME]");
  return c;
}

// The calibration file written by `ubep-sim calibrate`.
struct Calibration {
  double handoff_ns = 0;  // one-way cross-core latency of a flag (ping-pong / 2)
  int cores = 0;          // cores of the calibrated machine (0: not recorded)
  double l2_bytes = 0, cache_copy_GBps = 0, cache_bytes = 0;  // memory streams (0: not recorded)
  double reuse_bytes = 0, cache_stream_GBps = 0, cache_reduce_GBps = 0,
         cache_staged_reduce_GBps = 0;          // shared-cache residency (0: not recorded)
  std::vector<std::pair<int, double>> oversub;  // (ranks, makespan ratio)
  std::vector<CostParams::RateSet> sets;        // per measured shape
};

Calibration read_calibration(const std::string& path) {
  UBEP_CHECK_ARG(std::ifstream(path).good(), "cannot read calibration file '", path,
                 "': run `ubep-sim calibrate --out ", path, "` first");
  const JsonValue doc = read_json_file(path, "calibration file");
  UBEP_CHECK_ARG(doc.kind == JsonValue::Kind::kObject, "calibration file '", path,
                 "' is not a JSON object, got ", doc.kind_name());
  Calibration cal;
  auto checked = [&](const std::string& key, const JsonValue& v) {
    UBEP_CHECK_ARG(std::isfinite(v.number) && v.number >= 0, "calibration file '", path, "': bad ",
                   key, " = ", v.text);
    return v.number;
  };
  auto get = [&](const std::string& key) {
    const JsonValue* v = number_member(doc, key, path);
    UBEP_CHECK_ARG(v, "calibration file '", path, "' has no \"", key,
                   "\" (written by an older ubep-sim? run `ubep-sim calibrate` again)");
    return checked(key, *v);
  };
  auto optional = [&](const std::string& key) {  // files of older ubep-sim versions lack these
    const JsonValue* v = number_member(doc, key, path);
    return v ? checked(key, *v) : 0.0;
  };
  cal.handoff_ns = get("handoff_ns");
  // Optional: files written before it was recorded predict as if every rank had a core.
  cal.cores = static_cast<int>(optional("cores"));
  cal.l2_bytes = optional("l2_bytes");
  cal.cache_copy_GBps = optional("cache_copy_GBps");
  cal.cache_bytes = optional("cache_bytes");
  cal.reuse_bytes = optional("reuse_capacity_bytes");
  cal.cache_stream_GBps = optional("cache_stream_GBps");  // the small call's dispatch
  cal.cache_reduce_GBps = optional("cache_reduce_GBps");
  cal.cache_staged_reduce_GBps = optional("cache_staged_reduce_GBps");
  for (int r = 2; r <= 256; ++r) {
    const double x = optional("oversubscribed_ratio_" + std::to_string(r));
    if (x > 0) cal.oversub.emplace_back(r, x);
  }
  for (const char* shape : {"decode", "prefill"}) {
    const std::string n = shape;
    CostParams::RateSet r;
    r.source_bytes = optional(n + "_source_bytes");
    r.output_bytes = optional(n + "_output_bytes");
    r.name = n;
    r.latency_layout = n == "decode";
    r.bytes = get(n + "_bytes");
    r.copy_GBps = get(n + "_copy_GBps");
    r.stream_GBps = get(n + "_stream_GBps");
    r.reduce_GBps = get(n + "_reduce_GBps");
    r.staged_reduce_GBps = get(n + "_staged_reduce_GBps");
    UBEP_CHECK_ARG(r.bytes > 0 && r.copy_GBps > 0 && r.stream_GBps > 0 && r.reduce_GBps > 0 &&
                       r.staged_reduce_GBps > 0,
                   "calibration file '", path, "': zero rate for ", n);
    cal.sets.push_back(r);
  }
  return cal;
}

// The CPU implementation of src/ep as it is now (see the comments at the top of bsp.cpp and
// ubep.cpp), on this machine, with ubep-bench's process ranks.
Preset local_preset(int ranks, const std::string& file) {
  const std::string path = file.empty() ? "sim-calibration.json" : file;
  const Calibration cal = read_calibration(path);
  CostParams c;
  c.preset = "local";
  c.rate_sets = cal.sets;
  src(c, "rate_sets",
      "[MEAS] per shape (decode 14.7 MB, prefill 117 MB per rank): the library's calls on 2 "
      "thread ranks, bytes per rank over the time of: the dispatch (row placement), ubep's "
      "combine (reduction in place), bsp combine's row send (plain copies into staging) and the "
      "rest of it (the reduction there); split into memory streams (rates.hpp)");
  for (const auto& r : cal.sets)
    src(c, ("  " + r.name).c_str(),
        detail::concat(r.bytes / 1e6, " MB: copy ", r.copy_GBps, ", stream ", r.stream_GBps,
                       ", reduce ", r.reduce_GBps, ", staged reduce ", r.staged_reduce_GBps,
                       " GB/s")
            .c_str());
  c.worker_GBps = cal.sets.front().copy_GBps;  // replaced per call from rate_sets
  c.local_copy_GBps = c.worker_GBps;
  c.stream_GBps = cal.sets.front().stream_GBps;
  c.reduce_GBps = cal.sets.front().reduce_GBps;
  c.staged_reduce_GBps = cal.sets.front().staged_reduce_GBps;
  // The memory bus is not a separate link: the per-core rates were measured with both cores
  // copying at once, so its sharing is inside them; the levels only carry the handoff latency.
  const double bus = 1e4;
  sched::Topology topo(
      "local", {sched::Level{"self", 0, bus}, sched::Level{"shm", cal.handoff_ns, bus}}, ranks);
  c.l2_bytes = cal.l2_bytes;
  c.cache_copy_GBps = cal.cache_copy_GBps;
  c.cache_bytes = cal.cache_bytes;
  c.reuse_bytes = cal.reuse_bytes;
  c.cache_stream_GBps = cal.cache_stream_GBps;
  c.cache_reduce_GBps = cal.cache_reduce_GBps;
  c.cache_staged_reduce_GBps = cal.cache_staged_reduce_GBps;
  c.oversubscribed_ratio = cal.oversub;
  src(c, "reuse_bytes",
      "[MEAS] per-core bytes re-read from the shared cache after being written (write, then "
      "re-read, every core at once, within 10% of the in-cache rate): a call below decode's "
      "size reads the share of its rows the cache holds (all that fit, capacity / bytes of a "
      "larger call; rates.hpp resident_share) at the 2 MiB call's rates, the rest at its own; a "
      "placement source that fits is read once");
  src(c, "oversubscribed_ratio",
      "[MEAS] makespan of cores + 1 equal threads / one thread's time (spin loops as long as a "
      "decode call): nearer whole rounds than fair sharing -> a call with R > cores ranks takes "
      "ceil(R / cores) x its time alone, else R / cores");
  src(c, "l2_bytes",
      "[MEAS] L2 per core (sysfs): a placement source that fits is read from memory once, a "
      "larger one once per row copy (rates.hpp)");
  src(c, "cache_copy_GBps",
      "[MEAS] plain row copies of a call of half the non-temporal threshold (cache-resident); "
      "plain copies move with log(bytes) from it to decode's and prefill's copy rates");
  c.cores = cal.cores;
  src(c, "cores",
      "[MEAS] cores of the calibrated machine; more ranks than cores share them: rates / the "
      "measured makespan ratio, or x cores / ranks without one");
  c.workers_per_rank = 1;
  src(c, "workers_per_rank",
      "1: ubep-bench's default on 2 cores with 2 ranks (cores / ranks - 1 helpers + the caller)");
  c.window = 1;
  src(c, "window", "1: a CPU thread copies one row at a time");
  c.stream_threshold_bytes = 1;
  src(c, "stream_threshold_bytes",
      "1 B [impl]: every dispatch places its rows with non-temporal stores at the streamed rate "
      "(the library streams them at every size since 2026-12-03, dispatch_call.hpp; 4 MiB "
      "before, when smaller calls used plain stores)");
  c.dispatch_reorder = false;
  src(c, "dispatch_reorder",
      "false [impl]: senders write rows into their final place; no receive-side copy");
  c.combine_in_place = true;
  src(c, "combine_in_place",
      "true [impl]: ubep owners read the experts' rows in place (the bench's experts write "
      "the combine buffer, untimed); bsp pushes rows to the owners' staging (plain stores)");
  c.bsp_final_barrier = false;
  src(c, "bsp_final_barrier",
      "false [impl]: outputs double-buffered by call parity; bsp: 3 barriers per dispatch, 2 per "
      "combine");
  c.issue_ns = 5;
  c.tag_ns = 5;
  src(c, "issue_ns/tag_ns",
      "5 ns [ASSUME]: one store (count record, flag, tag) or tag check that hits in cache; "
      "the per-row costs of row copies are inside the measured rates");
  c.local_row_ns = 0;
  src(c, "local_row_ns",
      "0: inside the measured rates (the calibration times whole per-row loops)");
  c.fence_ns = 20;
  src(c, "fence_ns", "20 ns [ASSUME]: an mfence on x86");
  c.poll_ns = 5;
  src(c, "poll_ns",
      "5 ns [ASSUME]: a flag read that hits in cache (a miss is the handoff latency)");
  c.barrier_round_extra_ns = 0;
  src(c, "barrier", "flag posts + handoff latency [MEAS] + polls");
  c.layout_ns_per_entry = 2;
  src(c, "layout_ns_per_entry", "2 ns [ASSUME]");
  c.prefix_ns_per_entry = 1;
  src(c, "prefix_ns_per_entry", "1 ns [ASSUME]");
  c.fused_payload_bytes = 1;  // the CPU build writes the tag after the row: no framing loss
  c.fused_unit_bytes = 1;
  src(c, "fused_payload/unit",
      "1/1: on CPU the epoch tag is a word after the row (protocol.hpp), no 480/512 framing");
  c.flag_bytes = 4;
  c.ubep_reorder_workers = 0;
  src(c, "ubep_reorder_workers",
      "0: the CPU ubep runs send then receive roles on the same thread (ubep.cpp)");
  src(c, "calibration", path.c_str());
  return Preset{std::move(topo), c, {0, 1}};
}

}  // namespace

CostParams cm384_costs() { return cm384_cost(); }

Preset make_preset(const std::string& name, int ranks, const std::string& calibration_file) {
  UBEP_CHECK_ARG(ranks >= 1, "ranks must be >= 1, got ", ranks);
  if (name == "ubmesh8k") return ubmesh8k_preset(ranks);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0)
    return pod_file_preset(name, ranks);
  if (name == "cm384") {
    // One-hop and two-hop UB traffic leave a die through the same UB links: one port.
    return Preset{sched::cm384(ranks), cm384_cost(), {0, 1, 1}};
  }
  if (name == "nvl72") {
    return Preset{sched::nvl72(ranks), gpu_cost("nvl72", 148, 8000, 24), {0, 1}};
  }
  if (name == "h800") {
    // NVLink and the InfiniBand NIC are separate ports.
    return Preset{sched::h800(ranks), gpu_cost("h800", 132, 3350, 24), {0, 1, 2}};
  }
  if (name == "local") return local_preset(ranks, calibration_file);
  throw InvalidArgument(
      detail::concat("unknown preset '", name,
                     "' (cm384 | ubmesh8k | nvl72 | h800 | local | a pod file FILE.json)"));
}

}  // namespace ubep::sim
