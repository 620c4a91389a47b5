// The compute, communication and reduce roles of the expert layer (the concurrency argument is
// at the top of expert_layer.cpp).
#include <algorithm>
#include <cstring>

#include "moe/expert_layer_impl.hpp"

namespace ubep::moe {

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

// Member m writes the valid rows of tiles [first, first+n) (one owner) into the owner's window
// through the data path, each row a record whose tag is published last.
void ExpertLayer::Impl::ship(int m, int first, int n, int owner, MemberStats& ms,
                             std::vector<char>& checked_owner) {
  if (!checked_owner[static_cast<size_t>(owner)]) {
    // Reuse guard (argument 3 in expert_layer.cpp): the owner must have released call seq-2's
    // records. Nothing to wait for in the first two calls.
    const auto t0 = Clock::now();
    if (calls >= 2)
      deaths.wait_for(
          owner, [&] { return has_released(owner, calls - 1); }, wait,
          [&] {
            return detail::concat("rank ", owner, " to release the expert-layer records of call ",
                                  calls - 2);
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
      // The wire row is the output rounded to the layer dtype: fp32 rows go as they are, bf16
      // rows are rounded into this member's staging row first (it stays in L1).
      const void* src = v;
      if (cfg.dtype != DType::kFP32) {
        dp->store_row(stage_row(m), v, cfg.dtype, H);
        src = stage_row(m);
      }
      dp->put_row(rec.row(), src, fmt.row_bytes, false);
      dp->publish(rec.tag(), tg);
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
        ship(m, ti, 1, rank, ms, checked_owner);
      } else {
        // Not held back: this member streams no rows, so the tag is stored before the counter.
        dp->publish(&ready[static_cast<size_t>(ti)], tg);
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
      ship(m, groups[g].first_tile, groups[g].num_tiles, groups[g].owner, ms, checked_owner);
      ++ms.segments;
    }
    // Local tiles, split across the members by tile index.
    for (size_t i = 0; i < tiles.size(); ++i)
      if (tiles[i].owner == rank && static_cast<int>(i % static_cast<size_t>(members)) == me)
        ship(m, static_cast<int>(i), 1, rank, ms, checked_owner);
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
             dp->arrived(&ready[static_cast<size_t>(g.first_tile + c + n)], tg))
        ++n;
      if (n == 0) continue;
      if (ship_hook) ship_hook(me, rows_of(g.first_tile + c, n));
      ship(m, g.first_tile + c, n, g.owner, ms, checked_owner);
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
      if (!dp->arrived(rec.tag(), tg)) {
        const auto w0 = Clock::now();
        const int from = static_cast<int>(e / local_experts);
        deaths.wait_for(
            from, [&] { return dp->arrived(rec.tag(), tg); }, wait,
            [&] {
              return detail::concat("expert-layer row of token ", t, " k ", k, " from rank ", from,
                                    " (epoch tag ", tg, ")");
            });
        ms.idle += us_since(w0);
      }
      // Buffer's latency combine, the same kernel: acc += w * value, fp32, ascending k.
      dp->accumulate_row(a, rec.row(), cfg.dtype, H, &w[t * K + k]);
    }
    dp->store_row(y.get() + static_cast<size_t>(t * H) * es, a, cfg.dtype, H);
  }
}

}  // namespace ubep::moe
