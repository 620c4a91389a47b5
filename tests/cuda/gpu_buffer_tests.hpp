// The GPU test cases: ubep::Buffer on cuda:0 (BufferConfig::device), thread ranks sharing the GPU
// through run_on_threads, every rank's Buffer running the CUDA kernels through KernelEngine.
// Inputs are uploaded, results downloaded and checked bit for bit against tests/reference.cpp
// with gpu_support.hpp's checks. Part of ubep_cuda_gpu_tests (label gpu): runs only on a GPU;
// ubep_cuda_gpu_tests_on_sim runs the same cases on cuda-sim:0 (kTestDevice).
//
// Device memory of a case is allocated before its first call and freed after its Buffer is
// gone: cudaFree synchronises the whole device, so a rank freeing memory while a peer thread's
// kernel waits for this rank's next call would stall both until the kernel's timeout. The
// Buffer's destructor does not wait for its peers (a Buffer may go on any thread), so every
// rank meets the others (Group::barrier) after its last call, before anything is freed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_support.hpp"
#include "ubep/buffer.hpp"
#include "ubep/group.hpp"

namespace ubep::gpu_test {

struct Case {
  int ranks = 2;
  Layout layout = Layout::kThroughput;
  DType dtype = DType::kBF16;
  Algorithm algo = Algorithm::kUbep;
  bool split = true;  // dispatch_send/recv and combine_send/recv (ubep only)
  SyncMode sync = SyncMode::kFused;
  bool delays = false;  // every rank starts each call after a random 0-200 us sleep
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

inline BufferConfig config_for(const Case& c) {
  BufferConfig cfg;
  cfg.device = kTestDevice;
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

// Every wait inside the kernels is bounded by the group's timeout: short enough that a hung
// case fails well inside gpu_check.sh's step limit, long enough for 8 ranks sharing one GPU.
#if defined(UBEP_GPU_TESTS_ON_SIM)
inline constexpr std::chrono::milliseconds kCaseTimeout = std::chrono::seconds(120);  // CPU threads
#else
inline constexpr std::chrono::milliseconds kCaseTimeout = std::chrono::seconds(10);
#endif
// UBEP_GPU_TEST_TIMEOUT_S replaces kCaseTimeout (compute-sanitizer slows the kernels' waits).
inline std::chrono::milliseconds case_timeout() {
  const char* env = std::getenv("UBEP_GPU_TEST_TIMEOUT_S");
  const double s = env ? std::atof(env) : 0.0;
  return s > 0 ? std::chrono::milliseconds(static_cast<int64_t>(s * 1000)) : kCaseTimeout;
}
inline GroupOptions test_group(std::chrono::milliseconds timeout = case_timeout()) {
  GroupOptions o;
  o.timeout = timeout;
  return o;
}

// run_on_threads, and every rank's own error printed as it happens: the case's error is the
// earliest one that is not a timeout, often a peer's echo; the cause may be another rank's
// (a kernel timeout or a CUDA error under compute-sanitizer).
inline void run_ranks(int ranks, const std::function<void(Group&)>& fn, GroupOptions options) {
  run_on_threads(
      ranks,
      [&](Group& g) {
        try {
          fn(g);
        } catch (const std::exception& e) {
          std::cout << "    rank " << g.rank() << ": " << e.what() << std::endl;
          throw;
        }
      },
      options);
}

// One rank's device memory for all calls of a case: its inputs per call, and room for its
// combine input in any call (recv_x's capacity).
struct RankMemory {
  std::vector<std::unique_ptr<RankInputs>> inputs;
  std::unique_ptr<DevMem> combine_in;
  RankMemory(const std::vector<test::Problem>& problems, const Case& c, int rank) {
    for (const test::Problem& p : problems)
      inputs.push_back(std::make_unique<RankInputs>(p, rank, c.layout));
    const int64_t groups = c.layout == Layout::kLatency ? c.experts_per_rank : 1;
    combine_in = std::make_unique<DevMem>(static_cast<size_t>(groups * c.ranks * c.tokens) *
                                          static_cast<size_t>(c.hidden) * dtype_size(c.dtype));
  }
};

// One call on rank `me`: dispatch, check, the reference's expert function (or compact() and
// dense rows), combine, check.
inline void run_call(const Case& c, const test::Problem& p, Buffer& buf, int me,
                     const RankInputs& in, DevMem& combine_in) {
  const DispatchResult r =
      c.split ? (buf.dispatch_send(in.args), buf.dispatch_recv()) : buf.dispatch(in.args);
  const TensorView dense = c.compacted ? buf.compact() : TensorView{};
  std::vector<char> packed;
  std::vector<char> comb =
      check_dispatch(p, me, r, r.num_recv_rows, c.experts_per_rank, c.ranks * c.tokens, c.topk,
                     &packed, ResultRows::kAsBuffer);
  CombineArgs a;
  a.handle = r.handle;
  if (c.compacted) {
    check_compacted(p, me, c.layout, dense, ResultRows::kAsBuffer);
    const auto rows =
        static_cast<int64_t>(packed.size() / (static_cast<size_t>(c.hidden) * dtype_size(c.dtype)));
    a.x = on_device(combine_in.p, c.dtype, {rows, c.hidden});
    a.compacted = true;
    comb = std::move(packed);
  } else if (c.zero_copy) {
    a.x = buf.combine_buffer();
  } else {
    a.x = r.recv_x;
    a.x.data = combine_in.p;
  }
  upload(a.x.data, comb.data(), comb.size());
  const TensorView y = c.split ? (buf.combine_send(a), buf.combine_recv()) : buf.combine(a);
  check_combine(p, me, y, test::expected_combine(p, me, c.layout));
}

// Each call: a fresh problem (new routing, token counts from 0 to capacity, the first call with
// a full rank 0), made before the ranks start so every rank sees the same one.
inline void run_checked(const Case& c) {
  std::mt19937 rng(1234u + static_cast<unsigned>(c.ranks));
  std::vector<test::Problem> problems;
  std::vector<std::vector<int>> delay_us;  // [call][rank]
  for (int call = 0; call < c.calls; ++call) {
    std::vector<int64_t> tokens;
    for (int r = 0; r < c.ranks; ++r)
      tokens.push_back(static_cast<int64_t>(rng() % static_cast<uint32_t>(c.tokens + 1)));
    if (call == 0) tokens[0] = c.tokens;
    problems.push_back(test::make_problem(c.ranks, c.ranks * c.experts_per_rank, c.hidden, c.dtype,
                                          tokens, c.topk, c.routing, rng()));
    delay_us.emplace_back();
    for (int r = 0; r < c.ranks; ++r) delay_us.back().push_back(static_cast<int>(rng() % 200));
  }
  run_ranks(
      c.ranks,
      [&](Group& g) {
        const int me = g.rank();
        RankMemory mem(problems, c, me);
        Buffer buf(g, config_for(c));
        for (size_t call = 0; call < problems.size(); ++call) {
          if (c.delays)
            std::this_thread::sleep_for(
                std::chrono::microseconds(delay_us[call][static_cast<size_t>(me)]));
          run_call(c, problems[call], buf, me, *mem.inputs[call], *mem.combine_in);
        }
        g.barrier();
      },
      test_group());
}

// `c.calls` dispatch + combine pairs back to back (split phase; the combine input is the
// dispatch output itself: identity experts), then one check of the last combine.
inline void run_back_to_back(const Case& c) {
  const std::vector<int64_t> tokens(static_cast<size_t>(c.ranks), c.tokens);
  const test::Problem p = test::make_problem(c.ranks, c.ranks * c.experts_per_rank, c.hidden,
                                             c.dtype, tokens, c.topk, c.routing, 99);
  run_ranks(
      c.ranks,
      [&](Group& g) {
        const int me = g.rank();
        RankInputs in(p, me, c.layout);
        Buffer buf(g, config_for(c));
        const auto t0 = std::chrono::steady_clock::now();
        TensorView y;
        for (int i = 0; i < c.calls; ++i) {
          buf.dispatch_send(in.args);
          const DispatchResult r = buf.dispatch_recv();
          buf.combine_send({r.recv_x, r.handle});
          y = buf.combine_recv();
        }
        const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - t0;
        if (me == 0)
          std::cout << "    rank 0: " << c.calls << " calls in " << ms.count() << " ms\n";
        check_combine(p, me, y, expected_identity(p, me, c.layout));
        g.barrier();
      },
      test_group());
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

// Rank 1 starts its dispatch 2.5 s late: rank 0 times out after 0.5 s with an error naming
// rank 1. Rank 1 then either completes (rank 0's messages were all there) or learns of rank 0's
// failure from its failure word -- never by its own timeout. Rank 0 keeps its Buffer until rank
// 1's call is over, so rank 1 never writes into freed memory.
inline void run_timeout_error() {
  Case c;
  const test::Problem p = test::make_problem(2, 8, c.hidden, c.dtype, {8, 8}, c.topk, c.routing, 5);
  std::atomic<bool> late_rank_done{false};
  run_ranks(
      2,
      [&](Group& g) {
        RankInputs in(p, g.rank(), c.layout);
        Buffer buf(g, config_for(c));
        if (g.rank() == 0) {
          expect_error<TimeoutError>([&] { buf.dispatch(in.args); }, "rank 1");
          const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while (!late_rank_done && std::chrono::steady_clock::now() < limit)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        try {
          buf.dispatch(in.args);
        } catch (const PeerFailedError& e) {
          if (std::string(e.what()).find("rank 0") == std::string::npos)
            fail(std::string("rank 1's PeerFailedError does not name rank 0: ") + e.what());
        }
        late_rank_done = true;
      },
      test_group(std::chrono::milliseconds(500)));
}

// Rank 1 passes an expert id past num_experts: the kernels route it nowhere and rank 1 gets an
// InvalidArgument naming the entry, rank 0's call completes, and the next call on both ranks is
// correct (the buffer stays usable).
inline void run_bad_expert_error() {
  Case c;
  const test::Problem p = test::make_problem(2, 8, c.hidden, c.dtype, {8, 8}, c.topk, c.routing, 5);
  run_ranks(
      2,
      [&](Group& g) {
        const int me = g.rank();
        RankInputs good(p, me, c.layout), bad(p, me, c.layout);
        std::vector<int64_t> idx = p.inputs[static_cast<size_t>(me)].topk_idx;
        if (me == 1) idx[3] = 1000;
        upload(bad.idx->p, idx.data(), idx.size() * 8);
        DevMem combine_in(static_cast<size_t>(2 * c.tokens * c.hidden) * dtype_size(c.dtype));
        Buffer buf(g, config_for(c));
        if (me == 1)
          expect_error<InvalidArgument>([&] { buf.dispatch(bad.args); }, "flat index 3");
        else
          buf.dispatch(bad.args);
        Case one_shot = c;
        one_shot.split = false;
        run_call(one_shot, p, buf, me, good, combine_in);
        g.barrier();
      },
      test_group());
}

// Buffers destroyed after their rank threads have ended, one after another on one thread and not
// in rank order: what Python's garbage collector does with thread ranks' Buffers. No rank may
// wait for a peer at tear-down then (local_windows.hpp), so it takes far less than the group's
// timeout; new Buffers on the same groups then run a checked call.
inline void run_late_teardown() {
  Case c;
  c.ranks = 4;
  c.layout = Layout::kLatency;
  const std::vector<test::Problem> problems{
      test::make_problem(c.ranks, c.ranks * c.experts_per_rank, c.hidden, c.dtype,
                         std::vector<int64_t>(4, c.tokens), c.topk, c.routing, 7)};
  const GroupOptions opt = test_group();
  ThreadWorld world(c.ranks, opt);
  std::vector<std::unique_ptr<Group>> groups;
  for (int r = 0; r < c.ranks; ++r) groups.push_back(world.group(r));
  const auto on_ranks = [&](const std::function<void(int)>& fn) {
    std::vector<std::exception_ptr> errors(static_cast<size_t>(c.ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < c.ranks; ++r)
      threads.emplace_back([&, r] {
        try {
          fn(r);
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  };
  std::vector<std::unique_ptr<Buffer>> bufs(static_cast<size_t>(c.ranks));
  std::vector<std::unique_ptr<RankMemory>> mems(static_cast<size_t>(c.ranks));
  on_ranks([&](int r) {
    const auto i = static_cast<size_t>(r);
    mems[i] = std::make_unique<RankMemory>(problems, c, r);
    bufs[i] = std::make_unique<Buffer>(*groups[i], config_for(c));
    run_call(c, problems[0], *bufs[i], r, *mems[i]->inputs[0], *mems[i]->combine_in);
  });
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t r : {2, 0, 3, 1}) bufs[r].reset();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
  std::cout << "    4 Buffers destroyed on one thread in " << took.count() * 1e3 << " ms\n";
  const double timeout_s = std::chrono::duration<double>(opt.timeout).count();
  if (took.count() > 0.5 * timeout_s)
    fail("tear-down on one thread took " + std::to_string(took.count()) +
         " s: a rank waited for its peers (group timeout " + std::to_string(timeout_s) + " s)");
  on_ranks([&](int r) {
    const auto i = static_cast<size_t>(r);
    Buffer buf(*groups[i], config_for(c));
    run_call(c, problems[0], buf, r, *mems[i]->inputs[0], *mems[i]->combine_in);
  });
}

}  // namespace ubep::gpu_test
