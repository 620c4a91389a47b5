// A host simulation of the small part of CUDA the backend's kernels use, so the CPU test suite
// can execute dispatch.cuh / combine.cuh unchanged (tests/cuda/test_cuda_sim.cpp): every GPU
// thread is a fiber (a std::thread in sanitizer builds); warps, blocks and the grid meet at
// barriers (__syncwarp, __syncthreads, cooperative grid sync); ballots and shuffles exchange
// through the warp;
// release/acquire tags are std::atomic_ref operations; clock64 is a steady clock in ns.
//
// What it proves: the kernels' indexing, roles, waits, placement and arithmetic produce the
// reference's bits when every thread makes progress. What it cannot: the GPU memory model
// (weaker than C++'s seq_cst fences used here), warp scheduling, occupancy, performance.
// Only for the test build (UBEP_CUDA_HOST_SIM); nvcc never sees this file.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cuda_host_fibers.hpp"

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
// Device functions are defined in headers: inline here, so every translation unit that runs
// the kernels on CPU threads (libubep's sim device, test_cuda_sim) may hold a copy.
#define __noinline__ inline
// The kernels' namespace, renamed for this build: where nvcc's objects are linked too (a build
// with UBEP_WITH_CUDA), its host-side stubs of the same functions must not stand in for these.
#define cuda_dev cuda_dev_on_cpu
#define __launch_bounds__(...)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

// Sanitizer builds run each simulated thread on its own OS thread, as a GPU would run them at
// once: ThreadSanitizer then checks the kernels' ordering between real threads
// (test_cuda_sim_tsan), and neither sanitizer need follow fiber switches. Other builds run them as
// fibers (cuda_host_fibers.hpp): the same interleavings are legal, at a fraction of the cost.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define UBEP_SIM_OS_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define UBEP_SIM_OS_THREADS 1
#endif
#endif
#ifndef UBEP_SIM_OS_THREADS
#define UBEP_SIM_OS_THREADS 0
#endif

namespace ubep::sim {

#if UBEP_SIM_OS_THREADS
using Barrier = std::barrier<>;
#else
// The barrier of a warp, a block or the grid among the fibers of one launch (one OS thread, so
// plain integers): the last to arrive opens it; the others yield until its generation moves.
class Barrier {
 public:
  explicit Barrier(std::ptrdiff_t count) : count_(count) {}
  void arrive_and_wait() {
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      fibers::Scheduler::note_progress();
      return;
    }
    const uint64_t gen = generation_;
    while (generation_ == gen) fibers::Scheduler::yield();
  }

 private:
  const std::ptrdiff_t count_;
  std::ptrdiff_t arrived_ = 0;
  uint64_t generation_ = 0;
};
#endif

struct Warp {
  Barrier bar{32};
  uint64_t slot[32] = {};
  int site[32] = {};  // source line of the collective each lane is at
};
struct Block {
  std::unique_ptr<Barrier> bar;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<int> smem;
};
struct Self {
  Warp* warp = nullptr;
  Block* block = nullptr;
  Barrier* grid = nullptr;
  unsigned lane = 0;
};
inline thread_local Self self;
inline thread_local dim3 tid, bid;
inline thread_local dim3 bdim, gdim;  // per simulated thread: launches may run concurrently

// Every warp collective checks that all 32 lanes called the same one (same source line): a
// full-mask collective reached by only some lanes, or by lanes at different call sites, is a bug
// on the GPU (undefined behaviour) that would otherwise show here only as a hang or pass.
inline void check_site(int line) {
  Warp& w = *self.warp;
  for (int l = 0; l < 32; ++l)
    if (w.site[l] != line) {
      std::fprintf(stderr, "cuda_host_sim: warp collective at line %d, lane %d is at line %d\n",
                   line, l, w.site[l]);
      std::abort();
    }
}

template <typename T>
T exchange(T v, int src, int line) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  self.warp->slot[self.lane] = b;
  self.warp->site[self.lane] = line;
  self.warp->bar.arrive_and_wait();
  check_site(line);
  const uint64_t got = self.warp->slot[src];
  self.warp->bar.arrive_and_wait();
  T r;
  std::memcpy(&r, &got, sizeof r);
  return r;
}

inline unsigned ballot(bool p, int line) {
  self.warp->slot[self.lane] = p ? 1 : 0;
  self.warp->site[self.lane] = line;
  self.warp->bar.arrive_and_wait();
  check_site(line);
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m |= (self.warp->slot[l] ? 1u : 0u) << l;
  self.warp->bar.arrive_and_wait();
  return m;
}

inline void syncwarp(int line) {
  self.warp->site[self.lane] = line;
  self.warp->bar.arrive_and_wait();
  check_site(line);
  self.warp->bar.arrive_and_wait();
}

// Runs kernel(params) on grid x block simulated threads (block a multiple of 32) with
// `smem_bytes` of dynamic shared memory per block; returns when every thread finished.
template <typename Kernel, typename Params>
void launch(Kernel kernel, const Params& params, int grid, int block, size_t smem_bytes) {
  Barrier grid_bar(grid * block);
  std::vector<std::unique_ptr<Block>> blocks;
  for (int b = 0; b < grid; ++b) {
    auto bl = std::make_unique<Block>();
    bl->bar = std::make_unique<Barrier>(block);
    for (int w = 0; w < block / 32; ++w) bl->warps.push_back(std::make_unique<Warp>());
    bl->smem.assign(smem_bytes / sizeof(int) + 1, 0);
    blocks.push_back(std::move(bl));
  }
  // Who simulated thread i is: its block, warp, lane and the launch's shape.
  auto identify = [&](size_t i) {
    const int b = static_cast<int>(i) / block, t = static_cast<int>(i) % block;
    gdim = {static_cast<unsigned>(grid), 1, 1};
    bdim = {static_cast<unsigned>(block), 1, 1};
    tid = {static_cast<unsigned>(t), 0, 0};
    bid = {static_cast<unsigned>(b), 0, 0};
    self = {blocks[static_cast<size_t>(b)]->warps[static_cast<size_t>(t / 32)].get(),
            blocks[static_cast<size_t>(b)].get(), &grid_bar, static_cast<unsigned>(t % 32)};
  };
  const size_t n = static_cast<size_t>(grid) * static_cast<size_t>(block);
#if UBEP_SIM_OS_THREADS
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      identify(i);
      kernel(params);
    });
  for (auto& th : threads) th.join();
#else
  std::vector<std::function<void()>> bodies(n, [&] { kernel(params); });
  fibers::Scheduler::run(std::move(bodies), identify);
#endif
}

}  // namespace ubep::sim

#define threadIdx (::ubep::sim::tid)
#define blockIdx (::ubep::sim::bid)
#define blockDim (::ubep::sim::bdim)
#define gridDim (::ubep::sim::gdim)

inline void __syncwarp(unsigned = 0xffffffffu, int line = __builtin_LINE()) {
  ubep::sim::syncwarp(line);
}
inline void __syncthreads() { ubep::sim::self.block->bar->arrive_and_wait(); }
inline unsigned __ballot_sync(unsigned, bool p, int line = __builtin_LINE()) {
  return ubep::sim::ballot(p, line);
}
inline bool __all_sync(unsigned, bool p, int line = __builtin_LINE()) {
  return ubep::sim::ballot(p, line) == 0xffffffffu;
}
template <typename T>
T __shfl_sync(unsigned, T v, int src, int line = __builtin_LINE()) {
  return ubep::sim::exchange(v, src, line);
}
inline int __popc(unsigned v) { return std::popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
#if UBEP_SIM_OS_THREADS
inline void __nanosleep(unsigned) { std::this_thread::yield(); }
#else
inline void __nanosleep(unsigned) { ubep::sim::fibers::Scheduler::yield(); }
#endif
inline long long clock64() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) {
  std::atomic_ref<unsigned>(*p).compare_exchange_strong(cmp, v);
  return cmp;
}
inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
inline int __float_as_int(float v) { return std::bit_cast<int>(v); }
