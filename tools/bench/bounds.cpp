// What no implementation of dispatch/combine can beat on this machine, measured in the same run:
// the memory-bandwidth bound (every rank copying its rows at once, from and to where the call
// reads and writes them) and the latency floor (a flag's round trip between two cores).
//
// Why measured and not assumed: which copy is fastest depends on the size and the host (on the
// project's VM a non-temporal loop beats memcpy for a decode-sized block and loses for a
// prefill-sized one), and a single-core memcpy from a private buffer is not a bound for two
// ranks sharing one memory system -- ubep beat that old "copy bound".
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "bench.hpp"
#include "ubep/error.hpp"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ubep::tools {

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Non-temporal stores: no read-for-ownership of destination lines the writer never reads, so a
// copy moves 2 bytes of traffic per byte instead of 3. The fence is once per op, as a call
// publishes its rows with one release after them.
void copy_nt(char* dst, const char* src, size_t n) {
#if defined(__SSE2__)
  size_t i = 0;
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
  }
  if (i < n) std::memcpy(dst + i, src + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

void fence_nt() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Spins on a flag in shared memory until it reaches `want`, within the group's timeout.
void wait_at_least(const uint64_t* p, uint64_t want, const Group& g, int peer) {
  std::atomic_ref<const uint64_t> a(*p);
  const auto deadline = Clock::now() + g.options().timeout;
  for (uint64_t n = 1; a.load(std::memory_order_acquire) < want; ++n) {
    if (n % 4096 == 0) {
      UBEP_CHECK(Clock::now() < deadline, TimeoutError, "ubep-bench floor: rank ", g.rank(),
                 " waited for rank ", peer, "'s flag ", want, " past the timeout");
      // Oversubscribed ranks (more ranks than cores) must let the peer run.
      std::this_thread::yield();
    }
  }
}

void publish(uint64_t* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
}

}  // namespace

std::vector<SendRow> send_rows(const std::vector<int64_t>& idx, int64_t tokens, int topk,
                               int experts, int ranks, int me, Layout layout) {
  const int El = experts / ranks;
  std::vector<SendRow> out;
  for (int k = 1; k <= ranks; ++k) {
    const int d = (me + k) % ranks;
    for (int64_t t = 0; t < tokens; ++t) {
      int n = 0;
      for (int j = 0; j < topk; ++j) {
        const int64_t e = idx[static_cast<size_t>(t * topk + j)];
        if (e >= 0 && e / El == d) ++n;
      }
      if (layout == Layout::kThroughput) n = std::min(n, 1);
      for (int i = 0; i < n; ++i) out.push_back({d, t});
    }
  }
  return out;
}

std::vector<BenchRow> measure_bound(Group& g, const std::vector<SendRow>& sends, const char* x,
                                    size_t row_bytes, int64_t tokens, int warmup, int iters) {
  const int R = g.size(), me = g.rank();
  // Slot of each row in its destination's window: rows from source s to d fill region s of d's
  // window, in send order (as a call places them); two halves, used by alternate iterations as
  // calls alternate window halves, so an iteration never finds its lines in cache from the last.
  std::vector<int64_t> to(static_cast<size_t>(R), 0), slot(sends.size());
  for (size_t i = 0; i < sends.size(); ++i)
    slot[i] = to[static_cast<size_t>(sends[i].dest)]++;
  int64_t cap = *std::max_element(to.begin(), to.end());
  std::vector<int64_t> caps(static_cast<size_t>(R));
  g.allgather(&cap, caps.data(), sizeof cap);
  cap = std::max<int64_t>(1, *std::max_element(caps.begin(), caps.end()));
  const size_t half = static_cast<size_t>(R) * static_cast<size_t>(cap) * row_bytes;
  auto win = g.allocate_window(2 * half + 64);
  for (int d = 0; d < R; ++d)
    UBEP_CHECK(win->base(d) != nullptr, Error,
               "ubep-bench bound: rank ", d, " does not share memory with rank ", me,
               " (the bound needs one host)");
  auto row_at = [&](int d, int par, int src, int64_t s) {
    auto base = reinterpret_cast<uintptr_t>(win->base(d));
    base = (base + 63) & ~uintptr_t(63);
    return reinterpret_cast<char*>(base) + static_cast<size_t>(par) * half +
           (static_cast<size_t>(src) * static_cast<size_t>(cap) + static_cast<size_t>(s)) *
               row_bytes;
  };
  std::vector<char> y(static_cast<size_t>(std::max<int64_t>(tokens, 1)) * row_bytes + 64, 0);
  char* ya = y.data() + (64 - reinterpret_cast<uintptr_t>(y.data()) % 64) % 64;

  enum Kernel { kMemcpy, kNt };
  std::vector<double> t[2][2];  // [kernel][op]
  for (int i = 0; i < warmup + iters; ++i) {
    const int par = i % 2;
    for (Kernel k : {kMemcpy, kNt}) {
      g.barrier();
      auto t0 = Clock::now();
      for (size_t r = 0; r < sends.size(); ++r) {
        char* dst = row_at(sends[r].dest, par, me, slot[r]);
        const char* src = x + static_cast<size_t>(sends[r].token) * row_bytes;
        if (k == kNt)
          copy_nt(dst, src, row_bytes);
        else
          std::memcpy(dst, src, row_bytes);
      }
      if (k == kNt) fence_nt();
      const double d_us = us_since(t0);
      g.barrier();  // every row is in place before anyone reads it back
      t0 = Clock::now();
      for (size_t r = 0; r < sends.size(); ++r) {
        char* dst = ya + static_cast<size_t>(sends[r].token) * row_bytes;
        const char* src = row_at(sends[r].dest, par, me, slot[r]);
        if (k == kNt)
          copy_nt(dst, src, row_bytes);
        else
          std::memcpy(dst, src, row_bytes);
      }
      if (k == kNt) fence_nt();
      const double c_us = us_since(t0);
      if (i >= warmup) {
        t[k][0].push_back(d_us);
        t[k][1].push_back(c_us);
      }
    }
  }
  g.barrier();  // nobody unmaps the window while a peer still copies
  const double bytes = static_cast<double>(sends.size()) * static_cast<double>(row_bytes);
  std::vector<BenchRow> out;
  const char* ops[2] = {"dispatch", "combine"};
  for (int op = 0; op < 2; ++op) {
    BenchRow a = make_row(g, "bound", "memcpy", ops[op], t[kMemcpy][op], bytes);
    BenchRow b = make_row(g, "bound", "nt-store", ops[op], t[kNt][op], bytes);
    out.push_back(a.median_us <= b.median_us ? a : b);
  }
  return out;
}

std::vector<BenchRow> measure_floor(Group& g, int iters) {
  std::vector<BenchRow> out;
  const int R = g.size(), me = g.rank();
  if (R < 2) return out;
  // Line 0 of each window: the ping-pong flag; line 1 + s: rank s's barrier flag.
  auto win = g.allocate_window(64 * static_cast<size_t>(R + 2) + 64);
  int shared = 1;
  for (int d = 0; d < R; ++d) shared &= win->base(d) != nullptr;
  std::vector<int> all(static_cast<size_t>(R));
  g.allgather(&shared, all.data(), sizeof shared);
  if (std::find(all.begin(), all.end(), 0) != all.end()) return out;
  auto line = [&](int d, int i) {
    auto base = (reinterpret_cast<uintptr_t>(win->base(d)) + 63) & ~uintptr_t(63);
    return reinterpret_cast<uint64_t*>(base + 64 * static_cast<size_t>(i));
  };
  const int warmup = std::max(10, iters / 10);
  // Ping-pong: each side polls a line in its own memory and writes the peer's, as a receiver
  // polls its window for the tag a sender wrote.
  std::vector<double> rt;
  g.barrier();
  if (me <= 1) {
    const int peer = 1 - me;
    for (int i = 1; i <= warmup + iters; ++i) {
      const auto v = static_cast<uint64_t>(i);
      if (me == 0) {
        const auto t0 = Clock::now();
        publish(line(peer, 0), v);
        wait_at_least(line(me, 0), v, g, peer);
        if (i > warmup) rt.push_back(us_since(t0));
      } else {
        wait_at_least(line(me, 0), v, g, peer);
        publish(line(peer, 0), v);
      }
    }
  }
  if (me != 0) rt.assign(static_cast<size_t>(iters), 0.0);  // rank 0's times are the ones
  g.barrier();
  out.push_back(make_row(g, "floor", "", "roundtrip", rt, 64));
  // All-to-all flag barrier: post my epoch to every peer, wait for every peer's.
  std::vector<double> bt;
  for (int i = 1; i <= warmup + iters; ++i) {
    const auto v = static_cast<uint64_t>(i);
    const auto t0 = Clock::now();
    for (int d = 0; d < R; ++d)
      if (d != me) publish(line(d, 1 + me), v);
    for (int s = 0; s < R; ++s)
      if (s != me) wait_at_least(line(me, 1 + s), v, g, s);
    if (i > warmup) bt.push_back(us_since(t0));
  }
  g.barrier();
  out.push_back(make_row(g, "barrier", "", "flag", bt, 0));
  return out;
}

}  // namespace ubep::tools
