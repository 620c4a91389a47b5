// Names, traffic, row sizes and the per-call preset of ubep-sim's call model (call_sim.cpp
// simulates the call itself).
#include "sim/call.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/enum_names.hpp"
#include "sim/rates.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

namespace {
constexpr detail::EnumName<Algo> kAlgos[] = {{Algo::kBsp, "bsp"}, {Algo::kUbep, "ubep"}};
constexpr detail::EnumName<Op> kOps[] = {{Op::kDispatch, "dispatch"}, {Op::kCombine, "combine"}};
constexpr detail::EnumName<Sync> kSyncs[] = {{Sync::kFused, "fused"},
                                             {Sync::kStopAndWait, "stop-and-wait", "stop_and_wait"},
                                             {Sync::kSentinel, "sentinel"},
                                             {Sync::kSentinelDeferred, "sentinel-deferred"}};
}  // namespace

const char* algo_name(Algo a) { return detail::enum_name(kAlgos, a); }
const char* op_name(Op o) { return detail::enum_name(kOps, o); }
const char* sync_name(Sync s) { return detail::enum_name(kSyncs, s); }
Algo parse_algo(const std::string& s) { return detail::parse_enum(kAlgos, s, "algorithm"); }
Sync parse_sync(const std::string& s) { return detail::parse_enum(kSyncs, s, "sync mode"); }

Traffic draw_traffic(int ranks, int experts, int topk, int64_t tokens, int hot_experts,
                     double hot_weight, uint64_t seed) {
  sched::RoutingConfig rc;
  rc.ranks = ranks;
  rc.experts = experts;
  rc.topk = topk;
  rc.hot_experts = hot_experts;
  rc.hot_weight = hot_experts > 0 ? hot_weight : 1.0;
  rc.tokens_per_rank = static_cast<int>(tokens);
  rc.seed = seed;
  Traffic t{ranks, experts, topk, tokens, {}};
  t.ids.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) t.ids.push_back(sched::draw_routing(rc, r));
  return t;
}

double row_payload_bytes(Op op, int hidden, int elem_bytes, int topk) {
  const double row = static_cast<double>(hidden) * elem_bytes;
  // protocol.hpp token record: row, then src token + topk (8 B), then K x (expert, slot, weight).
  return op == Op::kDispatch ? row + 8.0 + 12.0 * topk : row;
}

double wire_bytes(double payload, Algo algo, Sync sync, const CostParams& c) {
  if (algo == Algo::kUbep && sync == Sync::kFused)
    return std::ceil(payload / c.fused_payload_bytes) * c.fused_unit_bytes;
  return payload;
}

namespace {

// Rows one rank sends in this call (dispatch; combine sends the same rows back): the largest
// over ranks. Latency layout: one row per (token, k); throughput: per (token, destination rank).
double rows_per_rank(const Traffic& t, bool latency_layout, int ranks) {
  const int El = std::max(1, t.experts / std::max(1, ranks));
  double most = 0;
  std::vector<int> seen(static_cast<size_t>(ranks), -1);
  for (const auto& ids : t.ids) {
    double rows = 0;
    for (int64_t tok = 0; tok < t.tokens_per_rank; ++tok)
      for (int k = 0; k < t.topk; ++k) {
        const int32_t e = ids[static_cast<size_t>(tok * t.topk + k)];
        if (e < 0) continue;
        const int d = e / El;
        if (latency_layout) {
          rows += 1;
        } else if (seen[static_cast<size_t>(d)] != tok) {
          seen[static_cast<size_t>(d)] = static_cast<int>(tok);
          rows += 1;
        }
      }
    std::fill(seen.begin(), seen.end(), -1);
    most = std::max(most, rows);
  }
  return most;
}

// The call's rates from the memory streams it drives (rates.hpp), when the calibration recorded
// them; otherwise the nearest set's rates stay.
void apply_memory_streams(CostParams& c, const CallConfig& cfg, const Traffic& t, double bytes) {
  if (c.l2_bytes <= 0 || c.rate_sets.size() != 2) return;
  const CostParams::RateSet& a = c.rate_sets[0];
  const CostParams::RateSet& b = c.rate_sets[1];
  if (a.source_bytes <= 0 || b.source_bytes <= 0 || a.output_bytes <= 0 || b.output_bytes <= 0)
    return;
  const double row = static_cast<double>(cfg.hidden) * cfg.elem_bytes;
  const double tokens_bytes = static_cast<double>(t.tokens_per_rank) * row;
  // A source stays in the largest cache that holds it for its core: the L2, or the share of the
  // shared cache that re-reads run from (measured; on this Zen 4 host decode's 1.8 MB of
  // tokens exceed the 1 MiB L2 but stay in L3 for all their 8 copies).
  const double source_cache = std::max(c.l2_bytes, c.reuse_bytes);
  auto solve = [&](double CostParams::RateSet::*rate, double CostParams::RateSet::*second,
                   bool source) {
    auto other = [&](const CostParams::RateSet& s) {
      return source ? source_read_bytes(s.source_bytes, s.bytes, source_cache) : s.*second;
    };
    return solve_two_stream(a.bytes, other(a), a.bytes / (a.*rate), b.bytes, other(b),
                            b.bytes / (b.*rate));
  };
  using RS = CostParams::RateSet;
  const TwoStreamCost stream = solve(&RS::stream_GBps, nullptr, true);
  const TwoStreamCost reduce = solve(&RS::reduce_GBps, &RS::output_bytes, false);
  const TwoStreamCost staged = solve(&RS::staged_reduce_GBps, &RS::output_bytes, false);
  if (stream.valid)
    c.stream_GBps =
        two_stream_rate(stream, bytes, source_read_bytes(tokens_bytes, bytes, source_cache));
  if (reduce.valid) c.reduce_GBps = two_stream_rate(reduce, bytes, tokens_bytes);
  if (staged.valid) c.staged_reduce_GBps = two_stream_rate(staged, bytes, tokens_bytes);
  // Plain copies (bsp's staging) out of cache run at the rate of the calibrated shape of the
  // call's layout: a latency-layout call's rows sit one per slot of per-expert regions of ranks x
  // max_tokens slots (dispatch_call.hpp), scattered over the window, a throughput-layout call's
  // are contiguous per source, and a plain copy of scattered 14 KB rows runs slower than of
  // contiguous ones at any size beyond the cache (ubep-bench's bsp "row send", 2026-12-04:
  // latency 4.2-7.9 GB/s per core at 7-15 MB, throughput 7.7-11.5 at 15-117 MB, unseen shapes
  // included: how the cause was found; the rates used are the calibrated shapes'). Without a set
  // of the call's layout, by size between the two sets. Calibrations without a reuse capacity
  // also blend in the small call's rate with log(bytes); with one, the cache's share comes from
  // it (below).
  std::vector<std::pair<double, double>> copy_points;
  for (const CostParams::RateSet& s : c.rate_sets)
    if (s.latency_layout == cfg.latency_layout) copy_points.emplace_back(s.bytes, s.copy_GBps);
  if (copy_points.empty())
    for (const CostParams::RateSet& s : c.rate_sets) copy_points.emplace_back(s.bytes, s.copy_GBps);
  if (c.cache_copy_GBps > 0 && c.cache_bytes > 0 && c.reuse_bytes <= 0)
    copy_points.emplace_back(c.cache_bytes, c.cache_copy_GBps);
  const double copy = log_interpolate(copy_points, bytes);
  c.worker_GBps = c.local_copy_GBps = copy;
  c.rate_set += "+streams";
  // Shared-cache residency: the rows a call reads were written just before (by the expert, by
  // bsp's staging copy, by the previous call on these window halves); the share of them the
  // cache still holds (rates.hpp resident_share, from the measured reuse capacity) is read at
  // the rates the library's calls reached on the 2 MiB call, the rest at the call's own
  // out-of-cache rates. Between the 2 MiB call and the smallest calibrated shape above it only:
  // that shape's measured rates already hold its own share, and larger calls' rates come from
  // it and the next. The streamed dispatch too: non-temporal stores into lines the cache still
  // holds are not those into lines it does not (the 2 MiB call's dispatch, 2026-12-04: 84-119
  // us in the rounds whose combine ran 80-107, 150 us in those whose combine ran 52; ubep-bench's
  // 32-token case alike, run to run), and the small call measured whichever held.
  if (c.reuse_bytes <= 0 || c.cache_bytes <= 0) return;
  double above = 0;  // the smallest calibrated shape larger than the 2 MiB call
  for (const CostParams::RateSet& s : c.rate_sets)
    if (s.bytes > c.cache_bytes && (above <= 0 || s.bytes < above)) above = s.bytes;
  if (above <= 0 || bytes >= above) return;
  const double cached = resident_share(c.reuse_bytes, c.cache_bytes, above, bytes);
  c.stream_GBps = blend_rate(cached, c.cache_stream_GBps, c.stream_GBps);
  c.reduce_GBps = blend_rate(cached, c.cache_reduce_GBps, c.reduce_GBps);
  c.staged_reduce_GBps = blend_rate(cached, c.cache_staged_reduce_GBps, c.staged_reduce_GBps);
  c.worker_GBps = c.local_copy_GBps = blend_rate(cached, c.cache_copy_GBps, c.local_copy_GBps);
  c.rate_set += detail::concat("+cached", std::lround(100 * cached), "%");
}

}  // namespace

double received_bytes(const Preset& preset, const CallConfig& cfg, const Traffic& traffic) {
  return rows_per_rank(traffic, cfg.latency_layout, preset.topology.ranks()) *
         row_payload_bytes(cfg.op, cfg.hidden, cfg.elem_bytes, traffic.topk);
}

Preset effective_preset(const Preset& preset, const CallConfig& cfg, const Traffic& traffic) {
  Preset p = preset;
  CostParams& c = p.cost;
  const double bytes = received_bytes(preset, cfg, traffic);
  if (!c.rate_sets.empty()) {
    const CostParams::RateSet* best = nullptr;
    for (const auto& s : c.rate_sets)
      if (!best || std::abs(std::log(std::max(bytes, 1.0) / s.bytes)) <
                       std::abs(std::log(std::max(bytes, 1.0) / best->bytes)))
        best = &s;
    c.worker_GBps = best->copy_GBps;
    c.local_copy_GBps = best->copy_GBps;
    c.stream_GBps = best->stream_GBps;
    c.reduce_GBps = best->reduce_GBps;
    c.staged_reduce_GBps = best->staged_reduce_GBps;
    c.rate_set = best->name;
    apply_memory_streams(c, cfg, traffic, bytes);
    const int R = preset.topology.ranks();
    if (c.cores > 0 && R > c.cores) {
      c.core_share = 1.0 / oversubscribed_ratio(c.oversubscribed_ratio, R, c.cores);
      c.worker_GBps *= c.core_share;
      c.local_copy_GBps *= c.core_share;
      c.stream_GBps *= c.core_share;
      c.reduce_GBps *= c.core_share;
      c.staged_reduce_GBps *= c.core_share;
    }
  }
  // Dispatch row copies of large calls: non-temporal stores.
  if (cfg.op == Op::kDispatch && c.stream_threshold_bytes > 0 &&
      bytes >= c.stream_threshold_bytes && c.stream_GBps > 0)
    c.worker_GBps = c.stream_GBps;
  return p;
}

void CallProgress::report(uint64_t simulated, uint64_t planned) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (elapsed < 2 || elapsed < last + 2) return;
  last = elapsed;
  const double done =
      static_cast<double>(simulated) / static_cast<double>(planned > 0 ? planned : 1);
  std::fprintf(stderr, "[call] %llu of %llu items, %.0f s, ETA %.0f s\n",
               static_cast<unsigned long long>(simulated), static_cast<unsigned long long>(planned),
               elapsed, elapsed * (1 - done) / (done > 1e-9 ? done : 1e-9));
}

}  // namespace ubep::sim
