// The expert-layer test harness (moe_harness.hpp).
#include "moe_harness.hpp"

#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

namespace ubep::moe::test {

TileFn test_tile_fn(int rank, int local_experts, int64_t H) {
  return [=](const TileTask& t) {
    const int ge = rank * local_experts + t.local_expert;
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t h = 0; h < H; ++h)
        t.out[r * t.out_ld + h] = expert_value(t.in + r * t.in_ld, h, H, ge);
  };
}

RankData make_rank(RouterMode mode, int experts, int topk, int64_t tokens, int64_t H, DType dt,
                   uint64_t seed) {
  RankData d;
  d.tokens = tokens;
  d.topk = topk;
  RouterOutput r = route(mode, experts, topk, tokens, seed);
  d.idx = r.topk_idx;
  d.w = r.topk_weights;
  // Some "not selected" slots, as a capacity-dropping router produces.
  std::mt19937_64 rng(seed + 99);
  for (auto& e : d.idx)
    if (rng() % 11 == 0) e = -1;
  d.x.resize(static_cast<size_t>(tokens * H) * dtype_size(dt));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int64_t i = 0; i < tokens * H; ++i) store(d.x.data(), i, u(rng), dt);
  return d;
}

std::vector<char> reference_y(const std::vector<RankData>& all, int me, int64_t H, DType dt) {
  const RankData& d = all[static_cast<size_t>(me)];
  std::vector<char> y(static_cast<size_t>(d.tokens * H) * dtype_size(dt));
  std::vector<float> row(static_cast<size_t>(H)), acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < d.tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) row[static_cast<size_t>(h)] = load(d.x.data(), t * H + h, dt);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < d.topk; ++k) {
      const int64_t e = d.idx[static_cast<size_t>(t * d.topk + k)];
      if (e < 0) continue;
      const float w = d.w[static_cast<size_t>(t * d.topk + k)];
      for (int64_t h = 0; h < H; ++h)
        acc[static_cast<size_t>(h)] +=
            w * stored(expert_value(row.data(), h, H, static_cast<int>(e)), dt);
    }
    for (int64_t h = 0; h < H; ++h) store(y.data(), t * H + h, acc[static_cast<size_t>(h)], dt);
  }
  return y;
}

std::string describe(const Case& c) {
  std::ostringstream os;
  os << "ranks=" << c.ranks << " experts=" << c.experts << " topk=" << c.topk << " H=" << c.H
     << " dtype=" << dtype_name(c.dtype) << " cap=" << c.capacity
     << " mode=" << router_mode_name(c.mode) << " tile=" << c.tile << " cw=" << c.compute_workers
     << " mw=" << c.comm_workers << " remote_first=" << c.remote_first << " seed=" << c.seed
     << " epoch0=" << c.initial_epoch << " serial=" << c.serial
     << " compute_delay_us=" << c.compute_delay_us;
  return os.str();
}

void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  std::mutex mu;
  run_on_threads(c.ranks, [&](Group& g) {
    BufferConfig bc;
    bc.max_tokens_per_rank = c.capacity;
    bc.hidden = c.H;
    bc.dtype = c.dtype;
    bc.num_experts = c.experts;
    bc.max_topk = c.topk;
    bc.algorithm = Algorithm::kUbep;
    // last_outputs_latency() writes each expert's rows from slot 0: the compact placement.
    bc.placement = Placement::kCompact;
    Buffer buffer(g, bc);
    ExpertLayerConfig lc;
    lc.max_tokens_per_rank = c.capacity;
    lc.hidden = c.H;
    lc.dtype = c.dtype;
    lc.num_experts = c.experts;
    lc.max_topk = c.topk;
    lc.compute_workers = c.compute_workers;
    lc.comm_workers = c.comm_workers;
    lc.tile_rows = c.tile;
    lc.remote_first = c.remote_first;
    lc.initial_epoch = c.initial_epoch;
    ExpertLayer layer(g, lc);
    const int El = layer.num_local_experts();
    if (c.delays) {
      auto rng = std::make_shared<std::mt19937_64>(c.seed * 31 + static_cast<uint64_t>(g.rank()));
      auto rmu = std::make_shared<std::mutex>();
      auto delay = [rng, rmu](int) {
        uint64_t r;
        {
          std::lock_guard<std::mutex> l(*rmu);
          r = (*rng)();
        }
        if (r % 4 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(r % 200));
        else if (r % 4 == 1)
          std::this_thread::yield();
      };
      layer.set_compute_delay_hook(delay);
      layer.set_ship_delay_hook([delay](int w, int64_t) { delay(w); });
    } else if (c.compute_delay_us > 0) {
      const auto pause = std::chrono::microseconds(c.compute_delay_us);
      layer.set_compute_delay_hook([pause](int) { std::this_thread::sleep_for(pause); });
    }
    const TileFn fn = test_tile_fn(g.rank(), El, c.H);
    for (int call = 0; call < c.calls; ++call) {
      // Every rank builds every rank's inputs (same seeds), so each can compute its reference.
      std::vector<RankData> all;
      std::mt19937_64 trng(c.seed * 1000 + static_cast<uint64_t>(call));
      for (int r = 0; r < c.ranks; ++r) {
        const int64_t tokens =
            c.random_tokens ? static_cast<int64_t>(trng() % static_cast<uint64_t>(c.capacity + 1))
                            : c.capacity;
        all.push_back(make_rank(c.mode, c.experts, c.topk, tokens, c.H, c.dtype,
                                c.seed * 7919 + static_cast<uint64_t>(call * 131 + r)));
      }
      const RankData& me = all[static_cast<size_t>(g.rank())];
      DispatchArgs a;
      a.x = TensorView(me.x.data(), c.dtype, {me.tokens, c.H});
      a.topk_idx = TensorView(me.idx.data(), DType::kInt64, {me.tokens, c.topk});
      a.topk_weights = TensorView(me.w.data(), DType::kFP32, {me.tokens, c.topk});
      a.layout = Layout::kThroughput;
      const std::vector<char> want = reference_y(all, g.rank(), c.H, c.dtype);

      DispatchResult d = buffer.dispatch(a);
      if (c.serial) {
        TensorView ys = layer.run(d, a.topk_idx, a.topk_weights, fn, Schedule::kSerial);
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(same_bits(ys, want))
            << "serial differs from the reference, rank " << g.rank() << " call " << call;
      }
      TensorView yo = layer.run(d, a.topk_idx, a.topk_weights, fn, Schedule::kOverlapped);
      std::unique_lock<std::mutex> lock(mu);
      EXPECT_TRUE(same_bits(yo, want))
          << "overlapped differs from the reference, rank " << g.rank() << " call " << call;
      EXPECT_EQ(yo.dim(0), me.tokens);
      const LayerStats& st = layer.last_stats();
      EXPECT_EQ(st.padded_rows % c.tile, 0);
      EXPECT_GE(st.segments, 0);
      EXPECT_LE(st.segments, st.remote_tiles);
      if (!c.check_buffer_latency) continue;
      lock.unlock();
      // Cross-check with the library's latency combine fed with the layer's expert outputs.
      a.layout = Layout::kLatency;
      DispatchResult dl = buffer.dispatch(a);
      const int64_t slots = dl.recv_x.dim(1);
      std::vector<char> outs(static_cast<size_t>(El * slots * c.H) * dtype_size(c.dtype));
      layer.last_outputs_latency(outs.data(), slots);
      CombineArgs ca;
      ca.handle = dl.handle;
      ca.x = TensorView(outs.data(), c.dtype, {El, slots, c.H});
      TensorView yl = buffer.combine(ca);
      lock.lock();
      EXPECT_TRUE(same_bits(yl, want))
          << "Buffer latency combine differs, rank " << g.rank() << " call " << call;
    }
  });
}

}  // namespace ubep::moe::test
