// The CUDA kernels executed on the CPU: dispatch.cuh and combine.cuh compiled by the host
// compiler against tests/cuda/sim/cuda_host_sim.hpp (every GPU thread a std::thread, warps and
// blocks meeting at barriers) and driven like the engine drives them -- virtual ranks in one
// launch (VirtualPeers) and one launch per rank running concurrently (IpcPeers, the processes of
// the IPC path) -- with every output compared bit for bit with tests/reference.cpp.
//
// This runs the kernels' code, not a GPU: it checks indexing, roles, waits, placement, the
// fixed-order reduction, bsp's barriers, halves and epochs across calls. It does not check the
// GPU memory model, scheduling or performance (docs/CUDA.md).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <random>
#include <span>
#include <thread>

#include "backend/cuda/combine.cuh"
#include "backend/cuda/host_logic.hpp"
#include "backend/cuda/sequencer.hpp"
#include "gpu_support.hpp"
#include "sim_buffer.hpp"

namespace ubep {
namespace {

using cuda_hd::LaunchParams;

struct SimCase {
  int ranks;
  Layout layout;
  DType dtype;
  Algorithm algo;
  bool split, zero_copy, ipc;
  SyncMode sync = SyncMode::kFused;
  uint64_t epoch = 0;
  int64_t hidden = 40;
  int64_t tokens = 9;  // > 32: several routing chunks
  bool delays = false;
  int topk = 3, experts_per_rank = 3;
  Placement placement = Placement::kAuto;
  bool compacted = false;  // combine from compact()'s order (after checking compact())
  bool extremes = false;   // empty sources and a full one (max_tokens rows to one expert)
};

size_t map_row_bytes(const BufferConfig& cfg) {
  return static_cast<size_t>(cfg.hidden) * dtype_size(cfg.dtype);
}

void run_case(const SimCase& c) {
  const int R = c.ranks, El = c.experts_per_rank, K = c.topk;
  const int64_t T = c.tokens;
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, 0};
  cfg.max_tokens_per_rank = T;
  cfg.hidden = c.hidden;
  cfg.dtype = c.dtype;
  cfg.num_experts = R * El;
  cfg.max_topk = K;
  cfg.initial_epoch = c.epoch;
  cfg.placement = c.placement;
  SimBuffer b(R, cfg, c.ipc);
  b.set_algorithm(c.algo);
  b.set_sync(c.sync);
  if (c.delays)
    for (int r = 0; r < R; ++r)
      b.set_start_delay(r, static_cast<uint32_t>((r * 7919) % 5) * 2000000u);
  std::mt19937 rng(static_cast<unsigned>(R * 31 + c.hidden));
  for (int call = 0; call < 3; ++call) {  // three calls: both halves, then the first again
    std::vector<int64_t> tokens;
    for (int r = 0; r < R; ++r)
      tokens.push_back(call == 0 && r == 0 ? T : static_cast<int64_t>(rng() % (T + 1)));
    if (c.extremes)  // odd ranks send nothing; rank 0 is full
      for (int r = 0; r < R; ++r) tokens[static_cast<size_t>(r)] = r % 2 ? 0 : T;
    test::Problem p =
        test::make_problem(R, R * El, c.hidden, c.dtype, tokens, K,
                           call == 1 ? test::Routing::kHot : test::Routing::kWithDrops, rng());
    if (c.extremes) {
      // Rank 0's every token picks expert 1 (on rank 0) first: max_tokens rows from one source
      // to one expert, its whole per-source region; its other picks avoid expert 1.
      auto& idx = p.inputs[0].topk_idx;
      for (int64_t t = 0; t < T; ++t)
        for (int j = 0; j < K; ++j) {
          int64_t& e = idx[static_cast<size_t>(t * K + j)];
          if (j == 0)
            e = 1;
          else if (e == 1)
            e = -1;
        }
    }
    std::vector<std::unique_ptr<gpu_test::RankInputs>> in;
    std::vector<DispatchArgs> args;
    for (int r = 0; r < R; ++r) {
      in.push_back(std::make_unique<gpu_test::RankInputs>(p, r, c.layout));
      for (TensorView* v :
           {&in.back()->args.x, &in.back()->args.topk_idx, &in.back()->args.topk_weights})
        v->device = cfg.device;
      args.push_back(in.back()->args);
    }
    if (c.split) {
      b.dispatch(args, cuda_hd::kSend);
      b.dispatch({}, cuda_hd::kRecv);
    } else {
      b.dispatch(args, cuda_hd::kSend | cuda_hd::kRecv);
    }
    b.check_error();
    const std::vector<DispatchResult> res = b.results();
    std::vector<std::unique_ptr<gpu_test::DevMem>> mem;
    std::vector<CombineArgs> cargs;
    const Placement want_placement =
        c.placement == Placement::kAuto ? placement_for(c.layout) : c.placement;
    std::vector<TensorView> dense;
    if (c.compacted) {
      dense = b.compact();
      b.check_error();
    }
    for (int d = 0; d < R; ++d) {
      EXPECT_EQ(res[static_cast<size_t>(d)].placement, want_placement);
      std::vector<char> packed;
      std::vector<char> comb = gpu_test::check_dispatch(p, d, res[static_cast<size_t>(d)],
                                                        b.num_recv_rows(d), El, R * T, K, &packed);
      CombineArgs a{res[static_cast<size_t>(d)].recv_x, res[static_cast<size_t>(d)].handle};
      if (c.compacted) {
        gpu_test::check_compacted(p, d, c.layout, dense[static_cast<size_t>(d)]);
        // The expert outputs in compact order, in a tensor of exactly the valid rows.
        a.compacted = true;
        mem.push_back(std::make_unique<gpu_test::DevMem>(packed.size()));
        a.x = TensorView(mem.back()->p, c.dtype,
                         {static_cast<int64_t>(packed.size() / map_row_bytes(cfg)), c.hidden});
        a.x.device = cfg.device;
        comb = std::move(packed);
      } else if (c.zero_copy) {
        a.x = b.combine_buffer(d);
      } else {
        mem.push_back(std::make_unique<gpu_test::DevMem>(comb.size()));
        a.x.data = mem.back()->p;
      }
      gpu_test::upload(a.x.data, comb.data(), comb.size());
      cargs.push_back(a);
    }
    if (c.split) {
      b.combine(cargs, cuda_hd::kCombSend);
      b.combine(cargs, cuda_hd::kCombRecv);
    } else {
      b.combine(cargs, cuda_hd::kCombSend | cuda_hd::kCombRecv);
    }
    b.check_error();
    for (int r = 0; r < R; ++r)
      gpu_test::check_combine(p, r, b.output(r), test::expected_combine(p, r, c.layout));
  }
}

class KernelsOnCpu : public ::testing::TestWithParam<SimCase> {};

TEST_P(KernelsOnCpu, BitIdenticalToReference) {
  try {
    run_case(GetParam());
  } catch (const std::exception& e) {
    FAIL() << e.what();
  }
}

std::vector<SimCase> cases() {
  std::vector<SimCase> v;
  for (int R : {2, 3, 4})
    for (Layout l : {Layout::kThroughput, Layout::kLatency})
      for (DType dt : {DType::kBF16, DType::kFP32}) {
        v.push_back({R, l, dt, Algorithm::kUbep, true, false, false});
        v.push_back({R, l, dt, Algorithm::kUbep, false, true, false});
        v.push_back({R, l, dt, Algorithm::kBsp, false, false, false});
      }
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    v.push_back({3, l, DType::kBF16, Algorithm::kUbep, true, true, true});   // IPC policy
    v.push_back({2, l, DType::kFP32, Algorithm::kBsp, false, false, true});  // IPC bsp barrier
    v.push_back({3, l, DType::kBF16, Algorithm::kUbep, true, false, false, SyncMode::kStopAndWait});
    v.push_back({2, l, DType::kBF16, Algorithm::kUbep, true, false, false, SyncMode::kFused,
                 0xFFFFFFFFull - 1});
    v.push_back(
        {2, l, DType::kBF16, Algorithm::kUbep, true, false, false, SyncMode::kFused, 0, 99});
    v.push_back(
        {2, l, DType::kFP32, Algorithm::kUbep, true, false, false, SyncMode::kFused, 0, 101});
  }
  // Several routing chunks (70 tokens), rows spanning several warp iterations with a partial
  // last one (bf16 hidden 600: 75 vectors; fp32 hidden 300), 8 ranks, skewed starts.
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    SimCase c{2, l, DType::kBF16, Algorithm::kUbep, true, false, false};
    c.tokens = 70;
    c.topk = 4;
    c.experts_per_rank = 5;
    v.push_back(c);
    c.algo = Algorithm::kBsp;
    c.split = false;
    c.ipc = true;
    v.push_back(c);
    SimCase h{2, l, DType::kBF16, Algorithm::kUbep, false, true, false};
    h.hidden = 600;
    v.push_back(h);
    h.dtype = DType::kFP32;
    h.hidden = 300;
    v.push_back(h);
    // Fewer tokens than warps: the combine splits rows among warps (vector and scalar paths).
    for (int64_t hid : {1000, 999}) {
      SimCase few{2, l, DType::kBF16, Algorithm::kUbep, true, false, false};
      few.tokens = 2;
      few.hidden = hid;
      v.push_back(few);
    }
    SimCase most{16, l, DType::kFP32, Algorithm::kBsp, false, false, false};  // kMaxVirtualRanks
    most.tokens = 3;
    v.push_back(most);
    SimCase big{8, l, DType::kBF16, Algorithm::kUbep, true, false, false};
    big.tokens = 5;
    big.delays = true;
    v.push_back(big);
  }
  // Placement: the defaults above (auto: per-source for latency, compact for throughput); here
  // the other placement of each layout, compact() and compacted combine, 1 and 8 ranks, empty
  // sources and a full one.
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    const Placement other =
        placement_for(l) == Placement::kCompact ? Placement::kPerSource : Placement::kCompact;
    for (int R : {2, 3, 4})
      for (DType dt : {DType::kBF16, DType::kFP32}) {
        SimCase c{R, l, dt, Algorithm::kUbep, true, false, false};
        c.placement = other;
        v.push_back(c);
        c.algo = Algorithm::kBsp;
        c.split = false;
        c.zero_copy = true;
        v.push_back(c);
      }
    for (Placement pl : {Placement::kCompact, Placement::kPerSource}) {
      SimCase c{3, l, DType::kBF16, Algorithm::kUbep, true, false, false};
      c.placement = pl;
      c.compacted = true;
      v.push_back(c);
      c.ipc = true;
      c.dtype = DType::kFP32;
      v.push_back(c);
      SimCase e{4, l, DType::kFP32, Algorithm::kUbep, true, false, false};
      e.placement = pl;
      e.extremes = true;
      v.push_back(e);
      e.compacted = true;
      e.ranks = 3;
      v.push_back(e);
      SimCase one{1, l, DType::kBF16, Algorithm::kUbep, true, false, false};
      one.placement = pl;
      v.push_back(one);
      SimCase eight{8, l, DType::kBF16, Algorithm::kUbep, false, true, false};
      eight.placement = pl;
      eight.tokens = 4;
      v.push_back(eight);
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, KernelsOnCpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<SimCase>& i) {
                           const SimCase& c = i.param;
                           return std::to_string(i.index) + "_R" + std::to_string(c.ranks) + "_" +
                                  layout_name(c.layout) + "_" + dtype_name(c.dtype) + "_" +
                                  algorithm_name(c.algo) + (c.split ? "_split" : "_oneshot") +
                                  (c.zero_copy ? "_zerocopy" : "") + (c.ipc ? "_ipc" : "") +
                                  (c.sync == SyncMode::kStopAndWait ? "_stopwait" : "") +
                                  (c.epoch ? "_wrap" : "") + (c.delays ? "_delays" : "") + "_" +
                                  (c.placement == Placement::kAuto      ? std::string("auto")
                                   : c.placement == Placement::kCompact ? "compact"
                                                                        : "persource") +
                                  (c.compacted ? "_compacted" : "") +
                                  (c.extremes ? "_extremes" : "") + "_H" +
                                  std::to_string(c.hidden) + "_T" + std::to_string(c.tokens);
                         });

// Both ranks' throughput-layout dispatch arguments for p, marked as on cfg's device (their
// memory lives in `in`).
std::vector<DispatchArgs> device_args(const test::Problem& p, const BufferConfig& cfg,
                                      std::vector<std::unique_ptr<gpu_test::RankInputs>>& in) {
  std::vector<DispatchArgs> args;
  for (int r = 0; r < 2; ++r) {
    in.push_back(std::make_unique<gpu_test::RankInputs>(p, r, Layout::kThroughput));
    for (TensorView* v :
         {&in.back()->args.x, &in.back()->args.topk_idx, &in.back()->args.topk_weights})
      v->device = cfg.device;
    args.push_back(in.back()->args);
  }
  return args;
}

// A rank that starts late past the timeout: the others' bounded waits report it, every other
// spinning thread gives up, the launch ends, and the host gets a TimeoutError naming the rank.
// Returns the error's text ("" when no timeout was reported).
std::string late_rank_error(const BufferConfig& cfg, bool ipc, uint64_t timeout_ns) {
  SimBuffer b(2, cfg, ipc);
  b.timeout_ns = timeout_ns;
  b.set_start_delay(1, 4'000'000'000u);  // ns, the hook's most is 4.29 s
  const test::Problem p =
      test::make_problem(2, 4, 16, cfg.dtype, {6, 6}, 2, test::Routing::kUniform, 1);
  std::vector<std::unique_ptr<gpu_test::RankInputs>> in;
  const std::vector<DispatchArgs> args = device_args(p, cfg, in);
  b.dispatch(args, cuda_hd::kSend | cuda_hd::kRecv);
  try {
    b.check_error();
  } catch (const TimeoutError& e) {
    return e.what();
  }
  return "";
}

TEST(KernelsOnCpuErrors, LateRankTimesOutNamingIt) {
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, 0};
  cfg.max_tokens_per_rank = 6;
  cfg.hidden = 16;
  cfg.num_experts = 4;
  cfg.max_topk = 2;
  for (bool ipc : {false, true}) {
    // Rank 0's own blocks must meet each other within the timeout while rank 1 is 4 s late:
    // 1.5 s (0.1 s flaked at load average 150; 0.5 s once in CI; 1.5 s once under ThreadSanitizer
    // at nice 19 beside two other sessions' builds). A timeout between rank 0's own blocks is the
    // load's, not what this test is about: that try is repeated once with a 3 s timeout.
    std::string what = late_rank_error(cfg, ipc, 1'500'000'000);
    if (what.find("between the blocks of rank 0") != std::string::npos)
      what = late_rank_error(cfg, ipc, 3'000'000'000);
    ASSERT_FALSE(what.empty()) << "ipc " << ipc << ": no timeout reported";
    EXPECT_NE(what.find("rank 0 timed out"), std::string::npos) << what;
    EXPECT_NE(what.find("of rank 1"), std::string::npos) << what;
  }
}

// The point of per-source placement, as an event order (not a timing): rank 0 starts its
// dispatch_send 2 s late (IPC: one launch per rank). With per-source placement, ranks 1 and 2
// finish their send launches while rank 0's count records have not reached them -- they never
// waited for it; with compact placement they cannot finish before those records are there
// (their offsets are prefix sums over rank 0's counts). Then the call completes bit-identically.
TEST(KernelsOnCpuPlacement, LateRankDelaysOnlyItsOwnRows) {
  for (Placement pl : {Placement::kPerSource, Placement::kCompact})
    for (Layout l : {Layout::kLatency, Layout::kThroughput}) {
      BufferConfig cfg;
      cfg.device = {DeviceType::kCuda, 0};
      cfg.max_tokens_per_rank = 6;
      cfg.hidden = 16;
      cfg.num_experts = 6;
      cfg.max_topk = 2;
      cfg.placement = pl;
      SimBuffer b(3, cfg, true);
      b.set_start_delay(0, 2'000'000'000u);
      std::atomic<uint32_t> seen[3] = {0, 0, 0};  // rank 0's count-record tag at q, when q ended
      b.after_launch = [&](size_t q) {
        if (q != 0)
          seen[q].store(__atomic_load_n(b.count_tag(static_cast<int>(q), 0, 0), __ATOMIC_ACQUIRE));
      };
      const test::Problem p =
          test::make_problem(3, 6, 16, cfg.dtype, {6, 5, 4}, 2, test::Routing::kUniform, 3);
      std::vector<std::unique_ptr<gpu_test::RankInputs>> in;
      std::vector<DispatchArgs> args;
      for (int r = 0; r < 3; ++r) {
        in.push_back(std::make_unique<gpu_test::RankInputs>(p, r, l));
        for (TensorView* v :
             {&in.back()->args.x, &in.back()->args.topk_idx, &in.back()->args.topk_weights})
          v->device = cfg.device;
        args.push_back(in.back()->args);
      }
      b.dispatch(args, cuda_hd::kSend);
      const uint32_t tag = protocol::tag_of(0);
      for (int q = 1; q < 3; ++q) {
        ASSERT_EQ(*b.count_tag(q, 0, 0), tag);  // it did arrive, later
        if (pl == Placement::kPerSource)
          EXPECT_EQ(seen[q].load(), 0u)
              << "rank " << q << "'s send waited for late rank 0 (" << layout_name(l) << ")";
        else
          EXPECT_EQ(seen[q].load(), tag) << "compact: rank " << q << " cannot finish first";
      }
      b.after_launch = nullptr;
      b.set_start_delay(0, 0);
      b.dispatch({}, cuda_hd::kRecv);
      b.check_error();
      const std::vector<DispatchResult> res = b.results();
      std::vector<CombineArgs> cargs;
      for (int d = 0; d < 3; ++d) {
        const std::vector<char> comb = gpu_test::check_dispatch(p, d, res[static_cast<size_t>(d)],
                                                                b.num_recv_rows(d), 2, 18, 2);
        CombineArgs a{b.combine_buffer(d), res[static_cast<size_t>(d)].handle};
        gpu_test::upload(a.x.data, comb.data(), comb.size());
        cargs.push_back(a);
      }
      b.combine(cargs, cuda_hd::kCombSend | cuda_hd::kCombRecv);
      b.check_error();
      for (int r = 0; r < 3; ++r)
        gpu_test::check_combine(p, r, b.output(r), test::expected_combine(p, r, l));
    }
}

// An expert id past num_experts and a repeated id: routed nowhere by every role (the call
// completes, nothing out of bounds), reported as InvalidArgument.
TEST(KernelsOnCpuErrors, BadExpertIdsAreReportedAndRoutedNowhere) {
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, 0};
  cfg.max_tokens_per_rank = 6;
  cfg.hidden = 16;
  cfg.num_experts = 4;
  cfg.max_topk = 2;
  SimBuffer b(2, cfg, false);
  test::Problem p = test::make_problem(2, 4, 16, cfg.dtype, {6, 6}, 2, test::Routing::kUniform, 2);
  p.inputs[1].topk_idx[3] = 99;
  p.inputs[0].topk_idx[5] = p.inputs[0].topk_idx[4];
  std::vector<std::unique_ptr<gpu_test::RankInputs>> in;
  const std::vector<DispatchArgs> args = device_args(p, cfg, in);
  b.dispatch(args, cuda_hd::kSend | cuda_hd::kRecv);
  EXPECT_THROW(b.check_error(), InvalidArgument);
  // What arrived is what the sanitized routing says: the reference with those ids dropped.
  p.inputs[1].topk_idx[3] = -1;
  p.inputs[0].topk_idx[5] = -1;
  const std::vector<DispatchResult> res = b.results();
  for (int d = 0; d < 2; ++d)
    EXPECT_NO_THROW(
        gpu_test::check_dispatch(p, d, res[static_cast<size_t>(d)], b.num_recv_rows(d), 2, 12, 2));
}

// The GPU suite's back-to-back pattern: calls enqueued one after another, the combine input is
// the dispatch output itself (identity experts), one check at the end (gpu_support's
// expected_identity, which the GPU test relies on, is exercised here too).
TEST(KernelsOnCpuBackToBack, IdentityExpertsManyCalls) {
  for (Layout l : {Layout::kThroughput, Layout::kLatency}) {
    BufferConfig cfg;
    cfg.device = {DeviceType::kCuda, 0};
    cfg.max_tokens_per_rank = 5;
    cfg.hidden = 48;
    cfg.num_experts = 12;
    cfg.max_topk = 3;
    cfg.initial_epoch = 0xFFFFFFFFull - 6;  // crosses the wrap-around on the way
    SimBuffer b(4, cfg, false);
    const test::Problem p =
        test::make_problem(4, 12, 48, cfg.dtype, {5, 5, 5, 5}, 3, test::Routing::kWithDrops, 9);
    std::vector<std::unique_ptr<gpu_test::RankInputs>> in;
    std::vector<DispatchArgs> args;
    for (int r = 0; r < 4; ++r) {
      in.push_back(std::make_unique<gpu_test::RankInputs>(p, r, l));
      for (TensorView* v :
           {&in.back()->args.x, &in.back()->args.topk_idx, &in.back()->args.topk_weights})
        v->device = cfg.device;
      args.push_back(in.back()->args);
    }
    for (int i = 0; i < 20; ++i) {
      b.dispatch(args, cuda_hd::kSend);
      b.dispatch({}, cuda_hd::kRecv);
      std::vector<CombineArgs> c;
      for (const DispatchResult& r : b.results()) c.push_back({r.recv_x, r.handle});
      b.combine(c, cuda_hd::kCombSend);
      b.combine({}, cuda_hd::kCombRecv);
    }
    b.check_error();
    for (int r = 0; r < 4; ++r)
      gpu_test::check_combine(p, r, b.output(r), gpu_test::expected_identity(p, r, l));
  }
}

}  // namespace
}  // namespace ubep
