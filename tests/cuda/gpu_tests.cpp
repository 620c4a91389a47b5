// GPU tests of the CUDA backend through ubep::Buffer (ctest label `gpu`): thread ranks sharing
// GPU 0, each with its own Buffer on cuda:0 (gpu_buffer_tests.hpp). Self-contained (no
// GoogleTest): prints PASS/FAIL per case and exits 0, 1 on any failure, or 77 (SKIPPED, with
// the reason) when no GPU is usable. Every output is compared bit for bit with
// tests/reference.cpp. Cases: 2, 4, 8 (and 3) ranks; both layouts; bf16 and fp32; ubep
// split-phase, ubep one-shot and bsp; stop-and-wait; random per-rank start delays; epoch tags
// across the 32-bit wrap-around and past 2^32; 1,000 back-to-back calls; the scalar paths
// (hidden not a multiple of 8); the decode row size; errors (a late rank's timeout, a bad
// expert id); placement: compact and per-source for both layouts (recv_range checked),
// compact() and combine from compacted rows, empty sources and a full one.
//
// Built twice: ubep_cuda_gpu_tests (cuda:0) and ubep_cuda_gpu_tests_on_sim (UBEP_GPU_TESTS_ON_SIM:
// the same cases on cuda-sim:0, the kernels on CPU threads, so that the tests' own logic runs
// without a GPU; slow, so ctest runs a subset).
#if !defined(UBEP_GPU_TESTS_ON_SIM)
#include <cuda_runtime.h>
#endif

#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "gpu_buffer_tests.hpp"
#include "gpu_support.hpp"
#include "ubep/cuda.hpp"

using namespace ubep;
using namespace ubep::gpu_test;

namespace {

using CaseList = std::vector<std::pair<std::string, std::function<void()>>>;

// --quick (for compute-sanitizer): at most 4 ranks, 2 calls per case, no decode-size case, 20
// back-to-back calls.
struct Selection {
  bool quick = false;
  std::vector<std::string> filters;  // --filter SUBSTRING (repeatable): cases naming any of them
  bool selects(const std::string& name) const {
    if (filters.empty()) return true;
    for (const std::string& f : filters)
      if (name.find(f) != std::string::npos) return true;
    return false;
  }
};

void add_checked(CaseList& cases, const Selection& sel, Case c) {
  if (sel.quick && (c.hidden > 1024 || (c.ranks > 4 && !c.delays))) return;
  if (sel.quick) {
    c.calls = std::min(c.calls, 2);
    c.ranks = std::min(c.ranks, 4);
  }
  cases.emplace_back(c.name(), [c] { run_checked(c); });
}

// Ranks x layouts x dtypes x {ubep split, ubep one-shot zero-copy, bsp one-shot}.
void add_sweep(CaseList& cases, const Selection& sel) {
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
          add_checked(cases, sel, c);
        }
}

// Per layout: start delays, stop-and-wait, epochs across the wrap-around and past 2^32, rows
// that are not 16-byte multiples, the decode row size, and back-to-back calls.
void add_special(CaseList& cases, const Selection& sel, Layout l) {
  Case c;
  c.ranks = 8;
  c.layout = l;
  c.delays = true;
  c.calls = 4;
  add_checked(cases, sel, c);
  c.delays = false;
  c.sync = SyncMode::kStopAndWait;
  c.ranks = 4;
  add_checked(cases, sel, c);
  c.sync = SyncMode::kFused;
  c.epoch = 0xFFFFFFFFull - 3;  // tags 0xFFFFFFFD.., then 1, 2 after the wrap
  c.calls = 7;
  add_checked(cases, sel, c);
  c.epoch = (uint64_t{1} << 33) - 2;
  c.calls = 4;
  add_checked(cases, sel, c);
  c.epoch = 0;
  c.calls = 3;
  c.ranks = 3;
  // Byte copies and scalar reduction (bf16, 198-byte rows), 4-byte copies and scalar reduction
  // (fp32, 404-byte rows), 4-byte copies and the scalar bf16 reduction (bf16, 200-byte rows).
  for (auto [dt, h] :
       {std::pair{DType::kBF16, 99}, std::pair{DType::kFP32, 101}, std::pair{DType::kBF16, 100}}) {
    c.dtype = dt;
    c.hidden = h;
    add_checked(cases, sel, c);
  }
  c.hidden = 7168;  // the decode row size, hot routing
  c.dtype = DType::kBF16;
  c.ranks = 8;
  c.tokens = 64;
  c.topk = 8;
  c.experts_per_rank = 32;
  c.routing = test::Routing::kHot;
  c.calls = 2;
  add_checked(cases, sel, c);
  Case b;
  b.ranks = sel.quick ? 4 : 8;
  b.layout = l;
  b.calls = sel.quick ? 20 : 1000;
  b.tokens = 16;
  cases.emplace_back("back-to-back: " + b.name(), [b] { run_back_to_back(b); });
}

// The other placement of each layout (auto gives per-source for latency, compact for
// throughput), compact() + compacted combine, empty sources and full per-source regions.
void add_placement(CaseList& cases, const Selection& sel) {
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
          add_checked(cases, sel, c);
        }
      c.ranks = 4;
      c.algo = Algorithm::kUbep;
      c.split = true;
      c.zero_copy = false;
      c.compacted = true;
      c.dtype = DType::kFP32;
      add_checked(cases, sel, c);
      c.routing = test::Routing::kHot;  // hot experts: full per-source regions
      c.dtype = DType::kBF16;
      c.calls = 4;
      add_checked(cases, sel, c);
    }
}

int run_cases(const CaseList& cases, const Selection& sel) {
  int failed = 0, ran = 0;
  for (const auto& [name, fn] : cases) {
    if (!sel.selects(name)) continue;
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
  if (ran == 0) {
    std::cout << "FAILED: no case matches the --filter substrings\n";
    return 1;
  }
  std::cout << (failed ? "FAILED: " : "ALL PASSED: ") << ran - failed << "/" << ran
            << " GPU cases passed\n";
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Selection sel;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      sel.quick = true;
    } else if (a == "--filter" && i + 1 < argc) {
      sel.filters.emplace_back(argv[++i]);
    } else {
      std::cout << "usage: ubep_cuda_gpu_tests [--quick] [--filter SUBSTRING]\n";
      return 2;
    }
  }
#if !defined(UBEP_GPU_TESTS_ON_SIM)
  std::string why;
  if (!cuda::device_available(&why)) {
    std::cout << "SKIPPED: no usable CUDA device (" << why << "); GPU tests did not run\n";
    return kSkip;
  }
  // The primary context is created here once, not inside the first case's rank threads, where
  // it would count against the short group timeouts of the error cases.
  ck(cudaFree(nullptr), "CUDA context creation");
#endif
  CaseList cases;
  add_sweep(cases, sel);
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) add_special(cases, sel, l);
  add_placement(cases, sel);
  cases.emplace_back("errors: a late rank's timeout names it", run_timeout_error);
  cases.emplace_back("tear-down: Buffers destroyed on one thread after their rank threads",
                     run_late_teardown);
#if !defined(UBEP_GPU_TESTS_ON_SIM)
  // A GPU's behaviour: the kernels route the id nowhere. The simulation device reads ids on the
  // host and rejects the call before launching it (its peers then fail too, as on the CPU).
  cases.emplace_back("errors: a bad expert id is named, the buffer stays usable",
                     run_bad_expert_error);
#endif
  return run_cases(cases, sel);
}
