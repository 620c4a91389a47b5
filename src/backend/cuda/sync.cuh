// Device-side ordering primitives and bounded spins of the CUDA backend.
//
// Publishing (data-as-flag): the lanes of a warp write a message's body with plain (vector)
// stores, __syncwarp() orders those stores before what lane 0 does next (the CUDA memory model:
// __syncwarp guarantees memory ordering among the participating threads), and lane 0 stores the
// epoch tag with st.release.sys, which is cumulative: every write that happened-before it in the
// warp -- the whole body -- is visible to any thread, on any GPU or process, whose ld.acquire.sys
// of the tag returns the new value. Readers: every lane that reads a message body first does its
// own acquire load of the tag, so the ordering never rests on a warp barrier on the reader side.
//
// Rank-local signals (between the blocks of one rank, one GPU) use the same pair at gpu scope.
#pragma once

#include <cstdint>

#if defined(UBEP_CUDA_HOST_SIM)
#include "backend/cuda/cuda_host_sim.hpp"  // the CUDA simulation device (CPU threads)
#else
#include <cooperative_groups.h>
#endif

#include "backend/cuda/device_plan.hpp"

namespace ubep::cuda_dev {

using cuda_hd::ErrorInfo;
using cuda_hd::ErrorSink;

#if defined(UBEP_CUDA_HOST_SIM)
// CPU test build: the same operations as C++ atomics (src/backend/cuda/cuda_host_sim.hpp).
inline void st_release_sys(uint32_t* p, uint32_t v) {
  std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release);
}
inline uint32_t ld_acquire_sys(const uint32_t* p) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire);
}
inline void st_release_gpu(uint32_t* p, uint32_t v) { st_release_sys(p, v); }
inline uint32_t ld_acquire_gpu(const uint32_t* p) { return ld_acquire_sys(p); }
inline uint32_t ld_volatile(const uint32_t* p) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_relaxed);
}
inline unsigned long long globaltimer_ns() { return static_cast<unsigned long long>(clock64()); }
inline void grid_barrier() { ubep::sim::self.grid->arrive_and_wait(); }
#define UBEP_DYNAMIC_SMEM(name) int* name = ::ubep::sim::self.block->smem.data()
#else
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_volatile(const uint32_t* p) {
  return *reinterpret_cast<const volatile uint32_t*>(p);
}
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// The grid barrier of a cooperative launch (also a grid-wide memory fence).
__device__ __forceinline__ void grid_barrier() { cooperative_groups::this_grid().sync(); }
#define UBEP_DYNAMIC_SMEM(name) extern __shared__ int name[]
#endif

// Marks a written message complete. stop_and_wait (the sync ablation): a full system fence first,
// then the flag -- the fence makes the release redundant, which is the point of the ablation.
__device__ __forceinline__ void publish_tag(uint32_t* tag, uint32_t value, bool stop_and_wait) {
  if (stop_and_wait) __threadfence_system();
  st_release_sys(tag, value);
}

// Records the first error in the buffer's life: claim it (CAS in device memory), write the
// details to host-mapped memory, system fence, then the code, which the host reads after the
// stream completes (cuda_host::throw_if_error).
__device__ __noinline__ void report(ErrorSink err, uint32_t code, int rank, int peer, int what,
                                    int64_t index, uint32_t tag) {
  if (atomicCAS(err.claim, 0u, code) != 0u) return;  // someone reported first
  volatile ErrorInfo* e = err.info;
  e->rank = rank;
  e->peer = peer;
  e->what = what;
  e->index = index;
  e->tag = tag;
  __threadfence_system();
  e->code = code;
  __threadfence_system();
}

// A reported timeout or protocol error ends every wait of the launch (bad expert ids do not:
// they were routed nowhere and the call completes consistently).
__device__ __forceinline__ bool aborted(ErrorSink err) {
  const uint32_t c = ld_volatile(err.claim);
  return c != 0u && c != static_cast<uint32_t>(cuda_hd::kBadExpert);
}

// Whether peer `peer` published a failure word that ends this call (its own rank's words are
// never written). The word is a release store by the failing rank (host or device); an acquire
// load here. Reported once, like a timeout: every other wait of the launch then gives up.
__device__ __forceinline__ bool peer_failed(ErrorSink err, int rank, int peer, int what,
                                            int64_t index) {
  if (err.fail_words == nullptr || peer == rank) return false;
  const uint32_t word = ld_acquire_sys(err.fail_words + peer);
  if (!protocol::failure_ends_call(word, err.call)) return false;
  report(err, cuda_hd::kPeerFailed, rank, peer, what, index, word);
  return true;
}

// Waits until *tag == want (acquire at the given scope). Bounded: past the clock64 deadline it
// reports a timeout naming the peer and message and returns false; it also returns false as soon
// as another thread of the launch reported one (so a dead peer ends the launch, not a hang), or
// as soon as the peer it waits for published a failure word for this call (System waits).
template <bool System>
__device__ __noinline__ bool wait_tag(const uint32_t* tag, uint32_t want, long long timeout_cycles,
                                      ErrorSink err, int rank, int peer, int what, int64_t index) {
  auto load = [&] { return System ? ld_acquire_sys(tag) : ld_acquire_gpu(tag); };
  if (load() == want) return true;
  const long long deadline = clock64() + timeout_cycles;
  for (unsigned n = 0;; ++n) {
    if (load() == want) return true;
    if ((n & 15u) == 0) {
      if (aborted(err)) return false;
      if (System && peer_failed(err, rank, peer, what, index)) return false;
      if (clock64() > deadline) {
        if (load() == want) return true;
        report(err, cuda_hd::kTimeout, rank, peer, what, index, want);
        return false;
      }
    }
    __nanosleep(64);
  }
}

// Wrap-safe "counter reached want" for bsp's monotonic barrier flags.
__device__ __noinline__ bool wait_reached(const uint32_t* flag, uint32_t want,
                                          long long timeout_cycles, ErrorSink err, int rank,
                                          int peer) {
  const long long deadline = clock64() + timeout_cycles;
  for (unsigned n = 0;; ++n) {
    if (static_cast<int32_t>(ld_acquire_sys(flag) - want) >= 0) return true;
    if ((n & 15u) == 0) {
      if (aborted(err)) return false;
      if (peer_failed(err, rank, peer, cuda_hd::kWaitBarrier, 0)) return false;
      if (clock64() > deadline) {
        report(err, cuda_hd::kTimeout, rank, peer, cuda_hd::kWaitBarrier, 0, want);
        return false;
      }
    }
    __nanosleep(64);
  }
}

// Copies `bytes` from src to dst with the widest access both allow: 16-byte vectors (the hot
// path: rows are 16-byte aligned whenever row_bytes is), else 4-byte words, else bytes. Lanes
// stride by 32 elements so each warp-wide access is coalesced.
__device__ __forceinline__ void warp_copy(void* dst, const void* src, size_t bytes, int lane) {
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (((d | s | bytes) & 15u) == 0) {
    auto* o = static_cast<int4*>(dst);
    const auto* i = static_cast<const int4*>(src);
    const size_t n = bytes / 16;
#pragma unroll 4
    for (size_t k = static_cast<size_t>(lane); k < n; k += 32) o[k] = __ldg(i + k);
  } else if (((d | s | bytes) & 3u) == 0) {
    auto* o = static_cast<uint32_t*>(dst);
    const auto* i = static_cast<const uint32_t*>(src);
    for (size_t k = static_cast<size_t>(lane); k < bytes / 4; k += 32) o[k] = i[k];
  } else {
    auto* o = static_cast<char*>(dst);
    const auto* i = static_cast<const char*>(src);
    for (size_t k = static_cast<size_t>(lane); k < bytes; k += 32) o[k] = i[k];
  }
}

}  // namespace ubep::cuda_dev
