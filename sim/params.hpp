// Every number ubep-sim uses, named, in one place (params.cpp sets them per preset and says
// where each comes from). The machine's shape (levels, latencies, link bandwidths) comes from
// the library's topology model through topo.hpp; these are the costs of the orchestration
// around the wires: workers, fences, barriers, flags, local copies, compute.
#pragma once

#include <string>
#include <vector>

namespace ubep::sim {

// One level of the machine, as the simulator sees it. Level 0 is "same rank".
struct LevelSpec {
  std::string name;
  double latency_ns = 0;      // one transfer's latency between two ranks at this level
  double bandwidth_GBps = 0;  // per-rank port bandwidth at this level, each direction
  int port = 0;               // levels with the same port share one physical port per rank
};

struct CostParams {
  std::string preset;
  // Workers (cores / SMs / threads) that execute a rank's communication work.
  int workers_per_rank = 1;
  // Bandwidth of one worker's copy engine (it can push at most this much alone).
  double worker_GBps = 0;
  // Messages one worker keeps in flight. 1 = it waits for each write to complete.
  int window = 1;
  // Software cost of issuing one message (address computation, header fill).
  double issue_ns = 0;
  // Bandwidth of a local copy by one worker (reorder / reduce / sentinel reset).
  double local_copy_GBps = 0;
  // Per-row fixed cost of a local copy (loop + index lookup).
  double local_row_ns = 0;
  // A memory fence: wait until every outstanding write is acknowledged, plus this.
  double fence_ns = 0;
  // Reading one peer's flag while verifying (bsp) or polling (ubep).
  double poll_ns = 0;
  // A group barrier is an all-to-all flag exchange: R posted flags and R polls spread over the
  // workers, plus the farthest level's latency, plus this.
  double barrier_round_extra_ns = 0;
  // Layout (routing metadata) cost per (token, k) entry, and prefix sum cost per count entry.
  double layout_ns_per_entry = 0;
  double prefix_ns_per_entry = 0;
  // Data-as-flag: bytes of payload per atomic write unit (UB: 480 payload of 512).
  double fused_payload_bytes = 480, fused_unit_bytes = 512;
  // Flag / count message size on the wire.
  double flag_bytes = 32;
  // UBEP role split on accelerators: workers dedicated to reordering (the rest send; one of
  // the senders also sends the count records). 0 = roles share the workers in sequence
  // (send, then receive), as the CPU implementation does.
  int ubep_reorder_workers = 0;

  // What the implementation does around the data (accelerator presets: the paper's staged
  // design; `local`: the CPU implementation in src/ep as it is now).
  // Dispatch receivers copy each landed row once more into its final place (reorder). false:
  // senders write rows straight into their final place (one copy); receivers only check tags.
  bool dispatch_reorder = true;
  // ubep combine: owners read the experts' rows in place (no data moves on the expert side;
  // each row costs the expert side one tag store, tag_ns) and reduce them as they are tagged.
  bool combine_in_place = false;
  // A tag store (expert side) or a tag check (receiver) per row, when the above apply.
  double tag_ns = 0;
  // Input bytes one worker reduces per ns in combine (fused fp32 pass over the rows);
  // 0 = local_copy_GBps (the reduction as a copy).
  double reduce_GBps = 0;
  // The same for bsp's combine, whose rows were just copied into the owner's staging (0 = as
  // reduce_GBps).
  double staged_reduce_GBps = 0;
  // bsp ends each call with one more group barrier (after the reorder / reduce), so that no
  // rank reuses the buffers while a peer still reads them: 4 barriers per dispatch, 3 per
  // combine. false: outputs are double-buffered by call parity (src/protocol/protocol.hpp), 3 + 2.
  bool bsp_final_barrier = true;
  // Dispatch row copies of calls moving >= stream_threshold_bytes per rank use stream_GBps
  // (non-temporal stores) instead of worker_GBps (0 = never).
  double stream_threshold_bytes = 0;
  double stream_GBps = 0;
  // Rates measured at several working-set sizes (local preset): a call uses the set measured at
  // the size nearest (log scale) to the bytes it moves per rank, overriding worker_GBps,
  // local_copy_GBps, stream_GBps and reduce_GBps. Empty: the scalars above.
  struct RateSet {
    std::string name;
    double bytes = 0;               // bytes per rank the set was measured at
    double copy_GBps = 0;           // plain-store row copies, per core, both cores copying
    double stream_GBps = 0;         // non-temporal row copies (+ row metadata and tag), idem
    double reduce_GBps = 0;         // fused reduction, input bytes, idem: rows in place (ubep)
    double staged_reduce_GBps = 0;  // idem, rows just pushed into the owner's staging (bsp)
    // The set's other memory streams (rates.hpp; 0 = not recorded, old calibration files):
    double source_bytes = 0;  // distinct token bytes the placement copies from
    double output_bytes = 0;  // bytes the reduction writes (one row per token)
    // The layout the set was measured in: decode latency (rows in slots of per-expert regions,
    // ranks x max_tokens slots each: scattered), prefill throughput (rows contiguous per source).
    bool latency_layout = true;
  };
  std::vector<RateSet> rate_sets;
  std::string rate_set;  // the set a call used (effective_preset)
  // Memory streams (local preset, rates.hpp; 0 = off, a call uses its nearest set's rates):
  // the core's L2 (a placement source that fits is read from memory once), and the plain-store
  // copy rate of a call below stream_threshold_bytes (cache-resident rows), both [MEAS].
  double l2_bytes = 0;
  double cache_copy_GBps = 0;
  double cache_bytes = 0;  // bytes per rank of that call
  // Shared-cache residency [MEAS]: per-core bytes that are re-read from cache after being
  // written (calibrate_calls.hpp reuse_capacity_bytes; 0 = off). A call below decode's size
  // reads the share of its rows the cache holds (all when they fit, capacity / bytes of more;
  // rates.hpp resident_share) at the rates the library's calls reached on the 2 MiB call (its
  // streamed dispatch, reductions and bsp's staging copy); a placement source that fits is read
  // from memory once.
  double reuse_bytes = 0;
  double cache_stream_GBps = 0, cache_reduce_GBps = 0, cache_staged_reduce_GBps = 0;
  // More ranks than cores [MEAS]: the scheduler's makespan for cores + 1 equal threads, as a
  // multiple of one thread's time ((threads, ratio)); it selects whole rounds or fair sharing
  // (rates.hpp oversubscribed_ratio), and a call's rates are divided by the result.
  std::vector<std::pair<int, double>> oversubscribed_ratio;
  // Cores the ranks share (local preset; 0 = a core per rank). With more ranks than cores the OS
  // time-slices them, so each rank gets cores / ranks of a core: every measured rate is scaled by
  // that share (effective_preset; the rates were measured with every core busy, so the memory
  // system's sharing is already inside them).
  int cores = 0;
  double core_share = 1;  // the share a call used (effective_preset)

  // Decode compute (TPOT experiment), per MoE layer per rank.
  double attention_us = 0;       // attention + shared expert + norms, per layer
  double expert_weight_us = 0;   // loading one local expert's weights (memory-bound decode GEMM)
  double expert_ns_per_row = 0;  // per received row (GEMM flops)
  double compute_jitter = 0;     // relative sigma of per-rank, per-layer compute noise

  // Where each value comes from, one line per parameter (printed by `ubep-sim params`).
  std::vector<std::pair<std::string, std::string>> sources;
};

}  // namespace ubep::sim
