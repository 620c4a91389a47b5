// Tile plan of one call: rows grouped so every tile has exactly one destination owner.
#include <algorithm>
#include <numeric>

#include "moe/expert_layer_impl.hpp"

namespace ubep::moe {

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
  // The valid rows: all of recv_x (compact) or each source's range (per-source placement).
  std::vector<int64_t> valid;
  if (d.placement == Placement::kPerSource) {
    const auto* range = d.recv_range.as<const int64_t>();
    for (int s = 0; s < ranks; ++s)
      for (int64_t i = range[2 * s]; i < range[2 * s] + range[2 * s + 1]; ++i) valid.push_back(i);
  } else {
    for (int64_t i = 0; i < rows; ++i) valid.push_back(i);
  }
  for (const int64_t i : valid) {
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

}  // namespace ubep::moe
