// Tile plan of one call: rows grouped so every tile has exactly one destination owner.
#include <algorithm>
#include <numeric>

#include "moe/expert_layer_impl.hpp"

namespace ubep::moe {

namespace {

using Impl = ExpertLayer::Impl;

// One (dispatched row, k) pair for a local expert: the row and the owner's (token, k) slot.
struct Entry {
  int64_t row, slot;
};
// by[expert][owner]: the pairs of each local expert and owner, in dispatch order.
using ByExpertOwner = std::vector<std::vector<std::vector<Entry>>>;

// The plan's tiles before they are ordered.
struct Layout {
  std::vector<int64_t> remote_rows;                    // per expert: rows of remote owners
  std::vector<std::vector<OwnerGroup>> expert_groups;  // per expert: its remote owners' tiles
  std::vector<std::pair<int, int>> local_tiles;        // per expert: first, count
  int64_t padded_rows = 0;
};

// The valid dispatched rows (all of recv_x, or each source's range under per-source placement)
// grouped by local expert and owner; checks every row's source and expert first.
ByExpertOwner group_rows(const Impl& m, const DispatchResult& d) {
  const int64_t rows = d.num_recv_rows;
  const int K = static_cast<int>(d.recv_topk_idx.dim(1));
  const auto* idx = d.recv_topk_idx.as<const int32_t>();
  const auto* src = d.recv_src.as<const int64_t>();
  ByExpertOwner by(static_cast<size_t>(m.local_experts),
                   std::vector<std::vector<Entry>>(static_cast<size_t>(m.ranks)));
  std::vector<int64_t> valid;
  if (d.placement == Placement::kPerSource) {
    const auto* range = d.recv_range.as<const int64_t>();
    for (int s = 0; s < m.ranks; ++s)
      for (int64_t i = range[2 * s]; i < range[2 * s] + range[2 * s + 1]; ++i) valid.push_back(i);
  } else {
    for (int64_t i = 0; i < rows; ++i) valid.push_back(i);
  }
  for (const int64_t i : valid) {
    const int owner = static_cast<int>(src[2 * i]);
    const int64_t t = src[2 * i + 1];
    UBEP_CHECK_ARG(owner >= 0 && owner < m.ranks && t >= 0 && t < m.T,
                   "ExpertLayer: dispatched row ", i, " has source (", owner, ", ", t,
                   ") outside the group or the token capacity ", m.T);
    for (int k = 0; k < K; ++k) {
      const int e = idx[i * K + k];
      if (e < 0) continue;
      UBEP_CHECK_ARG(e < m.local_experts, "ExpertLayer: dispatched row ", i, " names local expert ",
                     e, " outside [0, ", m.local_experts, ")");
      by[static_cast<size_t>(e)][static_cast<size_t>(owner)].push_back({i, t * m.cfg.max_topk + k});
    }
  }
  return by;
}

// Aligned layout: per expert, remote owners first (starting after this rank, so the ranks do
// not all send to rank 0 first), each group padded to the tile height; local rows last. Fills
// m.tiles, m.arow_src/arow_slot and m.expert_rows.
Layout lay_out_tiles(Impl& m, const ByExpertOwner& by) {
  const int64_t tile = m.cfg.tile_rows;
  m.tiles.clear();
  m.groups.clear();
  m.expert_rows.assign(static_cast<size_t>(m.local_experts), {});
  Layout out;
  out.remote_rows.assign(static_cast<size_t>(m.local_experts), 0);
  out.expert_groups.resize(static_cast<size_t>(m.local_experts));
  out.local_tiles.resize(static_cast<size_t>(m.local_experts));
  int64_t next_row = 0;
  for (int e = 0; e < m.local_experts; ++e) {
    // Row positions in dispatch order for last_outputs_latency(): fill by owner, then sort.
    std::vector<std::pair<int64_t, int64_t>> pos;  // (dispatched row, aligned row)
    for (int j = 1; j <= m.ranks; ++j) {
      const int owner = (m.rank + j) % m.ranks;  // j == ranks: this rank, last
      const auto& list = by[static_cast<size_t>(e)][static_cast<size_t>(owner)];
      const int first_tile = static_cast<int>(m.tiles.size());
      for (size_t p = 0; p < list.size(); p += static_cast<size_t>(tile)) {
        const int64_t n = std::min<int64_t>(tile, static_cast<int64_t>(list.size() - p));
        for (int64_t q = 0; q < tile; ++q) {
          const bool valid = q < n;
          m.arow_src[static_cast<size_t>(next_row + q)] =
              valid ? list[p + static_cast<size_t>(q)].row : -1;
          m.arow_slot[static_cast<size_t>(next_row + q)] =
              valid ? list[p + static_cast<size_t>(q)].slot : -1;
          if (valid) pos.emplace_back(list[p + static_cast<size_t>(q)].row, next_row + q);
        }
        m.tiles.push_back({e, owner, next_row, n});
        next_row += tile;
      }
      const int n_tiles = static_cast<int>(m.tiles.size()) - first_tile;
      if (owner == m.rank) {
        out.local_tiles[static_cast<size_t>(e)] = {first_tile, n_tiles};
      } else if (n_tiles > 0) {
        out.expert_groups[static_cast<size_t>(e)].push_back({first_tile, n_tiles, owner});
        out.remote_rows[static_cast<size_t>(e)] += static_cast<int64_t>(list.size());
      }
    }
    // Dispatch order = (source rank, token) order = dispatched row order; within one row the
    // k are ascending, which matches the latency layout's slot order (one slot per row).
    std::sort(pos.begin(), pos.end());
    for (auto& p : pos) m.expert_rows[static_cast<size_t>(e)].push_back(p.second);
  }
  out.padded_rows = next_row;
  return out;
}

// Schedule: remote tiles of every expert (experts with more remote rows first), then the local
// tiles. The ablation keeps expert-id order, every expert's tiles together. Fills m.order and
// m.groups.
void order_tiles(Impl& m, const Layout& l) {
  std::vector<int> experts(static_cast<size_t>(m.local_experts));
  std::iota(experts.begin(), experts.end(), 0);
  m.order.clear();
  const auto add_remote = [&](int e) {
    for (const auto& g : l.expert_groups[static_cast<size_t>(e)]) {
      m.groups.push_back(g);
      for (int i = 0; i < g.num_tiles; ++i) m.order.push_back(g.first_tile + i);
    }
  };
  const auto add_local = [&](int e) {
    auto [f, n] = l.local_tiles[static_cast<size_t>(e)];
    for (int i = 0; i < n; ++i) m.order.push_back(f + i);
  };
  if (m.cfg.remote_first) {
    std::stable_sort(experts.begin(), experts.end(), [&](int a, int b) {
      return l.remote_rows[static_cast<size_t>(a)] > l.remote_rows[static_cast<size_t>(b)];
    });
    for (int e : experts) add_remote(e);
    for (int e : experts) add_local(e);
  } else {
    for (int e : experts) {
      add_local(e);
      add_remote(e);
    }
  }
}

}  // namespace

void ExpertLayer::Impl::plan(const DispatchResult& d) {
  const ByExpertOwner by = group_rows(*this, d);
  const Layout layout = lay_out_tiles(*this, by);
  order_tiles(*this, layout);
  stats = LayerStats{};
  for (const auto& t : tiles) {
    stats.rows += t.rows;
    if (t.owner != rank) {
      stats.remote_rows += t.rows;
      ++stats.remote_tiles;
    }
  }
  stats.padded_rows = layout.padded_rows;
  stats.tiles = static_cast<int64_t>(tiles.size());
}

}  // namespace ubep::moe
