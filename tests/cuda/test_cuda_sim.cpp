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

#include <random>
#include <span>
#include <thread>

#include "backend/cuda/combine.cuh"
#include "backend/cuda/host_logic.hpp"
#include "gpu_support.hpp"

namespace ubep {
namespace {

using cuda_hd::LaunchParams;

// The engine (src/backend/cuda/engine.cu) without the CUDA runtime.
class SimBuffer {
 public:
  SimBuffer(int R, const BufferConfig& cfg, bool ipc, int bpr = 2, int threads = 64)
      : R_(R),
        cfg_(cfg),
        ipc_(ipc),
        bpr_(bpr),
        threads_(threads),
        map_(cuda_host::window_layout(cfg, R)),
        smap_(cuda_host::scratch_layout(cfg, R)),
        windows_(static_cast<size_t>(R) * map_.total),
        scratch_(static_cast<size_t>(R) * smap_.total),
        y_(static_cast<size_t>(R * cfg.max_tokens_per_rank) * map_.row_bytes),
        io_(static_cast<size_t>(R)),
        recv_rows_(static_cast<size_t>(R), -1),
        next_seq_(cfg.initial_epoch) {
    cuda_host::check_config(cfg, R, ipc ? 1 : R);
    for (int r = 0; r < R; ++r) {
      bases_.push_back(static_cast<char*>(windows_.p) + static_cast<size_t>(r) * map_.total);
      io_[static_cast<size_t>(r)].scratch =
          static_cast<char*>(scratch_.p) + static_cast<size_t>(r) * smap_.total;
      io_[static_cast<size_t>(r)].y =
          static_cast<char*>(y_.p) +
          static_cast<size_t>(r * cfg.max_tokens_per_rank) * map_.row_bytes;
    }
    errors_.resize(static_cast<size_t>(ipc ? R : 1));
    claims_.assign(errors_.size(), 0u);
  }
  Algorithm algorithm = Algorithm::kUbep;
  SyncMode sync = SyncMode::kFused;
  long long timeout_ns = 20'000'000'000LL;  // clock64 counts ns in the simulation
  void set_start_delay(int r, uint32_t ns) { io_[static_cast<size_t>(r)].start_delay_ns = ns; }

  void dispatch(std::span<const DispatchArgs> args, uint32_t phases) {
    if (phases & cuda_hd::kSend) {
      seq_ = next_seq_++;
      if (++gen_ == 0) gen_ = 1;
      layout_ = args[0].layout;
      for (int r = 0; r < R_; ++r) {
        const DispatchArgs& a = args[static_cast<size_t>(r)];
        cuda_host::check_dispatch(a, cfg_, r);
        cuda_hd::RankIO& io = io_[static_cast<size_t>(r)];
        io.x = a.x.data;
        io.topk_idx = a.topk_idx.as<const int64_t>();
        io.topk_w = a.topk_weights.as<const float>();
        io.tokens = a.x.dim(0);
        io.topk = static_cast<int>(a.topk_idx.dim(1));
      }
    }
    run(phases, true);
    if (algorithm == Algorithm::kBsp && (phases & cuda_hd::kSend)) barrier_seq_ += 2;
  }
  void combine(const std::vector<CombineArgs>& args, uint32_t phases) {
    if (phases & cuda_hd::kCombSend)
      for (int r = 0; r < R_; ++r)
        io_[static_cast<size_t>(r)].comb_in = args[static_cast<size_t>(r)].x.data;
    run(phases, false);
    if (algorithm == Algorithm::kBsp) barrier_seq_ += 1;
  }
  std::vector<DispatchResult> results() {
    std::vector<DispatchResult> out;
    for (int r = 0; r < R_; ++r)
      out.push_back(cuda_host::dispatch_views(
          map_, cfg_, bases_[static_cast<size_t>(r)], ep::half_of(seq_), layout_,
          io_[static_cast<size_t>(r)].topk,
          smap_.at<char>(io_[static_cast<size_t>(r)].scratch, smap_.recv_count), seq_ + 1));
    return out;
  }
  TensorView combine_buffer(int r) const {
    return cuda_host::combine_view(map_, cfg_, bases_[static_cast<size_t>(r)], ep::half_of(seq_),
                                   layout_);
  }
  TensorView output(int r) const {
    TensorView v(io_[static_cast<size_t>(r)].y, cfg_.dtype,
                 {io_[static_cast<size_t>(r)].tokens, cfg_.hidden});
    v.device = cfg_.device;
    return v;
  }
  int64_t num_recv_rows(int r) const { return recv_rows_[static_cast<size_t>(r)]; }
  void check_error() const {
    for (const auto& e : errors_)
      cuda_host::throw_if_error(e, static_cast<double>(timeout_ns) * 1e-9);
  }

 private:
  LaunchParams params(uint32_t phases, int first, int local, size_t e) {
    LaunchParams p;
    p.map = map_;
    p.scratch = smap_;
    p.bases = bases_.data();
    p.ranks = R_;
    p.first_rank = first;
    p.local_ranks = local;
    p.experts = cfg_.num_experts;
    p.local_experts = cfg_.num_experts / R_;
    p.blocks_per_rank = bpr_;
    p.hidden = cfg_.hidden;
    p.elem_bytes = static_cast<int>(dtype_size(cfg_.dtype));
    p.phases = phases;
    p.tag = ep::tag_of(seq_);
    p.half = ep::half_of(seq_);
    p.gen = gen_;
    p.barrier_seq = barrier_seq_;
    p.latency = layout_ == Layout::kLatency;
    p.stop_and_wait = sync == SyncMode::kStopAndWait;
    p.bsp = algorithm == Algorithm::kBsp;
    p.timeout_cycles = timeout_ns;
    p.error = {&errors_[e], &claims_[e]};
    p.host_recv_rows = recv_rows_.data() + first;
    for (int i = 0; i < local; ++i) p.io[i] = io_[static_cast<size_t>(first + i)];
    return p;
  }
  void run(uint32_t phases, bool dispatch) {
    const size_t smem =
        cuda_host::dispatch_smem(threads_ / 32, cfg_.max_topk, cfg_.num_experts / R_);
    auto go = [&](const LaunchParams& p, int grid) {
      if (dispatch)
        sim::launch(&cuda_dev::dispatch_kernel<cuda_dev::VirtualPeers>, p, grid, threads_, smem);
      else
        sim::launch(&cuda_dev::combine_kernel<cuda_dev::VirtualPeers>, p, grid, threads_, 0);
    };
    if (!ipc_) {
      go(params(phases, 0, R_, 0), R_ * bpr_);
    } else {  // one "process" per rank, concurrently
      std::vector<std::thread> procs;
      for (int r = 0; r < R_; ++r)
        procs.emplace_back([&, r, p = params(phases, r, 1, static_cast<size_t>(r))] {
          if (dispatch)
            sim::launch(&cuda_dev::dispatch_kernel<cuda_dev::IpcPeers>, p, bpr_, threads_, smem);
          else
            sim::launch(&cuda_dev::combine_kernel<cuda_dev::IpcPeers>, p, bpr_, threads_, 0);
        });
      for (auto& t : procs) t.join();
    }
    (void)go;
  }

  int R_;
  BufferConfig cfg_;
  bool ipc_;
  int bpr_, threads_;
  ep::WindowLayout map_;
  cuda_hd::ScratchLayout smap_;
  gpu_test::DevMem windows_, scratch_, y_;
  std::vector<char*> bases_;
  std::vector<cuda_hd::RankIO> io_;
  std::vector<int64_t> recv_rows_;
  std::vector<cuda_hd::ErrorInfo> errors_;
  std::vector<uint32_t> claims_;
  uint64_t next_seq_, seq_ = 0;
  uint32_t gen_ = 0, barrier_seq_ = 1;
  Layout layout_ = Layout::kThroughput;
};

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
};

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
  SimBuffer b(R, cfg, c.ipc);
  b.algorithm = c.algo;
  b.sync = c.sync;
  if (c.delays)
    for (int r = 0; r < R; ++r)
      b.set_start_delay(r, static_cast<uint32_t>((r * 7919) % 5) * 2000000u);
  std::mt19937 rng(static_cast<unsigned>(R * 31 + c.hidden));
  for (int call = 0; call < 3; ++call) {  // three calls: both halves, then the first again
    std::vector<int64_t> tokens;
    for (int r = 0; r < R; ++r)
      tokens.push_back(call == 0 && r == 0 ? T : static_cast<int64_t>(rng() % (T + 1)));
    const test::Problem p =
        test::make_problem(R, R * El, c.hidden, c.dtype, tokens, K,
                           call == 1 ? test::Routing::kHot : test::Routing::kWithDrops, rng());
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
    for (int d = 0; d < R; ++d) {
      const std::vector<char> comb = gpu_test::check_dispatch(p, d, res[static_cast<size_t>(d)],
                                                              b.num_recv_rows(d), El, R * T, K);
      CombineArgs a{res[static_cast<size_t>(d)].recv_x, res[static_cast<size_t>(d)].handle};
      if (c.zero_copy) {
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
    SimCase big{8, l, DType::kBF16, Algorithm::kUbep, true, false, false};
    big.tokens = 5;
    big.delays = true;
    v.push_back(big);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, KernelsOnCpu, ::testing::ValuesIn(cases()));

// A rank that starts late past the timeout: the others' bounded waits report it, every other
// spinning thread gives up, the launch ends, and the host gets a TimeoutError naming the rank.
TEST(KernelsOnCpuErrors, LateRankTimesOutNamingIt) {
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, 0};
  cfg.max_tokens_per_rank = 6;
  cfg.hidden = 16;
  cfg.num_experts = 4;
  cfg.max_topk = 2;
  for (bool ipc : {false, true}) {
    SimBuffer b(2, cfg, ipc);
    b.timeout_ns = 100'000'000;  // 0.1 s
    b.set_start_delay(1, 600'000'000u);
    const test::Problem p =
        test::make_problem(2, 4, 16, cfg.dtype, {6, 6}, 2, test::Routing::kUniform, 1);
    std::vector<std::unique_ptr<gpu_test::RankInputs>> in;
    std::vector<DispatchArgs> args;
    for (int r = 0; r < 2; ++r) {
      in.push_back(std::make_unique<gpu_test::RankInputs>(p, r, Layout::kThroughput));
      for (TensorView* v :
           {&in.back()->args.x, &in.back()->args.topk_idx, &in.back()->args.topk_weights})
        v->device = cfg.device;
      args.push_back(in.back()->args);
    }
    b.dispatch(args, cuda_hd::kSend | cuda_hd::kRecv);
    try {
      b.check_error();
      FAIL() << "no timeout reported";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 timed out"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("of rank 1"), std::string::npos) << e.what();
    }
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
  std::vector<DispatchArgs> args;
  for (int r = 0; r < 2; ++r) {
    in.push_back(std::make_unique<gpu_test::RankInputs>(p, r, Layout::kThroughput));
    for (TensorView* v :
         {&in.back()->args.x, &in.back()->args.topk_idx, &in.back()->args.topk_weights})
      v->device = cfg.device;
    args.push_back(in.back()->args);
  }
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

}  // namespace
}  // namespace ubep
