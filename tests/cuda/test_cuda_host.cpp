// CPU-side tests of the CUDA backend: everything that is not a kernel. The shared host/device
// code (bf16 conversions, the fixed-order sum step, window/scratch maps, placement arithmetic,
// kernel parameters) is compiled here for the host and checked against the CPU backend and the
// independent reference; the host logic (argument checks, launch sizing, result views, error
// words -> exceptions) runs as is. No GPU needed: these run in CI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "backend/cpu/row_kernels.hpp"
#include "backend/cuda/hd_math.hpp"
#include "backend/cuda/host_logic.hpp"
#include "backend/cuda/sequencer.hpp"
#include "ep/routing.hpp"
#include "reference.hpp"
#include "sequencer_rig.hpp"
#include "ubep/bf16.hpp"
#include "ubep/error.hpp"

namespace ubep {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(CudaHd, Bf16ToFloatMatchesLibraryForEveryValue) {
  for (uint32_t v = 0; v <= 0xFFFFu; ++v)
    ASSERT_EQ(bits(cuda_hd::bf16_to_float(static_cast<uint16_t>(v))),
              bits(bf16_to_float(static_cast<uint16_t>(v))))
        << v;
}

TEST(CudaHd, FloatToBf16MatchesLibrary) {
  // Every 2^32/65521-th bit pattern (covers every exponent, NaNs and infinities), plus every
  // tie of the rounding (low 16 bits 0x8000) and its neighbours around one exponent range.
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 65521)
    ASSERT_EQ(cuda_hd::float_to_bf16(from_bits(static_cast<uint32_t>(b))),
              float_to_bf16(from_bits(static_cast<uint32_t>(b))))
        << std::hex << b;
  for (uint32_t hi = 0x3F00; hi < 0x4100; ++hi)
    for (uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u, 0x0000u, 0xFFFFu}) {
      const float f = from_bits(hi << 16 | lo);
      ASSERT_EQ(cuda_hd::float_to_bf16(f), float_to_bf16(f)) << std::hex << (hi << 16 | lo);
      ASSERT_EQ(cuda_hd::float_to_bf16(-f), float_to_bf16(-f));
    }
  for (uint32_t special : {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu,
                           0x00000001u, 0x80000000u, 0x7F7FFFFFu})
    EXPECT_EQ(cuda_hd::float_to_bf16(from_bits(special)), float_to_bf16(from_bits(special)));
}

// The kernel's per-element recipe (add_term / add_weighted_term from 0, one final rounding)
// against the CPU backend's reduce_rows, bit for bit, for both dtypes, with and without weights.
TEST(CudaHd, FixedOrderSumMatchesCpuBackend) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> val(-3.0f, 3.0f);
  for (DType dt : {DType::kBF16, DType::kFP32})
    for (int n : {0, 1, 2, 3, 5, 8, 13, 64})
      for (bool weighted : {false, true}) {
        const int64_t H = 777;
        std::vector<std::vector<char>> rows(static_cast<size_t>(n),
                                            std::vector<char>(static_cast<size_t>(H) * 4));
        std::vector<const void*> ptrs;
        std::vector<float> w;
        for (auto& r : rows) {
          for (int64_t h = 0; h < H; ++h) store_value(r.data(), h, val(rng), dt);
          ptrs.push_back(r.data());
          w.push_back(val(rng));
        }
        std::vector<char> cpu(static_cast<size_t>(H) * 4), hd(cpu.size());
        kernels::reduce_rows(cpu.data(), dt, H, ptrs.data(), weighted ? w.data() : nullptr, n);
        for (int64_t h = 0; h < H; ++h) {
          float acc = 0.0f;
          for (int i = 0; i < n; ++i) {
            const float v = load_value(ptrs[static_cast<size_t>(i)], h, dt);
            acc = weighted ? cuda_hd::add_weighted_term(acc, w[static_cast<size_t>(i)], v)
                           : cuda_hd::add_term(acc, v);
          }
          if (dt == DType::kBF16) {
            const uint16_t b = cuda_hd::float_to_bf16(acc);
            std::memcpy(hd.data() + 2 * h, &b, 2);
          } else {
            std::memcpy(hd.data() + 4 * h, &acc, 4);
          }
        }
        ASSERT_EQ(std::memcmp(cpu.data(), hd.data(), static_cast<size_t>(H) * dtype_size(dt)), 0)
            << dtype_name(dt) << " n=" << n << " weighted=" << weighted;
      }
}

TEST(CudaHd, ScratchRegionsAreDisjointAlignedAndInside) {
  for (auto [R, El, K, T] :
       {std::tuple{2, 4, 2, 7}, std::tuple{8, 32, 8, 128}, std::tuple{16, 1, 64, 4096}}) {
    const cuda_hd::ScratchLayout s(R, El, K, T);
    const std::vector<std::pair<size_t, size_t>> regions = {
        {s.idx, size_t(T) * K * 4},
        {s.w, size_t(T) * K * 4},
        {s.expert_slot, size_t(T) * K * 4},
        {s.dest_slot, size_t(T) * R * 4},
        {s.dest_tokens, size_t(R) * T * 4},
        {s.dest_rows, size_t(R) * 4},
        {s.dest_expert_rows, size_t(R) * El * 4},
        {s.row_offset_at, size_t(R) * 8},
        {s.expert_offset_at, size_t(R) * El * 8},
        {s.recv_count, size_t(El) * 8},
        {s.recv_range, size_t(R) * El * 16},
        {s.info, 32},
        {s.routing_done, cuda_hd::kMaxBlocksPerRank * 4},
        {s.offsets_ready, size_t(R) * 4}};
    for (size_t i = 0; i < regions.size(); ++i) {
      EXPECT_EQ(regions[i].first % 128, 0u);
      EXPECT_LE(regions[i].first + regions[i].second, s.total);
      if (i + 1 < regions.size()) {
        EXPECT_LE(regions[i].first + regions[i].second, regions[i + 1].first);
      }
    }
  }
}

TEST(CudaHd, LaunchParamsFitTheKernelParameterLimit) {
  // 4 KiB is the classic limit for __global__ parameters (sm_70+ allow 32 KiB with CUDA 12.1+).
  EXPECT_LE(sizeof(cuda_hd::LaunchParams), 4096u);
  EXPECT_EQ(cuda_hd::sanitize_expert(-1, 8), -1);
  EXPECT_EQ(cuda_hd::sanitize_expert(8, 8), -1);
  EXPECT_EQ(cuda_hd::sanitize_expert(-7, 8), -1);
  EXPECT_EQ(cuda_hd::sanitize_expert(7, 8), 7);
  // Token 0: 3, 5, 3 (repeat), 9 (out of range), -1; token 1: 3 (a repeat of token 0 is fine).
  const int64_t idx[10] = {3, 5, 3, 9, -1, 3, 0, 1, 2, 4};
  const int32_t want[10] = {3, 5, -1, -1, -1, 3, 0, 1, 2, 4};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(cuda_hd::expert_at(idx, i / 5, i % 5, 5, 8), want[i]) << i;
}

// ---- host logic ---------------------------------------------------------------------------

using cuda_test::cuda_config;

TEST(CudaHost, ConfigChecks) {
  BufferConfig cfg = cuda_config();
  EXPECT_NO_THROW(cuda_host::check_config(cfg, 4, 4));
  EXPECT_THROW(cuda_host::check_config(cfg, 3, 3), InvalidArgument);    // 8 experts, 3 ranks
  EXPECT_THROW(cuda_host::check_config(cfg, 32, 32), InvalidArgument);  // > kMaxVirtualRanks
  cfg.device = {};
  EXPECT_THROW(cuda_host::check_config(cfg, 4, 4), InvalidArgument);  // cpu device
  cfg = cuda_config();
  cfg.dtype = DType::kInt32;
  EXPECT_THROW(cuda_host::check_config(cfg, 4, 4), InvalidArgument);
}

TEST(CudaHost, DispatchArgumentChecksNameTheProblem) {
  const BufferConfig cfg = cuda_config();
  std::vector<char> mem(1024);
  auto dev = [&](DType t, std::initializer_list<int64_t> dims, Device d = {DeviceType::kCuda, 0}) {
    TensorView v(mem.data(), t, dims);
    v.device = d;
    return v;
  };
  DispatchArgs a;
  a.x = dev(DType::kBF16, {4, 16});
  a.topk_idx = dev(DType::kInt64, {4, 2});
  a.topk_weights = dev(DType::kFP32, {4, 2});
  EXPECT_NO_THROW(cuda_host::check_dispatch(a, cfg, 0));
  DispatchArgs b = a;
  b.x.device = {};
  try {
    cuda_host::check_dispatch(b, cfg, 3);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x is on cpu"), std::string::npos) << e.what();
  }
  b = a;
  b.x = dev(DType::kBF16, {9, 16});  // more than max_tokens_per_rank
  b.topk_idx = dev(DType::kInt64, {9, 2});
  b.topk_weights = dev(DType::kFP32, {9, 2});
  EXPECT_THROW(cuda_host::check_dispatch(b, cfg, 0), InvalidArgument);
  b = a;
  b.topk_idx = dev(DType::kInt64, {4, 3});  // topk > max_topk
  EXPECT_THROW(cuda_host::check_dispatch(b, cfg, 0), InvalidArgument);
  b = a;
  b.topk_weights = dev(DType::kFP32, {4, 1});
  EXPECT_THROW(cuda_host::check_dispatch(b, cfg, 0), InvalidArgument);
  b = a;
  b.x = dev(DType::kFP32, {4, 16});
  EXPECT_THROW(cuda_host::check_dispatch(b, cfg, 0), InvalidArgument);
}

TEST(CudaHost, LaunchSizing) {
  EXPECT_EQ(cuda_host::blocks_per_rank(0, 132, 8), 16);
  EXPECT_EQ(cuda_host::blocks_per_rank(4, 132, 8), 4);
  EXPECT_EQ(cuda_host::blocks_per_rank(100, 132, 2), 64);  // capped: routing_done has 64 slots
  EXPECT_EQ(cuda_host::blocks_per_rank(0, 264, 1), cuda_hd::kMaxBlocksPerRank);
  EXPECT_THROW(cuda_host::blocks_per_rank(0, 7, 8), InvalidArgument);  // not co-resident
  EXPECT_EQ(cuda_host::dispatch_smem(16, 8, 32), 16u * (256 + 32) * 4);
}

TEST(CudaHost, ResultViewsPointIntoTheWindowHalf) {
  BufferConfig cfg = cuda_config();
  const protocol::WindowLayout m = cuda_host::window_layout(cfg, 4);
  char* base = reinterpret_cast<char*>(uintptr_t{1} << 20);
  char* rc = reinterpret_cast<char*>(uintptr_t{1} << 30);
  for (int half : {0, 1}) {
    DispatchResult r = cuda_host::dispatch_views(m, cfg, base, half, Layout::kThroughput,
                                                 Placement::kCompact, 2, rc, rc + 4096, 42);
    EXPECT_EQ(r.recv_x.data, base + half * m.half_bytes + m.tp_x);
    EXPECT_EQ(r.recv_x.dim(0), 4 * 8);
    EXPECT_EQ(r.recv_topk_idx.data, base + half * m.half_bytes + m.tp_idx);
    EXPECT_EQ(r.recv_topk_idx.dim(1), 2);
    EXPECT_EQ(r.recv_src.data, base + half * m.half_bytes + m.tp_src);
    EXPECT_EQ(r.recv_count.data, rc);
    EXPECT_EQ(r.recv_count.device, cfg.device);
    EXPECT_EQ(r.handle, 42u);
    EXPECT_EQ(r.num_recv_rows, -1);
    r = cuda_host::dispatch_views(m, cfg, base, half, Layout::kLatency, Placement::kPerSource, 2,
                                  rc, rc + 4096, 42);
    EXPECT_EQ(r.recv_x.data, base + half * m.half_bytes + m.lat_x);
    EXPECT_EQ(r.recv_x.ndim, 3);
    EXPECT_EQ(r.recv_x.dim(0), 2);
    const TensorView c = cuda_host::combine_view(m, cfg, base, half, Layout::kLatency);
    EXPECT_EQ(c.data, base + half * m.half_bytes + m.comb_x);
    EXPECT_EQ(c.shape, r.recv_x.shape);
  }
}

TEST(CudaHost, ErrorWordsBecomeExceptionsNamingPeerAndMessage) {
  cuda_hd::ErrorInfo e{};
  EXPECT_NO_THROW(cuda_host::throw_if_error(e, 1.0));
  e.code = cuda_hd::kTimeout;
  e.rank = 2;
  e.peer = 1;
  e.what = cuda_hd::kWaitCount;
  e.index = 2;
  e.tag = 77;
  try {
    cuda_host::throw_if_error(e, 1.5);
    FAIL();
  } catch (const TimeoutError& x) {
    const std::string m = x.what();
    EXPECT_NE(m.find("rank 2 timed out after 1.5 s"), std::string::npos) << m;
    EXPECT_NE(m.find("count record of rank 1 at rank 2"), std::string::npos) << m;
    EXPECT_NE(m.find("epoch tag 77"), std::string::npos) << m;
  }
  e.what = cuda_hd::kWaitCombineRow;
  e.index = 5;
  EXPECT_NE(cuda_host::describe(e, 1).find("combine row of token 5 at rank 1"), std::string::npos);
  e.code = cuda_hd::kBadExpert;
  EXPECT_THROW(cuda_host::throw_if_error(e, 1.0), InvalidArgument);
  e.code = cuda_hd::kTopkMismatch;
  EXPECT_THROW(cuda_host::throw_if_error(e, 1.0), InvalidArgument);
}

// The call state machine the engine launches from: misuse is refused before any launch, and the
// parameters carry the epoch (tag, half), fresh generations and bsp's barrier counts.
TEST(CudaHost, SequencerStateAndParameters) {
  BufferConfig cfg = cuda_config();
  cfg.initial_epoch = 0xFFFFFFFEull;
  cfg.algorithm = Algorithm::kBsp;
  cuda_test::SequencerRig rig(cfg, 4096);
  cuda_host::Sequencer& q = rig.q;
  const DispatchArgs a = rig.dispatch_args(Layout::kThroughput);
  const std::vector<DispatchArgs> args{a, a};
  const cuda_host::LaunchResources res;
  EXPECT_THROW(q.dispatch({}, cuda_hd::kRecv, res), InvalidArgument);     // recv without send
  EXPECT_THROW(q.combine({}, cuda_hd::kCombSend, res), InvalidArgument);  // no dispatch yet
  EXPECT_THROW(q.dispatch(std::span(args).first(1), cuda_hd::kSend, res), InvalidArgument);
  const cuda_hd::LaunchParams p1 = q.dispatch(args, cuda_hd::kSend, res);
  EXPECT_EQ(p1.tag, protocol::tag_of(0xFFFFFFFEull));
  EXPECT_EQ(p1.half, 0);
  EXPECT_EQ(p1.gen, 1u);
  EXPECT_EQ(p1.barrier_seq, 1u);
  EXPECT_TRUE(p1.bsp);
  EXPECT_EQ(p1.io[1].tokens, 4);
  EXPECT_THROW(q.dispatch(args, cuda_hd::kSend, res), InvalidArgument);  // recv outstanding
  q.dispatch({}, cuda_hd::kRecv, res);
  std::vector<CombineArgs> c(2);
  for (int i = 0; i < 2; ++i)
    c[static_cast<size_t>(i)] = {q.results()[static_cast<size_t>(i)].recv_x, 999};
  EXPECT_THROW(q.combine(c, cuda_hd::kCombSend, res), InvalidArgument);  // wrong handle
  for (auto& x : c) x.handle = q.results()[0].handle;
  const cuda_hd::LaunchParams pc = q.combine(c, cuda_hd::kCombSend | cuda_hd::kCombRecv, res);
  EXPECT_EQ(pc.barrier_seq, 3u);  // after the dispatch's two group barriers
  EXPECT_THROW(q.combine(c, cuda_hd::kCombSend, res), InvalidArgument);  // at most once
  const cuda_hd::LaunchParams p2 = q.dispatch(args, cuda_hd::kSend | cuda_hd::kRecv, res);
  EXPECT_EQ(p2.tag, protocol::tag_of(0xFFFFFFFFull));
  EXPECT_NE(p2.tag, p1.tag);
  EXPECT_EQ(p2.half, 1);
  EXPECT_EQ(p2.gen, 2u);
  EXPECT_EQ(p2.barrier_seq, 4u);
  const cuda_hd::LaunchParams p3 = q.dispatch(args, cuda_hd::kSend | cuda_hd::kRecv, res);
  EXPECT_NE(p3.tag, 0u);      // across the 32-bit wrap-around, never 0
  EXPECT_NE(p3.tag, p1.tag);  // same half as p1, different tag
  EXPECT_EQ(p3.half, p1.half);
}

}  // namespace
}  // namespace ubep
