// Expert layer with tile-level combine overlap (DESIGN §1 last row; arXiv 2607.19539).
//
// After a throughput-layout dispatch, every rank holds the rows its local experts must process.
// The ExpertLayer computes each expert's output in tiles (row bands) through a caller-provided
// tile function (GEMM-agnostic), and sends every finished row back to the token's owner, where
// the weighted sum over the token's experts is formed:
//
//     y[t] = Σ_k w[t,k] · out_k(t)      over selected k in ascending k,
//
// with out_k(t) rounded to the layer's dtype, accumulated in fp32 and rounded once (the latency-
// layout combine semantics of DESIGN §2, bit-identical to Buffer's latency combine).
//
// Overlap: rows are laid out per expert with remote owners first (grouped by owner, each group
// padded to the tile height, so every tile has exactly one destination) and local rows last;
// tiles run remote-first, experts with more remote rows first. Compute workers mark a finished
// tile ready with an epoch tag; dedicated communication workers watch the tags and ship every
// run of consecutive ready tiles of an owner group as one segment straight into the owner's
// shared window, as data-as-flag records. The owner reduces in the fixed order above, so the
// overlapped schedule gives exactly the bits of the serial one (compute everything, then ship).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ubep/buffer.hpp"
#include "ubep/group.hpp"
#include "ubep/types.hpp"

namespace ubep::moe {

// ---------------------------------------------------------------------------------------------
// Router: synthetic gate outputs for tests and benchmarks.

enum class RouterMode : uint8_t {
  kBalanced,      // every expert equally likely
  kModerateSkew,  // Zipf-like popularity, exponent 0.8
  kStressSkew,    // Zipf-like popularity, exponent 2.0: a few experts take most tokens
};
const char* router_mode_name(RouterMode m);
RouterMode parse_router_mode(const std::string& name);  // "balanced" | "moderate" | "stress"

struct RouterOutput {
  std::vector<int64_t> topk_idx;    // [tokens, topk], distinct experts per token
  std::vector<float> topk_weights;  // [tokens, topk], positive, summing to 1 per token
};

// Deterministic in (mode, experts, topk, tokens, seed). Throws InvalidArgument for topk outside
// [1, experts] or negative tokens.
RouterOutput route(RouterMode mode, int num_experts, int topk, int64_t tokens, uint64_t seed);

// ---------------------------------------------------------------------------------------------
// Tile computation (the GEMM-agnostic hook).

// One tile: `rows` valid rows of expert `local_expert` (rows <= tile height; padding rows are
// never passed). in: [rows, hidden] fp32 with leading dimension in_ld; out: [rows, hidden] fp32
// with leading dimension out_ld. `worker` in [0, compute_workers) indexes per-worker scratch.
// Called concurrently from several compute workers on different tiles; must be deterministic.
struct TileTask {
  int local_expert = 0;
  int64_t first_row =
      0;  // index of the tile's first row in the call's aligned layout (all experts)
  int64_t rows = 0;
  const float* in = nullptr;
  int64_t in_ld = 0;
  float* out = nullptr;
  int64_t out_ld = 0;
  int worker = 0;
};
using TileFn = std::function<void(const TileTask&)>;

// The bundled expert: a real BLAS (OpenBLAS cblas_sgemm) FFN per local expert.
enum class FfnKind : uint8_t {
  kGated,  // out = down( silu(x·Wg) ⊙ (x·Wu) ): gate/up projection, activation, down projection
  kSingle,  // out = x·W (hidden × hidden): the paper's operator benchmark
};
const char* ffn_kind_name(FfnKind k);
FfnKind parse_ffn_kind(const std::string& name);  // "gated" | "single"

class ExpertFfn {
 public:
  // Weights are fp32, deterministic in (seed, global expert id), scaled so activations stay O(1).
  ExpertFfn(FfnKind kind, int local_experts, int first_global_expert, int64_t hidden,
            int64_t intermediate, int max_workers, int64_t max_tile_rows, uint64_t seed);
  ~ExpertFfn();
  ExpertFfn(const ExpertFfn&) = delete;
  ExpertFfn& operator=(const ExpertFfn&) = delete;

  void operator()(const TileTask& t) const;
  TileFn tile_fn() const {
    return [this](const TileTask& t) { (*this)(t); };
  }
  // Floating-point operations of `rows` rows (for GFLOP/s).
  double flops(int64_t rows) const;
  size_t weight_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// The executor.

enum class Schedule : uint8_t {
  kSerial,      // compute every tile, then ship every segment, then reduce (the baseline)
  kOverlapped,  // communication workers ship segments while compute workers produce tiles
};
const char* schedule_name(Schedule s);
Schedule parse_schedule(const std::string& name);  // "serial" | "overlapped"

struct ExpertLayerConfig {
  int64_t max_tokens_per_rank = 128;
  int64_t hidden = 1024;
  DType dtype = DType::kBF16;  // of x, the expert outputs on the wire, and y
  int num_experts = 16;
  int max_topk = 8;
  int compute_workers = 1;     // threads producing tiles (the caller is one of them)
  int comm_workers = 1;        // dedicated threads shipping finished segments
  int64_t tile_rows = 64;      // tile height: rows per tile and the padding granule
  bool remote_first = true;    // false: tiles in expert-id order, local tiles first (ablation)
  uint64_t initial_epoch = 0;  // first call's sequence number (tests start near the wrap)
};

// Where the time of one run went, on this rank (microseconds; worker times are sums over the
// workers of that role, so they can exceed the wall time).
struct LayerStats {
  double total_us = 0;          // wall time of run()
  double compute_phase_us = 0;  // wall time until the last tile was computed
  double ship_phase_us = 0;     // serial: wall time of the ship phase (0 when overlapped)
  double reduce_us = 0;         // wall time of the owner's reduction, waiting included
  double compute_us = 0;        // in the tile function
  double gather_us = 0;         // copying dispatched rows into the aligned fp32 layout
  double copy_us = 0;           // writing records into owners' windows (all roles)
  double comm_idle_us = 0;      // communication workers with nothing ready (asleep or polling)
  double reduce_wait_us = 0;    // owner waiting for records still in flight
  int64_t rows = 0;             // valid rows computed
  int64_t padded_rows = 0;      // aligned-layout rows (valid + padding)
  int64_t tiles = 0;
  int64_t remote_tiles = 0;
  int64_t segments = 0;     // remote segments shipped (merged runs of ready tiles)
  int64_t remote_rows = 0;  // rows shipped to other ranks
};

class ExpertLayer {
 public:
  // Collective over the group (allocates the shared window); every rank passes the same config.
  ExpertLayer(Group& group, ExpertLayerConfig config);
  ~ExpertLayer();
  ExpertLayer(const ExpertLayer&) = delete;
  ExpertLayer& operator=(const ExpertLayer&) = delete;

  // Collective. `dispatched` is this rank's throughput-layout dispatch result; `topk_idx`
  // [tokens, k] int64 and `topk_weights` [tokens, k] fp32 are this rank's own routing (the
  // dispatch's inputs), used to reduce its tokens. Returns y [tokens, hidden] in the config's
  // dtype: a view into the layer's memory, valid until the next run.
  TensorView run(const DispatchResult& dispatched, const TensorView& topk_idx,
                 const TensorView& topk_weights, const TileFn& tile, Schedule schedule);

  // The expert outputs of the last run in latency-layout order [local_experts, slots, hidden]
  // (slot j of expert e = its j-th row in dispatch order), rounded to the dtype; for checks
  // against Buffer's latency combine. Slots beyond an expert's row count are zero.
  void last_outputs_latency(void* out, int64_t slots) const;

  const ExpertLayerConfig& config() const;
  const LayerStats& last_stats() const;
  int num_local_experts() const;
  size_t shared_bytes() const;

  // Hook called by a communication worker before it ships a segment of `rows` rows to another
  // rank: random delays in tests, an emulated link (sleep for the transfer time) in the bench.
  void set_ship_delay_hook(std::function<void(int comm_worker, int64_t rows)> hook);
  // Test hook: called by compute workers before each tile.
  void set_compute_delay_hook(std::function<void(int compute_worker)> hook);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ubep::moe
