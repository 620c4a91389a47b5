// The expert layer's per-rank state and plan (see expert_layer.cpp for the concurrency argument).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>

#include "backend/factory/factory.hpp"
#include "core/local_array.hpp"
#include "core/wait.hpp"
#include "ep/peer_deaths.hpp"
#include "protocol/config_checks.hpp"
#include "protocol/protocol.hpp"
#include "ubep/bf16.hpp"
#include "ubep/error.hpp"
#include "ubep/moe.hpp"

namespace ubep::moe {

namespace layer_detail {

using Clock = std::chrono::steady_clock;
inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// The data path of the layer's role team: one member per compute and communication worker
// (member 0 is the caller).
inline BufferConfig data_path_config(const ExpertLayerConfig& c) {
  BufferConfig b;
  b.num_workers = c.compute_workers + c.comm_workers - 1;
  return b;
}

inline ExpertLayerConfig checked(const Group& g, ExpertLayerConfig c) {
  protocol::check_shape({c.max_tokens_per_rank, c.hidden, c.dtype, c.num_experts, c.max_topk},
                        g.size(), "ExpertLayer", {.fp8 = false});
  UBEP_CHECK_ARG(c.compute_workers >= 1 && c.compute_workers <= 256,
                 "ExpertLayer: compute_workers must be in [1, 256], got ", c.compute_workers);
  UBEP_CHECK_ARG(c.comm_workers >= 1 && c.comm_workers <= 256,
                 "ExpertLayer: comm_workers must be in [1, 256], got ", c.comm_workers);
  UBEP_CHECK_ARG(c.tile_rows >= 1 && c.tile_rows <= (int64_t{1} << 20),
                 "ExpertLayer: tile_rows must be in [1, 2^20], got ", c.tile_rows);
  for (int r = 0; r < g.size(); ++r)
    UBEP_CHECK_ARG(g.same_host(r, g.rank()), "ExpertLayer: rank ", r,
                   " is on another host; the expert layer needs every rank on one host");
  return c;
}

struct Tile {
  int expert;     // local expert
  int owner;      // destination rank of every row in the tile
  int64_t begin;  // first aligned row (global index into in_/out_)
  int64_t rows;   // valid rows (the rest of the tile height is padding)
};

// One (expert, owner) run of tiles: the unit a communication worker merges ready tiles within.
struct OwnerGroup {
  int first_tile, num_tiles;
  int owner;
};

using RecordFormat =
    protocol::TileRecordFormat;  // the wire format lives in src/protocol/protocol.hpp
using Record = protocol::TileRecord;

// Per-member counters, padded so members never share a cache line.
struct alignas(64) MemberStats {
  double compute = 0, gather = 0, copy = 0, idle = 0, finish = 0;
  int64_t segments = 0;
};

}  // namespace layer_detail
using namespace layer_detail;

struct ExpertLayer::Impl {
  Group& group;
  ExpertLayerConfig cfg;
  int rank, ranks, local_experts;
  int64_t T, H;
  size_t es;
  RecordFormat fmt;
  std::unique_ptr<SharedWindow> window;
  // Every row into a window and every tag goes through the data path; its role team runs the
  // compute, communication and reduce members.
  std::unique_ptr<backend::DataPath> dp;
  WaitPolicy wait;
  ep::PeerDeaths deaths;          // every wait on a peer ends at once if its process dies
  protocol::CallSequence epochs;  // the current call's sequence number, half and tag (as Window)
  uint64_t calls = 0;             // calls completed by this rank (for `released`)

  // Plan of the current call.
  std::vector<Tile> tiles;
  std::vector<OwnerGroup> groups;                 // remote groups only, in schedule order
  std::vector<int> order;                         // compute order of tile indices
  std::vector<int64_t> arow_src;                  // aligned row -> dispatched row, -1 = padding
  std::vector<int64_t> arow_slot;                 // aligned row -> owner slot t*max_topk + k
  std::vector<std::vector<int64_t>> expert_rows;  // per expert: aligned rows in dispatch order
  int64_t max_aligned = 0;
  LocalArray in_, out_;                    // [max_aligned, H] fp32
  std::unique_ptr<protocol::Tag[]> ready;  // per tile
  size_t max_tiles = 0;
  std::atomic<uint32_t> published{0};
  std::atomic<int> next_tile{0};
  std::atomic<bool> abort{false};
  std::vector<MemberStats> mstats;
  LocalArray stage;  // per member: one row in the layer dtype, the source of a record's put_row

  // Inputs of the current call.
  const char* recv_x = nullptr;
  LayerStats stats;
  std::vector<float> acc;  // per member [H]
  LocalArray y;
  std::function<void(int, int64_t)> ship_hook;
  std::function<void(int)> compute_hook;
  const TileFn* current_tile_fn = nullptr;

  Impl(Group& g, const ExpertLayerConfig& c)
      : group(g),
        cfg(checked(g, c)),
        rank(g.rank()),
        ranks(g.size()),
        local_experts(cfg.num_experts / g.size()),
        T(cfg.max_tokens_per_rank),
        H(cfg.hidden),
        es(dtype_size(cfg.dtype)),
        dp(backend::make_data_path(data_path_config(cfg))),
        deaths(g),
        epochs(cfg.initial_epoch) {
    fmt.row_bytes = static_cast<size_t>(H) * es;
    window = group.allocate_window(records_offset() + 2 * slots() * fmt.bytes());
    wait.timeout = group.options().timeout;
    // Worst case: every (row, k) of every source lands here, plus < tile_rows of padding per
    // (expert, owner) group.
    const auto R = static_cast<int64_t>(ranks);
    max_aligned =
        R * T * cfg.max_topk + static_cast<int64_t>(local_experts) * R * (cfg.tile_rows - 1);
    in_ = LocalArray(static_cast<size_t>(max_aligned * H) * 4);
    out_ = LocalArray(static_cast<size_t>(max_aligned * H) * 4);
    max_tiles = static_cast<size_t>((max_aligned + cfg.tile_rows - 1) / cfg.tile_rows +
                                    static_cast<int64_t>(local_experts) * R);
    ready = std::make_unique<protocol::Tag[]>(max_tiles);  // value-initialised: 0, no call's tag
    mstats.resize(static_cast<size_t>(dp->members()));
    acc.resize(static_cast<size_t>(dp->members() * H));
    stage = LocalArray(static_cast<size_t>(dp->members()) * stage_stride());
    y = LocalArray(static_cast<size_t>(T * H) * es);
    arow_src.resize(static_cast<size_t>(max_aligned));
    arow_slot.resize(static_cast<size_t>(max_aligned));
  }

  size_t slots() const { return static_cast<size_t>(T) * static_cast<size_t>(cfg.max_topk); }
  static size_t records_offset() { return protocol::kCacheLine; }
  // Word 0 of every window: calls whose records its owner has finished reading, modulo 2^32
  // (ranks are never 2^31 calls apart, so a wrapping comparison orders them).
  protocol::Tag* released(int r) const { return static_cast<protocol::Tag*>(window->base(r)); }
  bool has_released(int owner, uint64_t need) const {
    const uint32_t v = dp->load(released(owner));
    return static_cast<int32_t>(v - static_cast<uint32_t>(need)) >= 0;
  }
  size_t stage_stride() const { return protocol::round_up(fmt.row_bytes, protocol::kCacheLine); }
  char* stage_row(int m) const { return stage.get() + static_cast<size_t>(m) * stage_stride(); }
  Record record(int owner, int half, int64_t slot) const {
    return {static_cast<char*>(window->base(owner)) + records_offset() +
                (static_cast<size_t>(half) * slots() + static_cast<size_t>(slot)) * fmt.bytes(),
            &fmt};
  }
  uint32_t tag() const { return epochs.tag(); }
  int half() const { return epochs.half(); }

  void plan(const DispatchResult& d);
  int64_t rows_of(int first, int n) const {
    int64_t r = 0;
    for (int i = first; i < first + n; ++i) r += tiles[static_cast<size_t>(i)].rows;
    return r;
  }
  void gather_tile(const Tile& t);
  void ship(int m, int first_tile, int num_tiles, int owner, MemberStats& ms,
            std::vector<char>& checked_owner);
  void compute_role(int m, bool overlapped);
  void comm_role(int m, int first_member, int members, bool overlapped);
  void reduce(int64_t tokens, int K, const int64_t* idx, const float* w, int m, int members);
};

}  // namespace ubep::moe
