// Bad input gets a clear InvalidArgument naming the bad value; the group and buffer stay usable.
// A peer that never arrives gives a TimeoutError, not a hang.
#include <gtest/gtest.h>

#include "expect_invalid.hpp"
#include "harness.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep::test {
namespace {

class BadInput : public ::testing::TestWithParam<Impl> {};

TEST_P(BadInput, RejectedWithTheValueAndBufferStaysUsable) {
  const Impl impl = GetParam();
  Case c;
  c.experts = 8;
  c.hidden = 16;
  c.capacity = 4;
  c.topk = 2;
  c.tokens = {4, 4};
  const Problem p = make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, c.routing, 11);
  run_on_threads(2, [&](Group& g) {
    std::unique_ptr<Buffer> buf;
    std::unique_ptr<AlltoallBaseline> base;
    if (impl == Impl::kBaseline)
      base = std::make_unique<AlltoallBaseline>(g, config_for(c, Algorithm::kBsp));
    else
      buf = std::make_unique<Buffer>(
          g, config_for(c, impl == Impl::kBsp ? Algorithm::kBsp : Algorithm::kUbep));
    auto dispatch = [&](const DispatchArgs& a) {
      return buf ? buf->dispatch(a) : base->dispatch(a);
    };
    const RankInput& in = p.inputs[static_cast<size_t>(g.rank())];
    const DispatchArgs good = in.args(c.dtype, c.hidden, c.layout);

    auto with_expert = [&](int64_t e) {
      std::vector<int64_t> idx = in.topk_idx;
      idx[3] = e;
      DispatchArgs a = good;
      a.topk_idx = on_test_device(TensorView(idx.data(), DType::kInt64, {4, 2}));
      dispatch(a);
    };
    expect_invalid([&] { with_expert(8); }, "expert id 8");
    if (buf) {  // the baseline validates with the same routine; the Buffer also checks devices
      DispatchArgs np = good;
      np.topk_idx.data = nullptr;
      expect_invalid([&] { dispatch(np); }, "topk_idx has no data");
      np = good;
      np.topk_weights.data = nullptr;
      expect_invalid([&] { dispatch(np); }, "topk_weights has no data");
      np = good;
      np.x.device = Device{DeviceType::kCuda, 1};
      expect_invalid([&] { dispatch(np); },
                     {"x is on cuda:1", "the buffer on " + test_device().describe()});
    }
    expect_invalid([&] { with_expert(-2); }, "expert id -2");
    run_and_check(g, c, p, buf.get(), base.get());  // still usable

    std::vector<float> big_x(5 * 16, 0.0f);
    std::vector<int64_t> big_idx(5 * 2, 0);
    std::vector<float> big_w(5 * 2, 0.0f);
    DispatchArgs a = good;
    a.x = on_test_device(TensorView(big_x.data(), DType::kFP32, {5, 16}));
    a.topk_idx = on_test_device(TensorView(big_idx.data(), DType::kInt64, {5, 2}));
    a.topk_weights = on_test_device(TensorView(big_w.data(), DType::kFP32, {5, 2}));
    expect_invalid([&] { dispatch(a); }, "num_tokens 5");

    a = good;
    a.x = on_test_device(TensorView(in.x_f32.data(), DType::kFP32, {2, 32}));
    expect_invalid([&] { dispatch(a); }, "hidden size 32");
    a = good;
    a.x = on_test_device(TensorView(in.x_f32.data(), DType::kBF16, {4, 16}));
    expect_invalid([&] { dispatch(a); }, "dtype bf16");
    a = good;
    a.topk_weights = on_test_device(TensorView(in.topk_weights.data(), DType::kFP32, {4, 1}));
    expect_invalid([&] { dispatch(a); }, "topk_weights shape");
    a = good;
    std::vector<int64_t> dup = in.topk_idx;
    dup[0] = dup[1] = 5;
    a.topk_idx = on_test_device(TensorView(dup.data(), DType::kInt64, {4, 2}));
    expect_invalid([&] { dispatch(a); }, "appears twice");
    run_and_check(g, c, p, buf.get(), base.get());

    // A dispatch rejected for an id of its last token, between a dispatch and its combine: the
    // combine still matches the reference. On the host engine Routing::build checks every id
    // before any of its arrays change (filled first, the earlier tokens' routing would be the
    // rejected call's); on kernel devices the ids are checked before the call takes a sequence
    // number (taken first, the earlier dispatch's handle was stale and its combine refused,
    // and the gap let a rank's next call overwrite a window half its peer still read: a hang in
    // 2 of 4 runs). Repeated, so that calls run back to back through both window halves.
    std::vector<int64_t> late_dup = in.topk_idx;
    late_dup[6] = late_dup[7] = 3;
    a = good;
    a.topk_idx = on_test_device(TensorView(late_dup.data(), DType::kInt64, {4, 2}));
    for (int round = 0; round < 8; ++round)
      run_and_check(g, c, p, buf.get(), base.get(), false, {},
                    [&] { expect_invalid([&] { dispatch(a); }, "appears twice for token 3"); });

    // Combine with the wrong shape or a stale handle.
    DispatchResult r = dispatch(good);
    std::vector<float> wrong(static_cast<size_t>(r.num_recv_rows + 1) * 16, 0.0f);
    auto combine = [&](const CombineArgs& ca) {
      return buf ? buf->combine(ca) : base->combine(ca);
    };
    expect_invalid(
        [&] {
          combine({TensorView(wrong.data(), DType::kFP32, {r.num_recv_rows + 1, 16}), r.handle});
        },
        "combine: x");
    expect_invalid(
        [&] {
          combine({TensorView(wrong.data(), DType::kFP32, {r.num_recv_rows, 16}), r.handle + 7});
        },
        "handle");
    run_and_check(g, c, p, buf.get(), base.get());
  });
}

INSTANTIATE_TEST_SUITE_P(All, BadInput, ::testing::Values(Impl::kBsp, Impl::kUbep, Impl::kBaseline),
                         [](const auto& i) { return std::string(impl_name(i.param)); });

TEST(BadConfig, RejectedWithTheValue) {
  run_on_threads(2, [&](Group& g) {
    BufferConfig cfg;
    cfg.num_experts = 7;
    expect_invalid([&] { Buffer b(g, cfg); }, "num_experts 7");
    cfg.num_experts = 8;
    cfg.max_tokens_per_rank = 0;
    expect_invalid([&] { Buffer b(g, cfg); }, "max_tokens_per_rank must be >= 1, got 0");
  });
}

TEST(BadConfig, RanksThatDisagreeAreNamed) {
  run_on_threads(2, [&](Group& g) {
    BufferConfig cfg;
    cfg.num_experts = 8;
    cfg.hidden = g.rank() == 0 ? 64 : 96;
    expect_invalid([&] { Buffer b(g, cfg); },
                   "ranks disagree on hidden: rank 0 has 64, rank 1 has 96");
  });
}

// The CUDA kernels combine each dispatch at most once (kernel_engine.cpp says why); the host
// engine combines one again (test_repeat_combine.cpp), but not across hosts (below).
TEST(BadCall, SecondCombineOfOneDispatchIsRejectedOnKernelDevices) {
  if (test_device().type == DeviceType::kCpu)
    GTEST_SKIP() << "the cpu device combines a dispatch again: test_repeat_combine";
  Case c;
  c.tokens = {4, 4};
  c.capacity = 4;
  const Problem p = make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, c.routing, 21);
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
    run_on_threads(2, [&](Group& g) {
      Buffer b(g, config_for(c, algo));
      DispatchResult r =
          b.dispatch(p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout));
      b.combine({r.recv_x, r.handle});
      expect_invalid([&] { b.combine({r.recv_x, r.handle}); }, "already combined");
      run_and_check(g, c, p, &b, nullptr);  // still usable
    });
  }
}

// CombineArgs::out: a wrong shape is named; the kernel devices keep y in Buffer memory.
TEST(BadCall, CombineOutIsChecked) {
  Case c;
  c.tokens = {4, 4};
  c.capacity = 4;
  const Problem p = make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, c.routing, 23);
  run_on_threads(2, [&](Group& g) {
    Buffer b(g, config_for(c, Algorithm::kUbep));
    DispatchResult r =
        b.dispatch(p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout));
    std::vector<float> mine(static_cast<size_t>(4 * c.hidden));
    CombineArgs a{r.recv_x, r.handle};
    a.out = on_test_device(TensorView(mine.data(), c.dtype, {3, c.hidden}));
    if (test_device().type == DeviceType::kCpu)
      expect_invalid([&] { b.combine(a); }, "combine: out must be fp32 [4, 16]");
    else
      expect_invalid([&] { b.combine(a); }, "out is the cpu device's");
    a.out = {};
    b.combine(a);  // still usable
  });
}

TEST(BadCall, SecondCombineAcrossHostsIsRejected) {
  if (test_device().type != DeviceType::kCpu) GTEST_SKIP() << "the relay is the host engine's";
  Case c;
  c.tokens = {4, 4};
  c.capacity = 4;
  const Problem p = make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, c.routing, 22);
  GroupOptions opts;
  opts.ranks_per_host = 1;
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
    run_on_threads(
        2,
        [&](Group& g) {
          Buffer b(g, config_for(c, algo));
          DispatchResult r =
              b.dispatch(p.inputs[static_cast<size_t>(g.rank())].args(c.dtype, c.hidden, c.layout));
          b.combine({r.recv_x, r.handle});
          expect_invalid(
              [&] {
                b.combine({r.recv_x, r.handle});
              },
              "already combined; a repeated combine of one dispatch needs the group "
              "on one host, this one spans 2");
        },
        opts);
  }
}

TEST(Timeout, MissingPeerGivesTimeoutErrorNotAHang) {
  for (Algorithm algo : {Algorithm::kBsp, Algorithm::kUbep}) {
    Case c;
    c.tokens = {4, 4};
    c.capacity = 4;
    const Problem p = make_problem(2, c.experts, c.hidden, c.dtype, c.tokens, c.topk, c.routing, 3);
    GroupOptions opts;
    opts.timeout = std::chrono::milliseconds(300);
    std::atomic<bool> timed_out{false}, done{false};
    run_on_threads(
        2,
        [&](Group& g) {
          Buffer b(g, config_for(c, algo));
          if (g.rank() == 1) {
            // Never arrives, and keeps its Buffer (a destroyed one would publish its
            // departure, and rank 0 would stop at once): a hung peer. Bounded wait.
            for (int i = 0; i < 20000 && !done; ++i)
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            return;
          }
          try {
            b.dispatch(p.inputs[0].args(c.dtype, c.hidden, c.layout));
          } catch (const TimeoutError& e) {
            timed_out = true;
            EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
          }
          done = true;
        },
        opts);
    EXPECT_TRUE(timed_out) << algorithm_name(algo);
  }
}

}  // namespace
}  // namespace ubep::test
