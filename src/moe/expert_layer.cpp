// The tile-level overlap executor (see include/ubep/moe.hpp for what it computes).
//
// Concurrency argument (who writes what, who reads it, and what orders the two):
//
//  1. Tile outputs, inside one rank. A compute worker writes a tile's rows of `out_` with plain
//     stores, then publish()es the tile's ready tag (release) with the call's epoch tag, then
//     bumps `published_` (release) and notifies. A communication worker reads the rows only
//     after arrived() (acquire) saw that tag on that tile, so the rows happen-before its reads.
//     Tags are never cleared: a tile's stale value is the tag of an earlier call, which differs
//     from the current one (tag_of: consecutive calls differ), and tile indices are rebuilt per
//     call before WorkerTeam::run publishes the job (its generation counter is a release/acquire
//     pair), so every worker sees the new plan. Lost wake-ups are impossible: a communication
//     worker reads `published_` *before* it scans the tags and sleeps only if the counter still
//     has that value; a tile published after the scan bumped the counter after its tag.
//  2. Records in an owner's shared window (data-as-flag, src/ep/protocol.hpp). A shipper writes
//     a record's row with plain stores and then publishes the record's tag (release); the owner
//     reads the row after arrived() (acquire) saw the current tag. Each (token, k) slot has
//     exactly one writer per call: the rank owning expert topk_idx[t][k], and within it the one
//     worker that ships the tile holding that row.
//  3. Reuse across calls. Records are double-buffered by call parity. A shipper writing half
//     h = seq&1 of owner O in call seq could only clobber O's call seq-2, so before its first
//     write to O in a call it waits (acquire) until O's `released` word, which O stores
//     (release) after its reduction of call n has read every record, says call seq-2 is done.
//     That is a point-to-point wait on one peer, not a barrier, and it almost never waits: O
//     finished seq-2 long ago unless it is a full call behind. Everything else (plan, in_/out_
//     buffers, ready tags) is private to the rank and only touched inside WorkerTeam::run,
//     whose completion (done counter, release/acquire) orders one run's writes before the next.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>

#include "core/bf16.hpp"
#include "core/local_array.hpp"
#include "core/wait.hpp"
#include "backend/cpu/tags.hpp"
#include "ep/protocol.hpp"
#include "backend/cpu/worker_team.hpp"
#include "ubep/error.hpp"
#include "ubep/moe.hpp"

namespace ubep::moe {

const char* schedule_name(Schedule s) { return s == Schedule::kSerial ? "serial" : "overlapped"; }
Schedule parse_schedule(const std::string& n) {
  if (n == "serial") return Schedule::kSerial;
  if (n == "overlapped") return Schedule::kOverlapped;
  throw InvalidArgument("unknown schedule '" + n + "' (expected serial or overlapped)");
}

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

ExpertLayerConfig checked(const Group& g, ExpertLayerConfig c) {
  UBEP_CHECK_ARG(c.max_tokens_per_rank >= 1 && c.max_tokens_per_rank < (int64_t{1} << 30),
                 "ExpertLayer: max_tokens_per_rank must be in [1, 2^30), got ",
                 c.max_tokens_per_rank);
  UBEP_CHECK_ARG(c.hidden >= 1, "ExpertLayer: hidden must be >= 1, got ", c.hidden);
  UBEP_CHECK_ARG(c.dtype == DType::kBF16 || c.dtype == DType::kFP32,
                 "ExpertLayer: dtype must be bf16 or fp32, got ", dtype_name(c.dtype));
  UBEP_CHECK_ARG(c.num_experts >= 1 && c.num_experts % g.size() == 0, "ExpertLayer: num_experts ",
                 c.num_experts, " must be a positive multiple of the group size ", g.size());
  UBEP_CHECK_ARG(c.max_topk >= 1 && c.max_topk <= 64,
                 "ExpertLayer: max_topk must be in [1, 64], got ", c.max_topk);
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

using RecordFormat = ep::TileRecordFormat;  // the wire format lives in src/ep/protocol.hpp
using Record = ep::TileRecord;

// Per-member counters, padded so members never share a cache line.
struct alignas(64) MemberStats {
  double compute = 0, gather = 0, copy = 0, idle = 0, finish = 0;
  int64_t segments = 0;
};

}  // namespace

struct ExpertLayer::Impl {
  Group& group;
  ExpertLayerConfig cfg;
  int rank, ranks, local_experts;
  int64_t T, H;
  size_t es;
  RecordFormat fmt;
  std::unique_ptr<SharedWindow> window;
  cpu::WorkerTeam team;
  WaitPolicy wait;
  uint64_t seq;        // sequence number of the current call (tags, parity)
  uint64_t calls = 0;  // calls completed by this rank (for `released`)

  // Plan of the current call.
  std::vector<Tile> tiles;
  std::vector<OwnerGroup> groups;                 // remote groups only, in schedule order
  std::vector<int> order;                         // compute order of tile indices
  std::vector<int64_t> arow_src;                  // aligned row -> dispatched row, -1 = padding
  std::vector<int64_t> arow_slot;                 // aligned row -> owner slot t*max_topk + k
  std::vector<std::vector<int64_t>> expert_rows;  // per expert: aligned rows in dispatch order
  int64_t max_aligned = 0;
  LocalArray in_, out_;              // [max_aligned, H] fp32
  std::unique_ptr<ep::Tag[]> ready;  // per tile
  size_t max_tiles = 0;
  std::atomic<uint32_t> published{0};
  std::atomic<int> next_tile{0};
  std::atomic<bool> abort{false};
  std::vector<MemberStats> mstats;

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
        team(cfg.compute_workers + cfg.comm_workers - 1),
        seq(cfg.initial_epoch) {
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
    ready = std::make_unique<ep::Tag[]>(max_tiles);  // value-initialised: 0, no call's tag
    mstats.resize(static_cast<size_t>(team.size()));
    acc.resize(static_cast<size_t>(team.size() * H));
    y = LocalArray(static_cast<size_t>(T * H) * es);
    arow_src.resize(static_cast<size_t>(max_aligned));
    arow_slot.resize(static_cast<size_t>(max_aligned));
  }

  size_t slots() const { return static_cast<size_t>(T) * static_cast<size_t>(cfg.max_topk); }
  static size_t records_offset() { return ep::kCacheLine; }
  // Word 0 of every window: calls whose records its owner has finished reading.
  std::atomic<uint64_t>* released(int r) const {
    return static_cast<std::atomic<uint64_t>*>(window->base(r));
  }
  Record record(int owner, int half, int64_t slot) const {
    return {static_cast<char*>(window->base(owner)) + records_offset() +
                (static_cast<size_t>(half) * slots() + static_cast<size_t>(slot)) * fmt.bytes(),
            &fmt};
  }
  uint32_t tag() const { return ep::tag_of(seq); }
  int half() const { return ep::half_of(seq); }

  void plan(const DispatchResult& d);
  int64_t rows_of(int first, int n) const {
    int64_t r = 0;
    for (int i = first; i < first + n; ++i) r += tiles[static_cast<size_t>(i)].rows;
    return r;
  }
  void gather_tile(const Tile& t);
  void ship(int first_tile, int num_tiles, int owner, MemberStats& ms,
            std::vector<char>& checked_owner);
  void compute_role(int m, bool overlapped);
  void comm_role(int m, int first_member, int members, bool overlapped);
  void reduce(int64_t tokens, int K, const int64_t* idx, const float* w, int m, int members);
};

void ExpertLayer::Impl::plan(const DispatchResult& d) {
  const int64_t rows = d.num_recv_rows;
  const int K = static_cast<int>(d.recv_topk_idx.dim(1));
  const auto* idx = d.recv_topk_idx.as<const int32_t>();
  const auto* src = d.recv_src.as<const int64_t>();
  const int64_t tile = cfg.tile_rows;

  // (dispatched row, k) pairs per expert and owner, in dispatch order.
  struct Entry {
    int64_t row, slot;
  };
  std::vector<std::vector<std::vector<Entry>>> by(
      static_cast<size_t>(local_experts),
      std::vector<std::vector<Entry>>(static_cast<size_t>(ranks)));
  for (int64_t i = 0; i < rows; ++i) {
    const int owner = static_cast<int>(src[2 * i]);
    const int64_t t = src[2 * i + 1];
    UBEP_CHECK_ARG(owner >= 0 && owner < ranks && t >= 0 && t < T, "ExpertLayer: dispatched row ",
                   i, " has source (", owner, ", ", t, ") outside the group or the token capacity ",
                   T);
    for (int k = 0; k < K; ++k) {
      const int e = idx[i * K + k];
      if (e < 0) continue;
      UBEP_CHECK_ARG(e < local_experts, "ExpertLayer: dispatched row ", i, " names local expert ",
                     e, " outside [0, ", local_experts, ")");
      by[static_cast<size_t>(e)][static_cast<size_t>(owner)].push_back({i, t * cfg.max_topk + k});
    }
  }

  // Aligned layout: per expert, remote owners first (starting after this rank, so the ranks do
  // not all send to rank 0 first), each group padded to the tile height; local rows last.
  tiles.clear();
  groups.clear();
  expert_rows.assign(static_cast<size_t>(local_experts), {});
  std::vector<int64_t> remote_rows(static_cast<size_t>(local_experts), 0);
  std::vector<std::vector<OwnerGroup>> expert_groups(static_cast<size_t>(local_experts));
  std::vector<std::pair<int, int>> local_tiles(static_cast<size_t>(local_experts));  // first, count
  int64_t next_row = 0;
  for (int e = 0; e < local_experts; ++e) {
    // Row positions in dispatch order for last_outputs_latency(): fill by owner, then sort.
    std::vector<std::pair<int64_t, int64_t>> pos;  // (dispatched row, aligned row)
    for (int j = 1; j <= ranks; ++j) {
      const int owner = (rank + j) % ranks;  // j == ranks: this rank, last
      const auto& list = by[static_cast<size_t>(e)][static_cast<size_t>(owner)];
      const int first_tile = static_cast<int>(tiles.size());
      for (size_t p = 0; p < list.size(); p += static_cast<size_t>(tile)) {
        const int64_t n = std::min<int64_t>(tile, static_cast<int64_t>(list.size() - p));
        for (int64_t q = 0; q < tile; ++q) {
          const bool valid = q < n;
          arow_src[static_cast<size_t>(next_row + q)] =
              valid ? list[p + static_cast<size_t>(q)].row : -1;
          arow_slot[static_cast<size_t>(next_row + q)] =
              valid ? list[p + static_cast<size_t>(q)].slot : -1;
          if (valid) pos.emplace_back(list[p + static_cast<size_t>(q)].row, next_row + q);
        }
        tiles.push_back({e, owner, next_row, n});
        next_row += tile;
      }
      const int n_tiles = static_cast<int>(tiles.size()) - first_tile;
      if (owner == rank) {
        local_tiles[static_cast<size_t>(e)] = {first_tile, n_tiles};
      } else if (n_tiles > 0) {
        expert_groups[static_cast<size_t>(e)].push_back({first_tile, n_tiles, owner});
        remote_rows[static_cast<size_t>(e)] += static_cast<int64_t>(list.size());
      }
    }
    // Dispatch order = (source rank, token) order = dispatched row order; within one row the
    // k are ascending, which matches the latency layout's slot order (one slot per row).
    std::sort(pos.begin(), pos.end());
    for (auto& p : pos) expert_rows[static_cast<size_t>(e)].push_back(p.second);
  }

  // Schedule: remote tiles of every expert (experts with more remote rows first), then the
  // local tiles. The ablation keeps expert-id order, every expert's tiles together.
  std::vector<int> experts(static_cast<size_t>(local_experts));
  std::iota(experts.begin(), experts.end(), 0);
  order.clear();
  if (cfg.remote_first) {
    std::stable_sort(experts.begin(), experts.end(), [&](int a, int b) {
      return remote_rows[static_cast<size_t>(a)] > remote_rows[static_cast<size_t>(b)];
    });
    for (int e : experts)
      for (const auto& g : expert_groups[static_cast<size_t>(e)]) {
        groups.push_back(g);
        for (int i = 0; i < g.num_tiles; ++i) order.push_back(g.first_tile + i);
      }
    for (int e : experts) {
      auto [f, n] = local_tiles[static_cast<size_t>(e)];
      for (int i = 0; i < n; ++i) order.push_back(f + i);
    }
  } else {
    for (int e : experts) {
      auto [f, n] = local_tiles[static_cast<size_t>(e)];
      for (int i = 0; i < n; ++i) order.push_back(f + i);
      for (const auto& g : expert_groups[static_cast<size_t>(e)]) {
        groups.push_back(g);
        for (int i = 0; i < g.num_tiles; ++i) order.push_back(g.first_tile + i);
      }
    }
  }

  stats = LayerStats{};
  for (const auto& t : tiles) {
    stats.rows += t.rows;
    if (t.owner != rank) {
      stats.remote_rows += t.rows;
      ++stats.remote_tiles;
    }
  }
  stats.padded_rows = next_row;
  stats.tiles = static_cast<int64_t>(tiles.size());
}

void ExpertLayer::Impl::gather_tile(const Tile& t) {
  float* dst = in_.get<float>() + t.begin * H;
  for (int64_t q = 0; q < t.rows; ++q) {
    const int64_t row = arow_src[static_cast<size_t>(t.begin + q)];
    const char* s = recv_x + static_cast<size_t>(row) * fmt.row_bytes;
    float* o = dst + q * H;
    if (cfg.dtype == DType::kBF16) {
      const auto* v = reinterpret_cast<const uint16_t*>(s);
      for (int64_t h = 0; h < H; ++h) o[h] = bf16_to_float(v[h]);
    } else {
      std::memcpy(o, s, static_cast<size_t>(H) * 4);
    }
  }
}

// Writes the valid rows of tiles [first, first+n) (one owner) into the owner's window, each row
// a record whose tag is published last.
void ExpertLayer::Impl::ship(int first, int n, int owner, MemberStats& ms,
                             std::vector<char>& checked_owner) {
  if (!checked_owner[static_cast<size_t>(owner)]) {
    // Reuse guard (argument 3 above): the owner must have released call seq-2's records.
    const uint64_t need = calls >= 2 ? calls - 1 : 0;
    const auto t0 = Clock::now();
    wait_until([&] { return released(owner)->load(std::memory_order_acquire) >= need; }, wait,
               [&] {
                 return detail::concat("rank ", owner,
                                       " to release the expert-layer records of call ", calls - 2);
               });
    ms.idle += us_since(t0);
    checked_owner[static_cast<size_t>(owner)] = 1;
  }
  const auto t0 = Clock::now();
  const int hf = half();
  const uint32_t tg = tag();
  for (int i = first; i < first + n; ++i) {
    const Tile& t = tiles[static_cast<size_t>(i)];
    for (int64_t q = 0; q < t.rows; ++q) {
      const int64_t a = t.begin + q;
      Record rec = record(owner, hf, arow_slot[static_cast<size_t>(a)]);
      const float* v = out_.get<float>() + a * H;
      if (cfg.dtype == DType::kBF16) {
        auto* o = reinterpret_cast<uint16_t*>(rec.row());
        for (int64_t h = 0; h < H; ++h) o[h] = float_to_bf16(v[h]);
      } else {
        std::memcpy(rec.row(), v, static_cast<size_t>(H) * 4);
      }
      cpu::publish_tag(rec.tag(), tg);
    }
  }
  ms.copy += us_since(t0);
}

void ExpertLayer::Impl::compute_role(int m, bool overlapped) {
  MemberStats& ms = mstats[static_cast<size_t>(m)];
  std::vector<char> checked_owner(static_cast<size_t>(ranks), 0);
  const auto start = Clock::now();
  const uint32_t tg = tag();
  try {
    for (;;) {
      const int o = next_tile.fetch_add(1, std::memory_order_relaxed);
      if (o >= static_cast<int>(order.size()) || abort.load(std::memory_order_relaxed)) break;
      const int ti = order[static_cast<size_t>(o)];
      const Tile& t = tiles[static_cast<size_t>(ti)];
      if (compute_hook) compute_hook(m);
      auto t0 = Clock::now();
      gather_tile(t);
      auto t1 = Clock::now();
      TileTask task;
      task.local_expert = t.expert;
      task.rows = t.rows;
      task.in = in_.get<float>() + t.begin * H;
      task.in_ld = H;
      task.out = out_.get<float>() + t.begin * H;
      task.out_ld = H;
      task.worker = m;
      task.first_row = t.begin;
      (*current_tile_fn)(task);
      auto t2 = Clock::now();
      ms.gather += std::chrono::duration<double, std::micro>(t1 - t0).count();
      ms.compute += std::chrono::duration<double, std::micro>(t2 - t1).count();
      if (!overlapped) continue;
      if (t.owner == rank) {
        // Local rows need no communication worker: the producer writes them straight into its
        // own window (the tile's epilogue).
        ship(ti, 1, rank, ms, checked_owner);
      } else {
        cpu::publish_tag(&ready[static_cast<size_t>(ti)], tg);
        published.fetch_add(1, std::memory_order_release);
        published.notify_all();
      }
    }
  } catch (...) {
    // Release the communication workers, which would otherwise wait for tiles that never come.
    abort.store(true, std::memory_order_relaxed);
    published.fetch_add(1, std::memory_order_release);
    published.notify_all();
    throw;
  }
  ms.finish = us_since(start);
}

// Ships the remote groups assigned to member m (group g goes to member first + g % members).
// Overlapped: waits for ready tags and merges every run of consecutive ready tiles of a group
// into one segment. Serial: everything is computed already; each group is one segment (and
// local tiles are shipped here too).
void ExpertLayer::Impl::comm_role(int m, int first_member, int members, bool overlapped) {
  MemberStats& ms = mstats[static_cast<size_t>(m)];
  std::vector<char> checked_owner(static_cast<size_t>(ranks), 0);
  const int me = m - first_member;
  if (!overlapped) {
    for (size_t g = static_cast<size_t>(me); g < groups.size(); g += static_cast<size_t>(members)) {
      if (ship_hook) ship_hook(me, rows_of(groups[g].first_tile, groups[g].num_tiles));
      ship(groups[g].first_tile, groups[g].num_tiles, groups[g].owner, ms, checked_owner);
      ++ms.segments;
    }
    // Local tiles, split across the members by tile index.
    for (size_t i = 0; i < tiles.size(); ++i)
      if (tiles[i].owner == rank && static_cast<int>(i % static_cast<size_t>(members)) == me)
        ship(static_cast<int>(i), 1, rank, ms, checked_owner);
    return;
  }
  const uint32_t tg = tag();
  std::vector<size_t> mine;
  std::vector<int> cursor;
  for (size_t g = static_cast<size_t>(me); g < groups.size(); g += static_cast<size_t>(members)) {
    mine.push_back(g);
    cursor.push_back(0);
  }
  size_t left = mine.size();
  while (left > 0) {
    // Snapshot before the scan: see the lost-wake-up argument at the top of the file.
    const uint32_t seen = published.load(std::memory_order_acquire);
    if (abort.load(std::memory_order_relaxed)) return;
    bool progressed = false;
    for (size_t j = 0; j < mine.size(); ++j) {
      const OwnerGroup& g = groups[mine[j]];
      int& c = cursor[j];
      if (c == g.num_tiles) continue;
      int n = 0;
      while (c + n < g.num_tiles &&
             cpu::tag_arrived(&ready[static_cast<size_t>(g.first_tile + c + n)], tg))
        ++n;
      if (n == 0) continue;
      if (ship_hook) ship_hook(me, rows_of(g.first_tile + c, n));
      ship(g.first_tile + c, n, g.owner, ms, checked_owner);
      ++ms.segments;
      c += n;
      if (c == g.num_tiles) --left;
      progressed = true;
    }
    if (!progressed && left > 0) {
      // Nothing ready: sleep until a compute worker publishes (futex; no core is burnt while
      // the producer on the same core needs it). Bounded: producers publish every tile, and an
      // aborting producer bumps the counter too.
      const auto t0 = Clock::now();
      published.wait(seen, std::memory_order_acquire);
      ms.idle += us_since(t0);
    }
  }
}

void ExpertLayer::Impl::reduce(int64_t tokens, int K, const int64_t* idx, const float* w, int m,
                               int members) {
  float* a = acc.data() + static_cast<size_t>(m) * static_cast<size_t>(H);
  MemberStats& ms = mstats[static_cast<size_t>(m)];
  const int64_t per = (tokens + members - 1) / members;
  const int64_t t0 = std::min(tokens, per * m), t1 = std::min(tokens, t0 + per);
  const int hf = half();
  const uint32_t tg = tag();
  for (int64_t t = t0; t < t1; ++t) {
    std::fill(a, a + H, 0.0f);
    for (int k = 0; k < K; ++k) {
      const int64_t e = idx[t * K + k];
      if (e < 0) continue;
      Record rec = record(rank, hf, t * cfg.max_topk + k);
      if (!cpu::tag_arrived(rec.tag(), tg)) {
        const auto w0 = Clock::now();
        wait_until([&] { return cpu::tag_arrived(rec.tag(), tg); }, wait,
                   [&] {
                     return detail::concat("expert-layer row of token ", t, " k ", k, " from rank ",
                                           e / local_experts, " (epoch tag ", tg, ")");
                   });
        ms.idle += us_since(w0);
      }
      // Same arithmetic as Buffer's latency combine: acc += w * value, fp32, ascending k.
      const float wk = w[t * K + k];
      if (cfg.dtype == DType::kBF16) {
        const auto* v = reinterpret_cast<const uint16_t*>(rec.row());
        for (int64_t h = 0; h < H; ++h) a[h] += wk * bf16_to_float(v[h]);
      } else {
        const auto* v = reinterpret_cast<const float*>(rec.row());
        for (int64_t h = 0; h < H; ++h) a[h] += wk * v[h];
      }
    }
    char* dst = y.get() + static_cast<size_t>(t * H) * es;
    if (cfg.dtype == DType::kBF16) {
      auto* o = reinterpret_cast<uint16_t*>(dst);
      for (int64_t h = 0; h < H; ++h) o[h] = float_to_bf16(a[h]);
    } else {
      std::memcpy(dst, a, static_cast<size_t>(H) * 4);
    }
  }
}

ExpertLayer::ExpertLayer(Group& group, ExpertLayerConfig config)
    : impl_(std::make_unique<Impl>(group, config)) {}
ExpertLayer::~ExpertLayer() = default;

const ExpertLayerConfig& ExpertLayer::config() const { return impl_->cfg; }
const LayerStats& ExpertLayer::last_stats() const { return impl_->stats; }
int ExpertLayer::num_local_experts() const { return impl_->local_experts; }
size_t ExpertLayer::shared_bytes() const { return impl_->window->bytes(); }
void ExpertLayer::set_ship_delay_hook(std::function<void(int, int64_t)> hook) {
  impl_->ship_hook = std::move(hook);
}
void ExpertLayer::set_compute_delay_hook(std::function<void(int)> hook) {
  impl_->compute_hook = std::move(hook);
}

TensorView ExpertLayer::run(const DispatchResult& d, const TensorView& topk_idx,
                            const TensorView& topk_weights, const TileFn& tile, Schedule schedule) {
  Impl& m = *impl_;
  const auto start = Clock::now();
  // Validate everything before touching shared memory, so bad input leaves the group usable.
  UBEP_CHECK_ARG(d.layout == Layout::kThroughput,
                 "ExpertLayer::run: needs a throughput-layout dispatch, got ",
                 layout_name(d.layout));
  UBEP_CHECK_ARG(d.recv_x.dtype == m.cfg.dtype, "ExpertLayer::run: recv_x dtype ",
                 dtype_name(d.recv_x.dtype), " differs from the layer's ", dtype_name(m.cfg.dtype));
  UBEP_CHECK_ARG(d.num_recv_rows == 0 || (d.recv_x.ndim == 2 && d.recv_x.dim(1) == m.H),
                 "ExpertLayer::run: recv_x must be [rows, ", m.H, "], got ", d.recv_x.describe());
  UBEP_CHECK_ARG(d.num_recv_rows <= static_cast<int64_t>(m.ranks) * m.T,
                 "ExpertLayer::run: ", d.num_recv_rows,
                 " dispatched rows exceed ranks * max_tokens_per_rank = ", m.ranks * m.T);
  UBEP_CHECK_ARG(d.num_recv_rows == 0 ||
                     (d.recv_topk_idx.dtype == DType::kInt32 && d.recv_topk_idx.ndim == 2 &&
                      d.recv_topk_idx.dim(1) <= m.cfg.max_topk),
                 "ExpertLayer::run: recv_topk_idx must be int32 [rows, k <= ", m.cfg.max_topk,
                 "], got ", d.recv_topk_idx.describe());
  UBEP_CHECK_ARG(topk_idx.dtype == DType::kInt64 && topk_idx.ndim == 2,
                 "ExpertLayer::run: topk_idx must be int64 "
                 "[tokens, k], got ",
                 topk_idx.describe());
  const int64_t tokens = topk_idx.dim(0);
  const int K = static_cast<int>(topk_idx.dim(1));
  UBEP_CHECK_ARG(tokens <= m.T, "ExpertLayer::run: ", tokens, " tokens exceed max_tokens_per_rank ",
                 m.T);
  UBEP_CHECK_ARG(K >= 1 && K <= m.cfg.max_topk, "ExpertLayer::run: topk ", K,
                 " outside [1, max_topk=", m.cfg.max_topk, "]");
  UBEP_CHECK_ARG(topk_weights.dtype == DType::kFP32 && topk_weights.ndim == 2 &&
                     topk_weights.dim(0) == tokens && topk_weights.dim(1) == K,
                 "ExpertLayer::run: topk_weights must be fp32 [", tokens, ", ", K, "], got ",
                 topk_weights.describe());
  const auto* idx = topk_idx.as<const int64_t>();
  for (int64_t i = 0; i < tokens * K; ++i)
    UBEP_CHECK_ARG(idx[i] >= -1 && idx[i] < m.cfg.num_experts, "ExpertLayer::run: expert id ",
                   idx[i], " at token ", i / K, ", k ", i % K, " is outside [-1, ",
                   m.cfg.num_experts, ")");
  UBEP_CHECK_ARG(static_cast<bool>(tile), "ExpertLayer::run: empty tile function");

  m.plan(d);
  m.recv_x = static_cast<const char*>(d.recv_x.data);
  m.current_tile_fn = &tile;
  m.next_tile.store(0, std::memory_order_relaxed);
  m.abort.store(false, std::memory_order_relaxed);
  for (auto& s : m.mstats) s = MemberStats{};
  const int C = m.cfg.compute_workers, M = m.cfg.comm_workers, all = C + M;
  const bool overlapped = schedule == Schedule::kOverlapped;

  if (overlapped) {
    m.team.run([&](int i) {
      if (i < C)
        m.compute_role(i, true);
      else
        m.comm_role(i, C, M, true);
    });
    double fin = 0;
    for (int i = 0; i < C; ++i) fin = std::max(fin, m.mstats[static_cast<size_t>(i)].finish);
    m.stats.compute_phase_us = fin;
  } else {
    // Compute phase on the compute workers only (the communication workers wait, as a serial
    // "GEMM, then all-to-all" program would), then every member ships.
    m.team.run([&](int i) {
      if (i < C) m.compute_role(i, false);
    });
    m.stats.compute_phase_us = us_since(start);
    const auto s0 = Clock::now();
    m.team.run([&](int i) { m.comm_role(i, 0, all, false); });
    m.stats.ship_phase_us = us_since(s0);
  }
  for (auto& s : m.mstats) {
    m.stats.compute_us += s.compute;
    m.stats.gather_us += s.gather;
    m.stats.copy_us += s.copy;
    m.stats.comm_idle_us += s.idle;
    m.stats.segments += s.segments;
    s.idle = 0;
  }

  const auto r0 = Clock::now();
  const auto* w = topk_weights.as<const float>();
  m.team.run([&](int i) { m.reduce(tokens, K, idx, w, i, all); });
  // Every member's reads of this call's records happened before run() returned: let senders
  // reuse this half two calls from now.
  m.released(m.rank)->store(m.calls + 1, std::memory_order_release);
  m.stats.reduce_us = us_since(r0);
  for (auto& s : m.mstats) m.stats.reduce_wait_us += s.idle;
  ++m.calls;
  ++m.seq;
  m.stats.total_us = us_since(start);
  return TensorView(m.y.get(), m.cfg.dtype, {tokens, m.H});
}

void ExpertLayer::last_outputs_latency(void* out, int64_t slots) const {
  const Impl& m = *impl_;
  char* o = static_cast<char*>(out);
  std::memset(o, 0, static_cast<size_t>(m.local_experts * slots * m.H) * m.es);
  for (int e = 0; e < m.local_experts; ++e) {
    const auto& rows = m.expert_rows[static_cast<size_t>(e)];
    UBEP_CHECK_ARG(static_cast<int64_t>(rows.size()) <= slots, "last_outputs_latency: expert ", e,
                   " has ", rows.size(), " rows, more than ", slots, " slots");
    for (size_t j = 0; j < rows.size(); ++j) {
      const float* v = m.out_.get<float>() + rows[j] * m.H;
      char* dst = o + static_cast<size_t>((e * slots + static_cast<int64_t>(j)) * m.H) * m.es;
      if (m.cfg.dtype == DType::kBF16) {
        auto* b = reinterpret_cast<uint16_t*>(dst);
        for (int64_t h = 0; h < m.H; ++h) b[h] = float_to_bf16(v[h]);
      } else {
        std::memcpy(dst, v, static_cast<size_t>(m.H) * 4);
      }
    }
  }
}

}  // namespace ubep::moe
