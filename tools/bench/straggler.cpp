// The straggler run: does a late rank delay the others? Rank 0 arrives D µs late at every call;
// on the other ranks we time the send phase (what a split-phase caller waits for before it can
// overlap other work) and the whole dispatch, for bsp, ubep with compact placement (a sender
// needs the lower ranks' count records, so it waits for rank 0) and ubep with per-source
// placement (it never waits). Plus compact(): the one local copy that turns per-source rows
// into dense ones.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "bench.hpp"
#include "ubep/bf16.hpp"
#include "ubep/error.hpp"

namespace ubep::tools {

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Variant {
  const char* impl;
  Algorithm algo;
  Placement placement;
};

}  // namespace

std::vector<BenchRow> run_straggler(Group& g, const BenchOptions& o) {
  UBEP_CHECK_ARG(g.size() >= 2, "--straggler-us needs at least 2 ranks, got ", g.size());
  UBEP_CHECK_ARG(o.experts % g.size() == 0, "--experts ", o.experts,
                 " must be a multiple of the rank count ", g.size());
  const size_t es = dtype_size(o.dtype);
  std::vector<char> x(static_cast<size_t>(o.tokens * o.hidden) * es);
  std::mt19937 rng(static_cast<unsigned>(o.seed * 977 + static_cast<uint64_t>(g.rank())));
  for (auto& c : x) c = static_cast<char>(rng() & 0x3f);  // finite bf16/fp32 patterns
  std::vector<int64_t> idx;
  std::vector<float> w;
  make_routing(o.tokens, o.topk, o.experts, o.routing,
               o.seed * 131 + static_cast<uint64_t>(g.rank()), &idx, &w);
  DispatchArgs args;
  args.x = TensorView(x.data(), o.dtype, {o.tokens, o.hidden});
  args.topk_idx = TensorView(idx.data(), DType::kInt64, {o.tokens, o.topk});
  args.topk_weights = TensorView(w.data(), DType::kFP32, {o.tokens, o.topk});
  args.layout = o.layout;

  const Variant variants[] = {{"bsp", Algorithm::kBsp, Placement::kCompact},
                              {"ubep-compact", Algorithm::kUbep, Placement::kCompact},
                              {"ubep-per-source", Algorithm::kUbep, Placement::kPerSource}};
  const bool late = g.rank() == 0;
  std::vector<BenchRow> rows;
  for (const Variant& v : variants) {
    BufferConfig cfg;
    cfg.max_tokens_per_rank = std::max<int64_t>(o.tokens, 1);
    cfg.hidden = o.hidden;
    cfg.dtype = o.dtype;
    cfg.num_experts = o.experts;
    cfg.max_topk = o.topk;
    cfg.num_workers = o.workers;
    cfg.algorithm = v.algo;
    cfg.placement = v.placement;
    cfg.enable_latency_layout = o.layout == Layout::kLatency;
    Buffer buf(g, cfg);
    for (double delay : o.straggler_us) {
      std::vector<double> t_send, t_all, t_compact;
      double bytes = 0;
      for (int i = 0; i < o.warmup + o.iters; ++i) {
        g.barrier();  // set-up, not part of the timed call: everyone starts together
        if (late && delay > 0)
          std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(delay));
        const auto t0 = Clock::now();
        DispatchResult r;
        double send = 0;
        if (v.algo == Algorithm::kBsp) {
          r = buf.dispatch(args);
          send = us_since(t0);
        } else {
          buf.dispatch_send(args);
          send = us_since(t0);
          r = buf.dispatch_recv();
        }
        const double all = us_since(t0);
        const auto c0 = Clock::now();
        TensorView dense = buf.compact();
        const double compact = us_since(c0);
        bytes = static_cast<double>(dense.bytes());
        // Identity expert on the dense rows; combine takes them in compact() order.
        buf.combine({dense, r.handle, /*compacted=*/true});
        if (i >= o.warmup) {  // the late rank's own times are not what we ask about
          t_send.push_back(late ? 0.0 : send);
          t_all.push_back(late ? 0.0 : all);
          t_compact.push_back(compact);
        }
      }
      char label[48];
      std::snprintf(label, sizeof label, "late=%g", delay);
      rows.push_back(make_row(g, v.impl, label, "dispatch_send", t_send, bytes));
      rows.push_back(make_row(g, v.impl, label, "dispatch", t_all, bytes));
      if (v.placement == Placement::kPerSource)
        rows.push_back(make_row(g, v.impl, label, "compact", t_compact, bytes));
    }
  }
  return rows;
}

void print_straggler_table(const Group& g, const BenchOptions& o,
                           const std::vector<BenchRow>& rows) {
  if (g.rank() != 0) return;
  std::printf(
      "ubep-bench straggler: %s on %s(%d ranks), tokens=%lld hidden=%lld topk=%d "
      "experts=%d %s layout=%s; rank 0 late by D us before every call; times on the "
      "other ranks (slowest of them per call)\n",
      o.workload.c_str(), g.kind(), g.size(), static_cast<long long>(o.tokens),
      static_cast<long long>(o.hidden), o.topk, o.experts, dtype_name(o.dtype),
      layout_name(o.layout));
  std::printf("%-17s %-12s %-14s %12s %12s\n", "impl", "late", "op", "median_us", "p99_us");
  for (const BenchRow& r : rows)
    std::printf("%-17s %-12s %-14s %12.1f %12.1f\n", r.impl.c_str(), r.variant.c_str(),
                r.op.c_str(), r.median_us, r.p99_us);
  std::fflush(stdout);
}

}  // namespace ubep::tools
