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

  // Decode compute (TPOT experiment), per MoE layer per rank.
  double attention_us = 0;        // attention + shared expert + norms, per layer
  double expert_weight_us = 0;    // loading one local expert's weights (memory-bound decode GEMM)
  double expert_ns_per_row = 0;   // per received row (GEMM flops)
  double compute_jitter = 0;      // relative sigma of per-rank, per-layer compute noise

  // Where each value comes from, one line per parameter (printed by `ubep-sim params`).
  std::vector<std::pair<std::string, std::string>> sources;
};

}  // namespace ubep::sim
