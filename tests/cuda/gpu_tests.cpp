// GPU tests of the CUDA backend on one GPU with virtual ranks (ctest label `gpu`). Self-contained
// (no GoogleTest): prints PASS/FAIL per case and exits 0, 1 on any failure, or 77 (SKIPPED, with
// the reason) when no GPU is usable. Every output is compared bit for bit with
// tests/reference.cpp. Cases: virtual ranks 2, 4, 8 (and 3); both layouts; bf16 and fp32; ubep
// split-phase, ubep one-shot and bsp; stop-and-wait; random per-rank start delays; epoch tags
// across the 32-bit wrap-around; 1,000 back-to-back calls without host synchronisation; the
// scalar paths (hidden not a multiple of 8); error words (timeout, bad expert id, topk);
// placement: compact and per-source for both layouts (recv_range checked), compact() and
// combine from compacted rows, empty sources and a full one.
#include <chrono>
#include <functional>
#include <iostream>
#include <random>

#include "gpu_buffer_tests.hpp"
#include "gpu_support.hpp"
#include "ubep/cuda.hpp"

using namespace ubep;
using namespace ubep::gpu_test;

namespace {

struct Case {
  int ranks = 2;
  Layout layout = Layout::kThroughput;
  DType dtype = DType::kBF16;
  Algorithm algo = Algorithm::kUbep;
  bool split = true;
  SyncMode sync = SyncMode::kFused;
  bool delays = false;
  bool zero_copy = false;
  uint64_t epoch = 0;
  int calls = 3;
  int64_t hidden = 256, tokens = 24;
  int topk = 4, experts_per_rank = 4;
  test::Routing routing = test::Routing::kWithDrops;
  Placement placement = Placement::kAuto;
  bool compacted = false;  // compact(), checked, then combine from compact order
  std::string name() const {
    return std::to_string(ranks) + " ranks, " + layout_name(layout) + ", " + dtype_name(dtype) +
           ", " + algorithm_name(algo) + (split ? " split" : " one-shot") +
           (sync == SyncMode::kStopAndWait ? ", stop-and-wait" : "") + (delays ? ", delays" : "") +
           (zero_copy ? ", zero-copy" : "") + (epoch ? ", epoch " + std::to_string(epoch) : "") +
           ", " + placement_name(placement) + " placement" + (compacted ? ", compacted" : "") +
           ", hidden " + std::to_string(hidden) + ", " + std::to_string(calls) + " calls";
  }
};

BufferConfig config_for(const Case& c) {
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, 0};
  cfg.max_tokens_per_rank = c.tokens;
  cfg.hidden = c.hidden;
  cfg.dtype = c.dtype;
  cfg.num_experts = c.ranks * c.experts_per_rank;
  cfg.max_topk = c.topk;
  cfg.algorithm = c.algo;
  cfg.research.sync = c.sync;
  cfg.initial_epoch = c.epoch;
  cfg.placement = c.placement;
  return cfg;
}

// Each call: a fresh problem (new routing, token counts from 0 to capacity), dispatch, check,
// the reference's expert function, combine, check.
void run_checked(const Case& c) {
  cuda::VirtualBuffer vb(c.ranks, config_for(c));
  const int R = c.ranks, El = c.experts_per_rank;
  const int64_t RT = R * c.tokens;
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  std::mt19937 rng(1234u + static_cast<unsigned>(R));
  for (int call = 0; call < c.calls; ++call) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < R; ++r) tokens.push_back(static_cast<int64_t>(rng() % (c.tokens + 1)));
    if (call == 0) tokens[0] = c.tokens;  // a full rank
    const test::Problem p =
        test::make_problem(R, R * El, c.hidden, c.dtype, tokens, c.topk, c.routing, rng());
    std::vector<std::unique_ptr<RankInputs>> in;
    std::vector<DispatchArgs> args;
    for (int r = 0; r < R; ++r) {
      in.push_back(std::make_unique<RankInputs>(p, r, c.layout));
      args.push_back(in.back()->args);
    }
    if (c.delays) {
      std::vector<uint32_t> ns;
      for (int r = 0; r < R; ++r) ns.push_back(static_cast<uint32_t>(rng() % 200000));
      vb.set_start_delays(ns);
    }
    std::vector<DispatchResult> res;
    if (c.split) {
      vb.dispatch_send(args, reinterpret_cast<cuda::Stream>(s));
      res = vb.dispatch_recv(reinterpret_cast<cuda::Stream>(s));
    } else {
      res = vb.dispatch(args, reinterpret_cast<cuda::Stream>(s));
    }
    vb.synchronize(reinterpret_cast<cuda::Stream>(s));
    std::vector<TensorView> dense;
    if (c.compacted) {
      dense = vb.compact(reinterpret_cast<cuda::Stream>(s));
      vb.synchronize(reinterpret_cast<cuda::Stream>(s));
    }
    std::vector<std::unique_ptr<DevMem>> comb_mem;
    std::vector<CombineArgs> cargs;
    for (int d = 0; d < R; ++d) {
      const DispatchResult& r = res[static_cast<size_t>(d)];
      std::vector<char> packed;
      std::vector<char> comb = check_dispatch(
          p, d, r, vb.num_recv_rows(d, reinterpret_cast<cuda::Stream>(s)), El, RT, c.topk, &packed);
      CombineArgs a;
      a.handle = r.handle;
      if (c.compacted) {
        check_compacted(p, d, c.layout, dense[static_cast<size_t>(d)]);
        comb_mem.push_back(std::make_unique<DevMem>(packed.size()));
        a.x = on_device(comb_mem.back()->p, c.dtype,
                        {static_cast<int64_t>(
                             packed.size() / (static_cast<size_t>(c.hidden) * dtype_size(c.dtype))),
                         c.hidden});
        a.compacted = true;
        comb = std::move(packed);
      } else if (c.zero_copy) {
        a.x = vb.combine_buffer(d);
      } else {
        comb_mem.push_back(std::make_unique<DevMem>(comb.size()));
        a.x = r.recv_x;
        a.x.data = comb_mem.back()->p;
      }
      upload(a.x.data, comb.data(), comb.size());
      cargs.push_back(a);
    }
    std::vector<TensorView> y;
    if (c.split) {
      vb.combine_send(cargs, reinterpret_cast<cuda::Stream>(s));
      y = vb.combine_recv(reinterpret_cast<cuda::Stream>(s));
    } else {
      y = vb.combine(cargs, reinterpret_cast<cuda::Stream>(s));
    }
    vb.synchronize(reinterpret_cast<cuda::Stream>(s));
    for (int r = 0; r < R; ++r)
      check_combine(p, r, y[static_cast<size_t>(r)], test::expected_combine(p, r, c.layout));
  }
  cudaStreamDestroy(s);
}

// `calls` dispatch + combine pairs enqueued back to back with no host synchronisation (the
// combine input is the dispatch output itself: identity experts), then one check of the last.
void run_back_to_back(const Case& c) {
  cuda::VirtualBuffer vb(c.ranks, config_for(c));
  const int R = c.ranks;
  std::vector<int64_t> tokens(static_cast<size_t>(R), c.tokens);
  const test::Problem p = test::make_problem(R, R * c.experts_per_rank, c.hidden, c.dtype, tokens,
                                             c.topk, c.routing, 99);
  std::vector<std::unique_ptr<RankInputs>> in;
  std::vector<DispatchArgs> args;
  for (int r = 0; r < R; ++r) {
    in.push_back(std::make_unique<RankInputs>(p, r, c.layout));
    args.push_back(in.back()->args);
  }
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  auto st = reinterpret_cast<cuda::Stream>(s);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<TensorView> y;
  for (int i = 0; i < c.calls; ++i) {
    vb.dispatch_send(args, st);
    const std::vector<DispatchResult> res = vb.dispatch_recv(st);
    std::vector<CombineArgs> cargs;
    for (const DispatchResult& r : res) cargs.push_back({r.recv_x, r.handle});
    vb.combine_send(cargs, st);
    y = vb.combine_recv(st);
  }
  vb.synchronize(st);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "    " << c.calls << " calls in " << ms << " ms\n";
  for (int r = 0; r < R; ++r)
    check_combine(p, r, y[static_cast<size_t>(r)], expected_identity(p, r, c.layout));
  cudaStreamDestroy(s);
}

template <typename Exc>
void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
  } catch (const Exc& e) {
    if (std::string(e.what()).find(needle) == std::string::npos)
      fail(std::string("error without '") + needle + "': " + e.what());
    std::cout << "    got: " << e.what() << "\n";
    return;
  }
  fail("no error reported (wanted one naming '" + needle + "')");
}

void run_errors() {
  Case c;
  c.ranks = 2;
  const test::Problem p = test::make_problem(2, 8, c.hidden, c.dtype, {8, 8}, c.topk, c.routing, 5);
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  auto st = reinterpret_cast<cuda::Stream>(s);
  RankInputs a(p, 0, c.layout), b(p, 1, c.layout);
  {  // a rank that starts 2 s late: the other times out after 0.2 s naming it
    cuda::Options o;
    o.timeout_s = 0.2;
    cuda::VirtualBuffer vb(2, config_for(c), o);
    vb.set_start_delays({0, 2000000000u});
    vb.dispatch(std::vector<DispatchArgs>{a.args, b.args}, st);
    expect_error<TimeoutError>([&] { vb.synchronize(st); }, "rank 1");
  }
  {  // an expert id past num_experts: InvalidArgument, nothing written out of bounds
    cuda::VirtualBuffer vb(2, config_for(c));
    std::vector<int64_t> bad = p.inputs[1].topk_idx;
    bad[3] = 1000;
    upload(b.idx->p, bad.data(), bad.size() * 8);
    vb.dispatch(std::vector<DispatchArgs>{a.args, b.args}, st);
    expect_error<InvalidArgument>([&] { vb.synchronize(st); }, "flat index 3");
  }
  cudaStreamDestroy(s);
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (!cuda::device_available(&why)) {
    std::cout << "SKIPPED: no usable CUDA device (" << why << "); GPU tests did not run\n";
    return kSkip;
  }
  // --quick (for compute-sanitizer): 2 and 4 ranks, 2 calls per case, no decode-size case,
  // 20 back-to-back calls.
  // --filter SUBSTRING runs the matching cases only (e.g. "per-source"); both may be given.
  bool quick = false;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--filter" && i + 1 < argc) {
      filter = argv[++i];
    } else {
      std::cout << "usage: ubep_cuda_gpu_tests [--quick] [--filter SUBSTRING]\n";
      return 2;
    }
  }
  std::vector<std::pair<std::string, std::function<void()>>> cases;
  auto add = [&](Case c) {
    if (quick && (c.hidden > 1024 || (c.ranks > 4 && !c.delays))) return;
    if (quick) {
      c.calls = std::min(c.calls, 2);
      c.ranks = std::min(c.ranks, 4);
    }
    cases.emplace_back(c.name(), [c] { run_checked(c); });
  };
  for (int R : {2, 4, 8})
    for (Layout l : {Layout::kThroughput, Layout::kLatency})
      for (DType dt : {DType::kBF16, DType::kFP32})
        for (int mode = 0; mode < 3; ++mode) {
          Case c;
          c.ranks = R;
          c.layout = l;
          c.dtype = dt;
          c.algo = mode == 2 ? Algorithm::kBsp : Algorithm::kUbep;
          c.split = mode == 0;
          c.zero_copy = mode == 1;
          add(c);
        }
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    Case c;
    c.ranks = 8;
    c.layout = l;
    c.delays = true;
    c.calls = 4;
    add(c);
    c.delays = false;
    c.sync = SyncMode::kStopAndWait;
    c.ranks = 4;
    add(c);
    c.sync = SyncMode::kFused;
    c.epoch = 0xFFFFFFFFull - 3;  // tags 0xFFFFFFFD.., then 1, 2 after the wrap
    c.calls = 7;
    add(c);
    c.epoch = (uint64_t{1} << 33) - 2;
    c.calls = 4;
    add(c);
    c.epoch = 0;
    c.calls = 3;
    c.ranks = 3;
    // Rows that are not 16-byte multiples: byte copies and scalar reduction (bf16, 198-byte
    // rows), 4-byte copies and scalar reduction (fp32, 404-byte rows), 4-byte copies and the
    // scalar bf16 reduction (bf16, 200-byte rows).
    for (auto [dt, h] : {std::pair{DType::kBF16, 99}, std::pair{DType::kFP32, 101},
                         std::pair{DType::kBF16, 100}}) {
      c.dtype = dt;
      c.hidden = h;
      add(c);
    }
    c.hidden = 7168;  // the decode row size, hot routing
    c.dtype = DType::kBF16;
    c.ranks = 8;
    c.tokens = 64;
    c.topk = 8;
    c.experts_per_rank = 32;
    c.routing = test::Routing::kHot;
    c.calls = 2;
    add(c);
    Case b;
    b.ranks = 8;
    b.layout = l;
    b.calls = quick ? 20 : 1000;
    if (quick) b.ranks = 4;
    b.tokens = 16;
    cases.emplace_back("back-to-back: " + b.name(), [b] { run_back_to_back(b); });
  }
  // ubep::Buffer itself on the GPU (KernelEngine), thread ranks sharing cuda:0.
  for (int R : {2, 4})
    for (Layout l : {Layout::kThroughput, Layout::kLatency})
      for (int mode = 0; mode < 3; ++mode) {
        BufferCase b;
        b.ranks = R;
        b.layout = l;
        b.algo = mode == 2 ? Algorithm::kBsp : Algorithm::kUbep;
        b.split = mode == 0;
        b.zero_copy = mode == 1;
        b.dtype = mode == 1 ? DType::kFP32 : DType::kBF16;
        cases.emplace_back(b.name(), [b] { run_buffer_case(b); });
      }
  // Placement: the other placement of each layout (auto gives per-source for latency, compact
  // for throughput), compact() + compacted combine, empty sources and a full rank.
  for (Layout l : {Layout::kThroughput, Layout::kLatency})
    for (Placement pl : {Placement::kCompact, Placement::kPerSource}) {
      Case c;
      c.layout = l;
      c.placement = pl;
      for (int R : {2, 4, 8})
        for (int mode = 0; mode < 3; ++mode) {
          c.ranks = R;
          c.algo = mode == 2 ? Algorithm::kBsp : Algorithm::kUbep;
          c.split = mode == 0;
          c.zero_copy = mode == 1;
          add(c);
        }
      c.ranks = 4;
      c.algo = Algorithm::kUbep;
      c.split = true;
      c.zero_copy = false;
      c.compacted = true;
      c.dtype = DType::kFP32;
      add(c);
      c.routing = test::Routing::kHot;  // hot experts: full per-source regions
      c.dtype = DType::kBF16;
      c.calls = 4;
      add(c);
    }
  cases.emplace_back("errors: timeout names the late rank, bad expert id", run_errors);
  int failed = 0, ran = 0;
  for (const auto& [name, fn] : cases) {
    if (!filter.empty() && name.find(filter) == std::string::npos) continue;
    std::cout << "RUN  " << name << std::endl;  // a hang (killed by the time limit) names its case
    ++ran;
    try {
      fn();
      std::cout << "PASS " << name << "\n";
    } catch (const std::exception& e) {
      ++failed;
      std::cout << "FAIL " << name << ": " << e.what() << "\n";
    }
    std::cout.flush();
  }
  std::cout << (failed ? "FAILED: " : "ALL PASSED: ") << ran - failed << "/" << ran
            << " GPU cases passed\n";
  return failed ? 1 : 0;
}
