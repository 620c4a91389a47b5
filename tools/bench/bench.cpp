#include "bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include "protocol/protocol.hpp"
#include "ubep/baseline.hpp"
#include "ubep/bf16.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"
#include "ubep/scheduler.hpp"
#include "workload.hpp"

namespace ubep::tools {

void BenchOptions::apply_workload(const std::string& name) {
  workload = name;
  hidden = 7168;
  topk = 8;
  experts = 256;
  dtype = DType::kBF16;
  if (name == "decode") {
    tokens = 128;
    layout = Layout::kLatency;
    // Per slice: a combine's time came back to its steady state 30-80 calls after the bound
    // harness's slice (bench_slices); 60 warm-up calls cost 0.2-0.3 s a slice.
    warmup = 60;
  } else if (name == "prefill") {
    tokens = 4096;
    layout = Layout::kThroughput;
    iters = 10;
    warmup = 2;
  } else if (name == "tiny") {
    tokens = 1;
    layout = Layout::kLatency;
    iters = 500;
    warmup = 50;
  } else {
    throw InvalidArgument("unknown workload '" + name + "' (expected decode, prefill or tiny)");
  }
}

void make_routing(int64_t tokens, int topk, int experts, const std::string& routing, uint64_t seed,
                  std::vector<int64_t>* idx, std::vector<float>* weights) {
  UBEP_CHECK_ARG(routing == "uniform" || routing == "hot", "unknown routing '", routing,
                 "' (expected uniform or hot)");
  UBEP_CHECK_ARG(topk <= experts, "topk ", topk, " exceeds the number of experts ", experts);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> w(0.05f, 1.0f);
  idx->clear();
  weights->clear();
  const int hot = std::min(8, experts);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int64_t> chosen;
    while (static_cast<int>(chosen.size()) < topk) {
      int64_t e = static_cast<int64_t>(rng() % static_cast<uint64_t>(experts));
      // "hot": half of the picks go to 8 hot experts spread over the ranks.
      if (routing == "hot" && rng() % 2 == 0)
        e = static_cast<int64_t>(rng() % static_cast<uint64_t>(hot)) * (experts / hot);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int64_t e : chosen) {
      idx->push_back(e);
      weights->push_back(w(rng));
    }
  }
}

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Gathers per-iteration times from every rank; the call time of an iteration is the slowest rank's.
std::vector<double> slowest_per_iter(Group& g, const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * static_cast<size_t>(g.size()));
  g.allgather(mine.data(), all.data(), mine.size() * sizeof(double));
  std::vector<double> out(mine.size(), 0.0);
  for (int r = 0; r < g.size(); ++r)
    for (size_t i = 0; i < mine.size(); ++i)
      out[i] = std::max(out[i], all[static_cast<size_t>(r) * mine.size() + i]);
  return out;
}

}  // namespace

double mean_over_ranks(Group& g, double v) {
  std::vector<double> all(static_cast<size_t>(g.size()));
  g.allgather(&v, all.data(), sizeof v);
  double s = 0;
  for (double x : all) s += x;
  return s / static_cast<double>(g.size());
}

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1,
               static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - (p > 0 ? 1 : 0));
  return v[i];
}

class Progress {
 public:
  Progress(const Group& g, bool quiet) : on_(g.rank() == 0 && !quiet), start_(Clock::now()) {}
  void update(const std::string& what, int i, int n) {
    if (!on_) return;
    const double s = us_since(start_) / 1e6;
    if (s < 3.0 || s - last_ < 1.0) return;
    last_ = s;
    std::fprintf(stderr, "\r[ubep-bench %5.1fs] %s %d/%d   ", s, what.c_str(), i, n);
    shown_ = true;
  }
  ~Progress() {
    if (shown_) std::fprintf(stderr, "\r%60s\r", "");
  }

 private:
  bool on_;
  Clock::time_point start_;
  double last_ = 0;
  bool shown_ = false;
};

}  // namespace

BenchRow make_row(Group& g, const std::string& impl, const std::string& variant,
                  const std::string& op, const std::vector<double>& times, double bytes) {
  BenchRow r;
  r.impl = impl;
  r.variant = variant;
  r.op = op;
  const auto slow = slowest_per_iter(g, times);
  r.median_us = percentile(slow, 0.5);
  r.p99_us = percentile(slow, 0.99);
  r.bytes = mean_over_ranks(g, bytes);
  r.gbps = r.median_us > 0 ? r.bytes / (r.median_us * 1e3) : 0;
  return r;
}

namespace {
uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Every implementation was given the same inputs and, by the library's contract, returns the
// same bits (the baselines over any exchange included): a row of timings whose y differs from
// the first implementation's on any rank is not a comparison, so the run fails naming it.
template <class Measurements>
void check_same_results(Group& g, const Measurements& ms) {
  int differs = -1;  // index of the first implementation whose y differs here
  for (size_t k = 1; k < ms.size() && differs < 0; ++k)
    if (ms[k]->y_hash != 0 && ms[0]->y_hash != 0 && ms[k]->y_hash != ms[0]->y_hash)
      differs = static_cast<int>(k);
  std::vector<int> all(static_cast<size_t>(g.size()));
  g.allgather(&differs, all.data(), sizeof differs);
  for (int r = 0; r < g.size(); ++r)
    UBEP_CHECK(all[static_cast<size_t>(r)] < 0, SystemError, "ubep-bench: on rank ", r, ", ",
               ms[static_cast<size_t>(all[static_cast<size_t>(r)])]->impl,
               "'s combine output differs from ", ms[0]->impl,
               "'s for the same inputs: its timings compare different work");
}
}  // namespace

namespace {
std::map<std::string, ExchangeMaker>& exchanges() {
  static std::map<std::string, ExchangeMaker> registered;  // filled by main before any run
  return registered;
}
std::unique_ptr<BulkExchange> make_exchange(const std::string& name, Group& g) {
  const auto it = exchanges().find(name);
  UBEP_CHECK_ARG(it != exchanges().end(), "--algo ", name, ": this ubep-bench was built without ",
                 name,
                 " (oneccl: configure with -DUBEP_ONECCL_ROOT=<prefix of PyPI's "
                 "oneccl-cpu-devel>, docs/INTEGRATIONS.md)");
  return it->second(g);
}
}  // namespace

void register_exchange(const std::string& name, ExchangeMaker make) {
  exchanges()[name] = std::move(make);
}

std::vector<Slice> bench_slices(int iters, int rounds, int warmup) {
  UBEP_CHECK_ARG(iters >= 0 && rounds >= 1 && warmup >= 0, "bench slices: iters ", iters,
                 ", rounds ", rounds, ", warmup ", warmup);
  const int n = std::max(1, std::min(rounds, iters));
  std::vector<Slice> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    out[static_cast<size_t>(r)] = {warmup, iters * (r + 1) / n - iters * r / n};
  return out;
}

int bound_warmup(int slice, int warmup) { return slice == 0 ? warmup : std::min(warmup, 2); }

std::vector<BenchRow> run_bench(Group& g, const BenchOptions& o) {
  UBEP_CHECK_ARG(o.iters >= 1, "--iters must be >= 1, got ", o.iters);
  UBEP_CHECK_ARG(o.experts % g.size() == 0, "--experts ", o.experts,
                 " must be a multiple of the rank count ", g.size());
  Input in = make_input(g, o);
  BufferConfig cfg;
  cfg.max_tokens_per_rank = std::max<int64_t>(o.tokens, 1);
  cfg.hidden = o.hidden;
  cfg.dtype = o.dtype;
  cfg.num_experts = o.experts;
  cfg.max_topk = o.topk;
  cfg.num_workers = o.workers;
  cfg.placement = o.placement;
  cfg.enable_latency_layout = o.layout == Layout::kLatency;
  cfg.research.schedule = o.schedule;
  cfg.research.topology = o.topology;
  // Deduplicated cross-host volume of this rank: one row per (token, remote host it goes to).
  double expected_net_rows = 0;
  if (g.num_hosts() > 1) {
    const int El = o.experts / g.size();
    for (int64_t t = 0; t < o.tokens; ++t) {
      std::vector<bool> seen(static_cast<size_t>(g.num_hosts()), false);
      for (int j = 0; j < o.topk; ++j) {
        const int64_t e = in.idx[static_cast<size_t>(t * o.topk + j)];
        const int h = e < 0 ? -1 : g.host_of(static_cast<int>(e / El));
        if (h >= 0 && h != g.host_of(g.rank()) && !seen[static_cast<size_t>(h)]) {
          seen[static_cast<size_t>(h)] = true;
          expected_net_rows += 1;
        }
      }
    }
  }
  // Dispatch rows as the codec sends them (fp8: codes + scales), combine rows in combine_dtype.
  const size_t row_bytes = static_cast<size_t>(o.hidden) * dtype_size(combine_dtype(cfg));
  const size_t dispatch_row_bytes = protocol::row_codec(o.dtype, o.hidden).row_bytes();
  const bool fp8 = o.dtype == DType::kFP8E4M3;
  const double cbytes = combine_bytes(in, o, g.size(), row_bytes);
  std::vector<BenchRow> rows;
  Progress progress(g, o.quiet);
  bool dumped = o.dump.empty() || fp8;  // --dump writes bf16/fp32 calls only

  // One implementation's iterations, run a slice at a time (run), its rows at the end (finish).
  struct Measurement {
    std::string impl, variant;
    std::function<DispatchResult()> dispatch;
    std::function<TensorView(const CombineArgs&)> combine;
    std::function<const CallStats*()> stats;
    std::function<void()> prepare;  // before each slice (sync mode of a shared buffer)
    Buffer* buf = nullptr;
    std::vector<double> td, tc, te;  // dispatch, combine, the expert step between them
    std::vector<double> ty;          // the caller's read of y after the combine
    OpBreakdown dparts, cparts;      // dispatch's and combine's stages, waits and start times
    double barriers = 0, dbytes = 0, net_bytes = 0, net_rows = 0;
    int done = 0;         // iterations run, warm-up included
    uint64_t y_hash = 0;  // of the first call's y (host memory), 0 when not hashed
  };
  std::vector<std::unique_ptr<Measurement>> ms;
  std::vector<std::unique_ptr<AlltoallBaseline>> bases;
  std::vector<std::unique_ptr<Buffer>> bufs;
  auto add = [&](std::string impl, std::string variant, Buffer* buf, auto&& dispatch,
                 auto&& combine, auto&& stats, std::function<void()> prepare) {
    auto m = std::make_unique<Measurement>();
    m->impl = std::move(impl);
    m->variant = std::move(variant);
    m->dispatch = dispatch;
    m->combine = combine;
    m->stats = stats;
    m->prepare = std::move(prepare);
    m->buf = buf;
    ms.push_back(std::move(m));
  };
  for (const std::string& a : o.algos) {
    if (a == "mpi" || a == "oneccl") {
      bases.push_back(a == "mpi" ? std::make_unique<AlltoallBaseline>(g, cfg)
                                 : std::make_unique<AlltoallBaseline>(g, cfg, make_exchange(a, g)));
      AlltoallBaseline* b = bases.back().get();
      add(
          b->name(), "", nullptr, [&in, b] { return b->dispatch(in.args); },
          [b](const CombineArgs& c) { return b->combine(c); },
          [] { return (const CallStats*)nullptr; }, nullptr);
    } else if (a == "bsp" || a == "ubep") {
      const Algorithm algo = parse_algorithm(a);
      cfg.algorithm = algo;
      bufs.push_back(std::make_unique<Buffer>(g, cfg));
      Buffer* buf = bufs.back().get();
      const std::vector<SyncMode> modes =
          algo == Algorithm::kUbep ? o.syncs : std::vector<SyncMode>{SyncMode::kFused};
      for (SyncMode m : modes)
        add(
            a, algo == Algorithm::kUbep && o.syncs.size() > 1 ? sync_mode_name(m) : "", buf,
            [&in, buf] { return buf->dispatch(in.args); },
            [buf](const CombineArgs& c) { return buf->combine(c); },
            [buf] { return &buf->last_stats(); }, [buf, m] { buf->set_sync_mode(m); });
    } else {
      throw InvalidArgument("unknown --algo entry '" + a + "' (expected mpi, oneccl, bsp or ubep)");
    }
  }

  StartBarrier start(g);
  const std::vector<Slice> slices = bench_slices(o.iters, o.rounds, o.warmup);
  int calls = 0;  // per implementation, warm-up included
  for (const Slice& s : slices) calls += s.warm + s.timed;
  auto run = [&](Measurement& m, const Slice& slice) {
    if (m.prepare) m.prepare();
    for (int n = 0; n < slice.warm + slice.timed; ++n, ++m.done) {
      const bool record = n >= slice.warm;
      // Every timed op runs on all ranks at once, alone: a start barrier before it (outside the
      // timing; one whose waiters never sleep, start_barrier.cpp), as the bound's ops have, and
      // a group barrier after it. Without the first, a rank's time
      // includes waiting for a peer still in its previous step (the untimed expert ends at
      // different times on different ranks): the bench's skew, not the op's cost (straggler.cpp
      // measures skew on purpose). Without the second, a rank that is done starts its expert
      // step while a peer is still in the op, which with more ranks than cores takes that peer's
      // CPU time.
      start.wait();
      const auto t0 = Clock::now();
      DispatchResult r = m.dispatch();
      const double d = us_since(t0);
      g.barrier();
      m.dbytes = dispatch_bytes(r, dispatch_row_bytes);
      const CallStats* sd = m.stats();
      if (record && sd) {
        m.barriers += static_cast<double>(sd->barriers);
        m.net_bytes += static_cast<double>(sd->network_bytes);
        m.net_rows += static_cast<double>(sd->network_rows);
      }
      if (record) m.dparts.add(sd, t0);
      const auto te = Clock::now();
      const CombineArgs ca =
          fp8 ? expert_fp8(r, m.buf, in, o.hidden) : expert_identity(r, m.buf, row_bytes);
      if (record) m.te.push_back(us_since(te));
      start.wait();
      const auto t1 = Clock::now();
      TensorView y = m.combine(ca);
      const double c = us_since(t1);
      g.barrier();
      if (record) m.cparts.add(m.stats(), t1);
      if (y.device.type == DeviceType::kCpu) {
        const auto ty = Clock::now();
        read_every_line(y.data, y.bytes());
        if (record) m.ty.push_back(us_since(ty));
      }
      if (record) {
        m.td.push_back(d);
        m.tc.push_back(c);
      }
      if (m.done == 0 && y.device.type == DeviceType::kCpu) m.y_hash = fnv1a(y.data, y.bytes());
      if (!dumped && m.done == 0) {
        dump_call(g, o, in, r, y, m.impl);
        dumped = true;
      }
      progress.update(m.impl + (m.variant.empty() ? "" : "/" + m.variant), m.done + 1, calls);
    }
  };
  auto finish = [&](Measurement& m) {
    BenchRow rd = make_row(g, m.impl, m.variant, "dispatch", m.td, m.dbytes);
    rd.barriers = m.barriers / o.iters;
    rd.network_bytes = mean_over_ranks(g, m.net_bytes / o.iters);
    rd.network_rows = mean_over_ranks(g, m.net_rows / o.iters);
    rd.expected_network_rows = mean_over_ranks(g, expected_net_rows);
    rd.expert_read_us = mean_over_ranks(g, percentile(m.te, 0.5));
    m.dparts.finish(g, m.td, &rd);
    rows.push_back(rd);
    BenchRow rc = make_row(g, m.impl, m.variant, "combine", m.tc, cbytes);
    rc.caller_read_us = mean_over_ranks(g, m.ty.empty() ? 0.0 : percentile(m.ty, 0.5));
    m.cparts.finish(g, m.tc, &rc);
    rows.push_back(std::move(rc));
  };

  // The bound and the floor, in the same run, on the same ranks (one host: they measure shared
  // memory; across hosts the bound is the network, which this bench does not measure).
  std::vector<std::unique_ptr<BoundHarness>> bounds;  // [0]: dispatch rows; [1]: fp8's combine
  std::vector<char> cast_scales;                      // fp8-cast: any scales of the right size
  if (g.single_host()) {
    const auto sends = send_rows(in.idx, o.tokens, o.topk, o.experts, g.size(), g.rank(), o.layout);
    // The bound copies rows of the call's sizes: dispatch rows of the codec (fp8: the codes,
    // and the scales apart, as the call's window holds them), combine rows of the combine
    // dtype (measured separately when they differ, as for fp8).
    const protocol::RowCodec codec = protocol::row_codec(o.dtype, o.hidden);
    const char* payload = fp8 && !in.codes.empty() ? reinterpret_cast<const char*>(in.codes.data())
                                                   : reinterpret_cast<const char*>(in.x.data());
    if (fp8 && in.scales.empty())
      cast_scales.assign(static_cast<size_t>(o.tokens) * codec.scale_bytes, 0);
    const char* scales =
        in.scales.empty() ? cast_scales.data() : reinterpret_cast<const char*>(in.scales.data());
    BoundShape shape;
    shape.layout = o.layout;
    shape.placement = o.placement;
    shape.local_experts = o.experts / g.size();
    shape.max_tokens = cfg.max_tokens_per_rank;
    bounds.push_back(std::make_unique<BoundHarness>(g, sends, payload, codec.payload_bytes, shape,
                                                    codec.scale_bytes ? scales : nullptr,
                                                    codec.scale_bytes));
    if (dispatch_row_bytes != row_bytes)
      bounds.push_back(std::make_unique<BoundHarness>(g, sends, in.x.data(), row_bytes, shape));
    // The fp8 bounds follow the calls' own steps: the combine bound's expert dequantizes (bf16
    // rows, their first bytes as codes), and the dispatch bound's expert dequantizes the fp8
    // rows it received into the bf16 harness, whose combine then runs before the next timed
    // dispatch -- dispatch, dequantize, combine, as the calls go. An op's time here depends on
    // the step before it (docs/PERFORMANCE.md, issue 31, twenty-third and twenty-fourth sessions).
    if (fp8 && o.bound_expert_match && bounds.size() > 1) {
      bounds[1]->set_fp8_expert(o.hidden);
      bounds[0]->set_fp8_expert_into(*bounds[1]);
    }
  }

  // Rounds: every implementation and the bound run a slice of their iterations in turn (the
  // order rotating), so a burst of load on this shared machine lands on all of them alike
  // instead of on whichever ran in that period: the x_bound ratios are then within one
  // period of time, not across the run. Each slice warms up first (bench_slices).
  const size_t parts = ms.size() + (bounds.empty() ? 0 : 1);
  for (size_t r = 0; r < slices.size(); ++r) {
    for (size_t q = 0; q < parts; ++q) {
      const size_t k = (q + r) % parts;
      if (k < ms.size()) {
        run(*ms[k], slices[r]);
      } else {
        for (auto& b : bounds) {
          b->run(bound_warmup(static_cast<int>(r), o.warmup), false);
          b->run(slices[r].timed, true);
        }
      }
    }
  }
  for (auto& m : ms) finish(*m);
  check_same_results(g, ms);
  for (size_t i = 0; i < bounds.size(); ++i)
    for (BenchRow& b : bounds[i]->rows())
      if (i == 0 ? b.op == "dispatch" || dispatch_row_bytes == row_bytes : b.op == "combine")
        rows.push_back(std::move(b));
  bounds.clear();
  if (g.single_host())
    for (BenchRow& f : measure_floor(g, std::max(200, o.iters * 4))) rows.push_back(std::move(f));
  double bound[2] = {0, 0}, floor_us = 0;
  for (const BenchRow& r : rows) {
    if (r.impl == "bound") bound[r.op == "dispatch" ? 0 : 1] = r.median_us;
    if (r.impl == "floor") floor_us = r.median_us;
  }
  for (BenchRow& r : rows) {
    if (r.op != "dispatch" && r.op != "combine") continue;
    const double b = bound[r.op == "dispatch" ? 0 : 1];
    if (b > 0) r.x_bound = r.median_us / b;
    if (b + floor_us > 0 && floor_us > 0) r.x_floor_bound = r.median_us / (b + floor_us);
  }
  for (BenchRow& r : rows) r.dtype = fp8 && o.fp8_cast ? "fp8-cast" : dtype_name(o.dtype);
  return rows;
}

}  // namespace ubep::tools
