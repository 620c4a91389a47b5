#include "bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>

#include "ep/protocol.hpp"
#include "npy.hpp"
#include "ubep/baseline.hpp"
#include "ubep/bf16.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"
#include "ubep/scheduler.hpp"

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

struct Input {
  std::vector<char> x;
  std::vector<int64_t> idx;
  std::vector<float> w;
  std::vector<uint8_t> codes;  // fp8: x quantized before the timed calls
  std::vector<float> scales;
  std::vector<uint16_t> expert_out;  // fp8: the expert's bf16 output for the baseline
  DispatchArgs args;
};

Input make_input(const Group& g, const BenchOptions& o) {
  Input in;
  // fp8 inputs start as bf16 values: cast on send, or quantized once here (not timed).
  const bool fp8 = o.dtype == DType::kFP8E4M3;
  const DType value_dtype = fp8 ? DType::kBF16 : o.dtype;
  const size_t es = dtype_size(value_dtype);
  in.x.resize(static_cast<size_t>(o.tokens * o.hidden) * es);
  std::mt19937 rng(static_cast<unsigned>(o.seed * 977 + static_cast<uint64_t>(g.rank())));
  std::uniform_real_distribution<float> v(-1.0f, 1.0f);
  for (int64_t i = 0; i < o.tokens * o.hidden; ++i) {
    const float f = v(rng);
    if (value_dtype == DType::kBF16) {
      const uint16_t b = float_to_bf16(f);
      std::memcpy(&in.x[static_cast<size_t>(i) * 2], &b, 2);
    } else {
      std::memcpy(&in.x[static_cast<size_t>(i) * 4], &f, 4);
    }
  }
  make_routing(o.tokens, o.topk, o.experts, o.routing,
               o.seed * 131 + static_cast<uint64_t>(g.rank()), &in.idx, &in.w);
  in.args.x = TensorView(in.x.data(), value_dtype, {o.tokens, o.hidden});
  if (fp8 && !o.fp8_cast) {
    const int64_t blocks = fp8_scales_per_row(o.hidden);
    in.codes.resize(static_cast<size_t>(o.tokens * o.hidden));
    in.scales.resize(static_cast<size_t>(o.tokens * blocks));
    fp8_quantize_rows(in.x.data(), DType::kBF16, o.tokens, o.hidden, false, in.codes.data(),
                      in.scales.data());
    in.args.x = TensorView(in.codes.data(), DType::kFP8E4M3, {o.tokens, o.hidden});
    in.args.x_scales = TensorView(in.scales.data(), DType::kFP32, {o.tokens, blocks});
  }
  in.args.topk_idx = TensorView(in.idx.data(), DType::kInt64, {o.tokens, o.topk});
  in.args.topk_weights = TensorView(in.w.data(), DType::kFP32, {o.tokens, o.topk});
  in.args.layout = o.layout;
  return in;
}

// The bench's expert is the identity: its output is the received rows. With ubep::Buffer the
// expert writes its output into the zero-copy combine buffer (as a real expert GEMM would write
// its result there); that copy is the expert's work and is not timed. The baseline's combine
// reads the rows where they are.
// fp8 (the combine dtype is bf16): the expert dequantizes its valid rows into bf16, written
// into the combine buffer (Buffer) or a bf16 copy shaped like recv_x (the baseline).
CombineArgs expert_fp8(const DispatchResult& r, Buffer* buf, Input& in, int64_t hidden) {
  TensorView out = r.recv_x;
  out.dtype = DType::kBF16;
  if (buf) {
    out = buf->combine_buffer();
  } else {
    in.expert_out.resize(static_cast<size_t>(r.recv_x.numel()));
    out.data = in.expert_out.data();
  }
  const bool latency = r.layout == Layout::kLatency;
  const int64_t experts = latency ? r.recv_x.dim(0) : 1, rows = latency ? r.recv_x.dim(1) : 0;
  const int64_t nb = fp8_scales_per_row(hidden);
  std::vector<float> row(static_cast<size_t>(hidden));
  auto convert = [&](int64_t at, int64_t n) {
    for (int64_t i = at; i < at + n; ++i) {
      fp8_dequantize_rows(r.recv_x.as<const uint8_t>() + i * hidden,
                          r.recv_x_scales.as<const float>() + i * nb, 1, hidden, row.data());
      for (int64_t h = 0; h < hidden; ++h)
        out.as<uint16_t>()[i * hidden + h] = float_to_bf16(row[static_cast<size_t>(h)]);
    }
  };
  for (int64_t e = 0; e < experts; ++e) {
    if (r.recv_range.ndim == 0) {  // the baseline: rows packed from 0
      convert(e * rows, latency ? r.recv_count.as<const int64_t>()[e] : r.num_recv_rows);
      continue;
    }
    const int64_t ranks = r.recv_range.dim(latency ? 1 : 0);
    for (int64_t s = 0; s < ranks; ++s) {
      const int64_t* rr = r.recv_range.as<const int64_t>() + 2 * (e * ranks + s);
      convert(e * rows + rr[0], rr[1]);
    }
  }
  return CombineArgs{out, r.handle};
}

CombineArgs expert_identity(const DispatchResult& r, Buffer* buf, size_t row_bytes) {
  if (!buf) return CombineArgs{r.recv_x, r.handle};
  TensorView out = buf->combine_buffer();
  const auto* src = static_cast<const char*>(r.recv_x.data);
  auto* dst = static_cast<char*>(out.data);
  // The valid rows: each (expert, source) range of recv_range (contiguous when compact).
  const bool latency = r.layout == Layout::kLatency;
  const int64_t experts = latency ? r.recv_x.dim(0) : 1, ranks = r.recv_range.dim(latency ? 1 : 0);
  const int64_t rows = latency ? r.recv_x.dim(1) : 0;
  const auto* range = r.recv_range.as<const int64_t>();
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t s = 0; s < ranks; ++s) {
      const int64_t* rr = range + 2 * (e * ranks + s);
      const size_t at = static_cast<size_t>(e * rows + rr[0]) * row_bytes;
      std::memcpy(dst + at, src + at, static_cast<size_t>(rr[1]) * row_bytes);
    }
  return CombineArgs{out, r.handle};
}

double dispatch_bytes(const DispatchResult& r, size_t row_bytes) {
  if (r.layout == Layout::kThroughput)
    return static_cast<double>(r.num_recv_rows) * static_cast<double>(row_bytes);
  double rows = 0;
  for (int64_t e = 0; e < r.recv_count.dim(0); ++e)
    rows += static_cast<double>(r.recv_count.as<int64_t>()[e]);
  return rows * static_cast<double>(row_bytes);
}

double combine_bytes(const Input& in, const BenchOptions& o, int ranks, size_t row_bytes) {
  // Rows coming back to this rank: one per (token, destination rank) or per selected (token, k).
  const int El = o.experts / ranks;
  double rows = 0;
  for (int64_t t = 0; t < o.tokens; ++t) {
    std::vector<bool> seen(static_cast<size_t>(ranks), false);
    for (int j = 0; j < o.topk; ++j) {
      const int64_t e = in.idx[static_cast<size_t>(t * o.topk + j)];
      if (e < 0) continue;
      if (o.layout == Layout::kLatency)
        rows += 1;
      else if (!seen[static_cast<size_t>(e / El)]) {
        seen[static_cast<size_t>(e / El)] = true;
        rows += 1;
      }
    }
  }
  return rows * static_cast<double>(row_bytes);
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

void dump_call(Group& g, const BenchOptions& o, const Input& in, const DispatchResult& r,
               const TensorView& y, const std::string& impl) {
  namespace fs = std::filesystem;
  fs::create_directories(o.dump);
  const std::string p = o.dump + "/rank" + std::to_string(g.rank()) + "_";
  const bool bf = o.dtype == DType::kBF16;
  const std::string xd = bf ? "<u2" : "<f4";
  const size_t es = dtype_size(o.dtype);
  write_npy(p + "x.npy", in.x.data(), xd, {o.tokens, o.hidden}, es);
  write_npy(p + "topk_idx.npy", in.idx.data(), "<i8", {o.tokens, o.topk}, 8);
  write_npy(p + "topk_weights.npy", in.w.data(), "<f4", {o.tokens, o.topk}, 4);
  std::vector<int64_t> xs(r.recv_x.shape.begin(), r.recv_x.shape.begin() + r.recv_x.ndim);
  write_npy(p + "recv_x.npy", r.recv_x.data, xd, xs, es);
  std::vector<int64_t> ss(r.recv_src.shape.begin(), r.recv_src.shape.begin() + r.recv_src.ndim);
  write_npy(p + "recv_src.npy", r.recv_src.data, "<i8", ss, 8);
  if (r.layout == Layout::kThroughput) {
    write_npy(p + "recv_topk_idx.npy", r.recv_topk_idx.data, "<i4", {r.num_recv_rows, o.topk}, 4);
    write_npy(p + "recv_topk_weights.npy", r.recv_topk_weights.data, "<f4",
              {r.num_recv_rows, o.topk}, 4);
  }
  write_npy(p + "recv_count.npy", r.recv_count.data, "<i8", {r.recv_count.dim(0)}, 8);
  if (r.recv_range.data) {
    std::vector<int64_t> rs(r.recv_range.shape.begin(),
                            r.recv_range.shape.begin() + r.recv_range.ndim);
    write_npy(p + "recv_range.npy", r.recv_range.data, "<i8", rs, 8);
  }
  write_npy(p + "combine_in.npy", r.recv_x.data, xd, xs, es);  // identity expert
  write_npy(p + "y.npy", y.data, xd, {y.dim(0), y.dim(1)}, es);
  if (g.rank() == 0) {
    std::ofstream m(o.dump + "/meta.json");
    m << "{\"ranks\": " << g.size() << ", \"tokens\": " << o.tokens << ", \"hidden\": " << o.hidden
      << ", \"topk\": " << o.topk << ", \"experts\": " << o.experts << ", \"dtype\": \""
      << dtype_name(o.dtype) << "\", \"bf16_as\": \"uint16 bit patterns\", \"layout\": \""
      << layout_name(o.layout) << "\", \"impl\": \"" << impl
      << "\", \"expert\": \"identity (combine_in = recv_x)\""
      << ", \"placement\": \"" << placement_name(r.placement) << "\""
      << ", \"rows_per_source\": "
      << (r.layout == Layout::kLatency ? r.recv_x.dim(1) / g.size() : o.tokens)
      << ", \"latency_layout_rows\": \"compact: recv_x[e, :recv_count[e]]; per-source: "
         "recv_x[e, s*rows_per_source : s*rows_per_source + recv_range[e, s, 1]]\"}\n";
  }
}

}  // namespace

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
  cfg.schedule = o.schedule;
  cfg.topology = o.topology;
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
  const size_t dispatch_row_bytes = ep::row_codec(o.dtype, o.hidden).row_bytes();
  const bool fp8 = o.dtype == DType::kFP8E4M3;
  const double cbytes = combine_bytes(in, o, g.size(), row_bytes);
  const int total = o.warmup + o.iters;
  std::vector<BenchRow> rows;
  Progress progress(g, o.quiet);
  bool dumped = o.dump.empty() || fp8;  // --dump writes bf16/fp32 calls only

  auto measure = [&](const std::string& impl, const std::string& variant, auto&& dispatch,
                     auto&& combine, auto&& stats, Buffer* buf) {
    std::vector<double> td, tc;
    std::map<std::string, double> stage_sum;
    std::vector<std::string> stage_order;
    double barriers = 0, dbytes = 0, net_bytes = 0, net_rows = 0;
    for (int i = 0; i < total; ++i) {
      // Every timed op runs on all ranks at once, alone: a group barrier before it (outside the
      // timing), as the bound's ops have, and one after it. Without the first, a rank's time
      // includes waiting for a peer still in its previous step (the untimed expert ends at
      // different times on different ranks): the bench's skew, not the op's cost (straggler.cpp
      // measures skew on purpose). Without the second, a rank that is done starts its expert
      // step while a peer is still in the op, which with more ranks than cores takes that peer's
      // CPU time.
      g.barrier();
      auto t0 = Clock::now();
      DispatchResult r = dispatch();
      const double d = us_since(t0);
      g.barrier();
      dbytes = dispatch_bytes(r, dispatch_row_bytes);
      const CallStats* sd = stats();
      if (i >= o.warmup && sd) {
        barriers += static_cast<double>(sd->barriers);
        net_bytes += static_cast<double>(sd->network_bytes);
        net_rows += static_cast<double>(sd->network_rows);
        for (auto& [name, us] : sd->stage_us) {
          if (!stage_sum.count(name)) stage_order.push_back(name);
          stage_sum[name] += us;
        }
      }
      const CombineArgs ca =
          fp8 ? expert_fp8(r, buf, in, o.hidden) : expert_identity(r, buf, row_bytes);
      g.barrier();
      t0 = Clock::now();
      TensorView y = combine(ca);
      const double c = us_since(t0);
      g.barrier();
      if (i >= o.warmup) {
        td.push_back(d);
        tc.push_back(c);
      }
      if (!dumped && i == 0) {
        dump_call(g, o, in, r, y, impl);
        dumped = true;
      }
      progress.update(impl + (variant.empty() ? "" : "/" + variant), i + 1, total);
    }
    BenchRow rd = make_row(g, impl, variant, "dispatch", td, dbytes);
    rd.barriers = barriers / o.iters;
    rd.network_bytes = mean_over_ranks(g, net_bytes / o.iters);
    rd.network_rows = mean_over_ranks(g, net_rows / o.iters);
    rd.expected_network_rows = mean_over_ranks(g, expected_net_rows);
    for (auto& n : stage_order) rd.stages.emplace_back(n, stage_sum[n] / o.iters);
    rows.push_back(rd);
    rows.push_back(make_row(g, impl, variant, "combine", tc, cbytes));
  };

  for (const std::string& a : o.algos) {
    if (a == "mpi") {
      AlltoallBaseline base(g, cfg);
      measure(
          base.name(), "", [&] { return base.dispatch(in.args); },
          [&](const CombineArgs& c) { return base.combine(c); },
          [] { return (const CallStats*)nullptr; }, nullptr);
    } else if (a == "bsp" || a == "ubep") {
      const Algorithm algo = parse_algorithm(a);
      cfg.algorithm = algo;
      Buffer buf(g, cfg);
      const std::vector<SyncMode> modes =
          algo == Algorithm::kUbep ? o.syncs : std::vector<SyncMode>{SyncMode::kFused};
      for (SyncMode m : modes) {
        buf.set_sync_mode(m);
        measure(
            a, algo == Algorithm::kUbep && o.syncs.size() > 1 ? sync_mode_name(m) : "",
            [&] { return buf.dispatch(in.args); },
            [&](const CombineArgs& c) { return buf.combine(c); }, [&] { return &buf.last_stats(); },
            &buf);
      }
    } else {
      throw InvalidArgument("unknown --algo entry '" + a + "' (expected mpi, bsp or ubep)");
    }
  }

  // The bound and the floor, in the same run, on the same ranks (one host: they measure shared
  // memory; across hosts the bound is the network, which this bench does not measure).
  if (g.single_host()) {
    const auto sends = send_rows(in.idx, o.tokens, o.topk, o.experts, g.size(), g.rank(), o.layout);
    // The bound copies rows of the call's sizes: dispatch rows of the codec (fp8: the codes,
    // and the scales apart, as the call's window holds them), combine rows of the combine
    // dtype (measured separately when they differ, as for fp8).
    const ep::RowCodec codec = ep::row_codec(o.dtype, o.hidden);
    const char* payload = fp8 && !in.codes.empty() ? reinterpret_cast<const char*>(in.codes.data())
                                                   : reinterpret_cast<const char*>(in.x.data());
    std::vector<float> cast_scales;  // fp8-cast: any scales of the right size
    if (fp8 && in.scales.empty())
      cast_scales.assign(static_cast<size_t>(o.tokens) * codec.scale_bytes / sizeof(float), 1.0f);
    const char* scales =
        reinterpret_cast<const char*>(in.scales.empty() ? cast_scales.data() : in.scales.data());
    for (BenchRow& b :
         measure_bound(g, sends, payload, codec.payload_bytes, o.tokens, o.warmup, o.iters,
                       codec.scale_bytes ? scales : nullptr, codec.scale_bytes))
      if (b.op == "dispatch" || dispatch_row_bytes == row_bytes) rows.push_back(std::move(b));
    if (dispatch_row_bytes != row_bytes)
      for (BenchRow& b :
           measure_bound(g, sends, in.x.data(), row_bytes, o.tokens, o.warmup, o.iters))
        if (b.op == "combine") rows.push_back(std::move(b));
    for (BenchRow& f : measure_floor(g, std::max(200, o.iters * 4))) rows.push_back(std::move(f));
  }
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
