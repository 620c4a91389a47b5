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
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ubep::tools {

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Non-temporal stores: no read-for-ownership of destination lines the writer never reads, so a
// copy moves 2 bytes of traffic per byte instead of 3. Two widths: 16-byte SSE2 stores (any
// x86-64) and 64-byte AVX-512 stores (one full line per store; where the CPU has them), since
// the library's own row copy uses the widest one and a narrower loop is not a bound for it. The
// fence is once per op, as a call publishes its rows with one release after them.
void copy_nt16(char* dst, const char* src, size_t n) {
  size_t i = 0;
#if defined(__SSE2__)
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0)
    for (; i + 64 <= n; i += 64)
      for (size_t k = 0; k < 64; k += 16)
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + k),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + k)));
#endif
  if (i < n) std::memcpy(dst + i, src + i, n - i);
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void copy_nt64(char* dst, const char* src, size_t n) {
  size_t i = 0;
  if (reinterpret_cast<uintptr_t>(dst) % 64 == 0)
    for (; i + 64 <= n; i += 64)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
  if (i < n) std::memcpy(dst + i, src + i, n - i);
}
const bool kHaveAvx512 = __builtin_cpu_supports("avx512f");
#else
void copy_nt64(char* dst, const char* src, size_t n) { copy_nt16(dst, src, n); }
const bool kHaveAvx512 = false;
#endif

void fence_nt() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// The least a combine can do to memory: read each of a token's rows once, all at once (as the
// reduction streams them), and write the token's output row once. OR is the cheapest combining
// operation there is, so no reduction can be faster at the same traffic.
void or_rows(char* out, const char* const* rows, int n, size_t bytes) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 16 <= bytes; i += 16) {
    __m128i acc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[0] + i));
    for (int r = 1; r < n; ++r)
      acc = _mm_or_si128(acc, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), acc);
  }
#endif
  for (; i < bytes; ++i) {
    char acc = rows[0][i];
    for (int r = 1; r < n; ++r) acc = static_cast<char>(acc | rows[r][i]);
    out[i] = acc;
  }
}

// The library's reduction prefetches 1 KiB ahead in every row (reduce_bf16.cpp); the bound has
// the same variant (or-reduce-prefetch), so the hint is not a lead the bound lacks.
constexpr size_t kPrefetchAhead = 1024;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void or_rows64(char* out, const char* const* rows, int n,
                                                  size_t bytes, bool prefetch) {
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    if (prefetch && i + kPrefetchAhead < bytes)
      for (int r = 0; r < n; ++r) _mm_prefetch(rows[r] + i + kPrefetchAhead, _MM_HINT_T0);
    __m512i acc = _mm512_loadu_si512(rows[0] + i);
    for (int r = 1; r < n; ++r) acc = _mm512_or_si512(acc, _mm512_loadu_si512(rows[r] + i));
    _mm512_storeu_si512(out + i, acc);
  }
  if (i < bytes) {
    const char* rest[64];
    for (int r = 0; r < n; ++r) rest[r] = rows[r] + i;
    or_rows(out + i, rest, n, bytes - i);
  }
}
// Two lines of every row per step, as the library's reduction steps (64 bf16 values).
__attribute__((target("avx512f"))) void or_rows128(char* out, const char* const* rows, int n,
                                                   size_t bytes, bool prefetch) {
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    if (prefetch && i + kPrefetchAhead < bytes)
      for (int r = 0; r < n; ++r) {
        _mm_prefetch(rows[r] + i + kPrefetchAhead, _MM_HINT_T0);
        _mm_prefetch(rows[r] + i + kPrefetchAhead + 64, _MM_HINT_T0);
      }
    __m512i a = _mm512_loadu_si512(rows[0] + i), b = _mm512_loadu_si512(rows[0] + i + 64);
    for (int r = 1; r < n; ++r) {
      a = _mm512_or_si512(a, _mm512_loadu_si512(rows[r] + i));
      b = _mm512_or_si512(b, _mm512_loadu_si512(rows[r] + i + 64));
    }
    _mm512_storeu_si512(out + i, a);
    _mm512_storeu_si512(out + i + 64, b);
  }
  if (i < bytes) {
    const char* rest[64];
    for (int r = 0; r < n; ++r) rest[r] = rows[r] + i;
    or_rows64(out + i, rest, n, bytes - i, false);
  }
}
#else
void or_rows64(char* out, const char* const* rows, int n, size_t bytes, bool /*prefetch*/) {
  or_rows(out, rows, n, bytes);
}
void or_rows128(char* out, const char* const* rows, int n, size_t bytes, bool /*prefetch*/) {
  or_rows(out, rows, n, bytes);
}
#endif

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
                                    size_t row_bytes, int64_t tokens, int warmup, int iters,
                                    const char* scales, size_t scale_bytes) {
  const int R = g.size(), me = g.rank();
  const auto Rz = static_cast<size_t>(R);
  // Slot of each row in its destination's window: rows from source s to d fill region s of d's
  // window, in send order (as a call places them).
  std::vector<int64_t> to(Rz, 0), slot(sends.size());
  for (size_t i = 0; i < sends.size(); ++i) slot[i] = to[static_cast<size_t>(sends[i].dest)]++;
  std::vector<int64_t> all_to(Rz * Rz);  // [s * R + d]: rows from s to d
  g.allgather(to.data(), all_to.data(), Rz * sizeof(int64_t));
  const int64_t cap = std::max<int64_t>(1, *std::max_element(all_to.begin(), all_to.end()));
  // Regions of every window: 0 and 1, the dispatch halves (alternate iterations use alternate
  // halves, as calls do, so an iteration never finds its lines in cache from the last one);
  // 2, the experts' outputs (the combine's input).
  const size_t region = Rz * static_cast<size_t>(cap) * row_bytes;
  // Regions 3 and 4: the scales of dispatch halves 0 and 1 (fp8), after the row regions.
  const size_t scale_region = scale_bytes ? Rz * static_cast<size_t>(cap) * scale_bytes : 0;
  auto win = g.allocate_window(3 * region + 2 * scale_region + 64);
  for (int d = 0; d < R; ++d)
    UBEP_CHECK(win->base(d) != nullptr, Error, "ubep-bench bound: rank ", d,
               " does not share memory with rank ", me, " (the bound needs one host)");
  auto row_at = [&](int d, int reg, int src, int64_t s) {
    auto base = (reinterpret_cast<uintptr_t>(win->base(d)) + 63) & ~uintptr_t(63);
    return reinterpret_cast<char*>(base) + static_cast<size_t>(reg) * region +
           (static_cast<size_t>(src) * static_cast<size_t>(cap) + static_cast<size_t>(s)) *
               row_bytes;
  };
  auto scale_at = [&](int d, int par, int src, int64_t s) {
    return row_at(d, 0, 0, 0) + 3 * region + static_cast<size_t>(par) * scale_region +
           (static_cast<size_t>(src) * static_cast<size_t>(cap) + static_cast<size_t>(s)) *
               scale_bytes;
  };
  std::vector<char> y(static_cast<size_t>(std::max<int64_t>(tokens, 1)) * row_bytes + 64, 0);
  char* ya = y.data() + (64 - reinterpret_cast<uintptr_t>(y.data()) % 64) % 64;
  // Each token's rows, in send order (k order in the latency layout).
  std::vector<std::vector<size_t>> of_token(static_cast<size_t>(std::max<int64_t>(tokens, 0)));
  for (size_t r = 0; r < sends.size(); ++r)
    of_token[static_cast<size_t>(sends[r].token)].push_back(r);

  using Copy = void (*)(char*, const char*, size_t);
  auto plain = [](char* d, const char* s, size_t n) { std::memcpy(d, s, n); };
  struct Kernel {
    const char* name;
    Copy copy;  // nullptr: the or-reduce combine
    bool nt;
    bool prefetch = false;   // or-reduce: software prefetch ahead in every row
    bool two_lines = false;  // or-reduce: two lines of every row per step
  };
  std::vector<Kernel> dk{{"memcpy", plain, false}, {"nt-store-16B", copy_nt16, true}};
  std::vector<Kernel> ck{{"memcpy", plain, false},
                         {"or-reduce", nullptr, false},
                         {"or-reduce-prefetch", nullptr, false, true},
                         {"or-reduce-128B-prefetch", nullptr, false, true, true}};
  if (kHaveAvx512) {
    dk.push_back({"nt-store-64B", copy_nt64, true});
    ck.push_back({"nt-store-64B", copy_nt64, true});
  } else {
    ck.push_back({"nt-store-16B", copy_nt16, true});
  }
  // Scales (fp8) with plain stores, as the call writes rows under 1 KiB.
  auto dispatch = [&](const Kernel& k, int par) {
    for (size_t r = 0; r < sends.size(); ++r) {
      const auto t = static_cast<size_t>(sends[r].token);
      k.copy(row_at(sends[r].dest, par, me, slot[r]), x + t * row_bytes, row_bytes);
      if (scale_bytes)
        std::memcpy(scale_at(sends[r].dest, par, me, slot[r]), scales + t * scale_bytes,
                    scale_bytes);
    }
    if (k.nt) fence_nt();
  };
  // The bench's expert (untimed, as in the bench): each rank copies the rows it received into
  // its combine input, so the combine finds them where and as warm as a real call does.
  auto expert = [&](int par) {
    for (int s = 0; s < R; ++s)
      std::memcpy(
          row_at(me, 2, s, 0), row_at(me, par, s, 0),
          static_cast<size_t>(all_to[static_cast<size_t>(s) * Rz + static_cast<size_t>(me)]) *
              row_bytes);
  };
  auto combine = [&](const Kernel& k) {
    const char* ptrs[64];
    for (size_t t = 0; t < of_token.size(); ++t) {
      const auto& rs = of_token[t];
      char* out = ya + t * row_bytes;
      if (!k.copy) {
        // At most 64 rows per pass (throughput layout on > 64 ranks): later passes fold the
        // output row in as their first operand, so every row is still read exactly once.
        for (size_t i0 = 0; i0 < rs.size();) {
          int n = 0;
          if (i0 > 0) ptrs[n++] = out;
          for (; n < 64 && i0 < rs.size(); ++i0)
            ptrs[n++] = row_at(sends[rs[i0]].dest, 2, me, slot[rs[i0]]);
          if (kHaveAvx512)
            (k.two_lines ? or_rows128 : or_rows64)(out, ptrs, n, row_bytes, k.prefetch);
          else
            or_rows(out, ptrs, n, row_bytes);
        }
        continue;
      }
      for (size_t r : rs) k.copy(out, row_at(sends[r].dest, 2, me, slot[r]), row_bytes);
    }
    if (k.nt) fence_nt();
  };
  std::vector<std::vector<double>> td(dk.size()), tc(ck.size());
  for (int i = 0; i < warmup + iters; ++i) {
    const int par = i % 2;
    // Rotate the order of the candidates, so none always runs first (or last) in an iteration.
    for (size_t n = 0; n < dk.size(); ++n) {
      const size_t k = (n + static_cast<size_t>(i)) % dk.size();
      g.barrier();  // all ranks at once
      const auto t0 = Clock::now();
      dispatch(dk[k], par);
      if (i >= warmup) td[k].push_back(us_since(t0));
    }
    for (size_t n = 0; n < ck.size(); ++n) {
      const size_t k = (n + static_cast<size_t>(i)) % ck.size();
      g.barrier();  // every row is placed before its owner's expert copies it
      expert(par);
      g.barrier();  // every expert output is written before anyone reads it back
      const auto t0 = Clock::now();
      combine(ck[k]);
      if (i >= warmup) tc[k].push_back(us_since(t0));
    }
  }
  g.barrier();  // nobody unmaps the window while a peer still reads it
  const double bytes = static_cast<double>(sends.size()) * static_cast<double>(row_bytes);
  const double dispatch_bytes =
      static_cast<double>(sends.size()) * static_cast<double>(row_bytes + scale_bytes);
  auto fastest = [&](const std::vector<Kernel>& ks, std::vector<std::vector<double>>& ts,
                     const char* op, double op_bytes) {
    BenchRow best;
    for (size_t k = 0; k < ks.size(); ++k) {
      BenchRow r = make_row(g, "bound", ks[k].name, op, ts[k], op_bytes);
      if (k == 0 || r.median_us < best.median_us) best = r;
    }
    return best;
  };
  return {fastest(dk, td, "dispatch", dispatch_bytes), fastest(ck, tc, "combine", bytes)};
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
