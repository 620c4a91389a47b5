// What no implementation of dispatch/combine can beat on this machine, measured in the same run:
// the memory-bandwidth bound (every rank copying its rows at once, from and to where the call
// reads and writes them) and the latency floor (a flag's round trip between two cores).
//
// Why measured and not assumed: which copy is fastest depends on the size and the host (on the
// project's VM a non-temporal loop beats memcpy for a decode-sized block and loses for a
// prefill-sized one), and a single-core memcpy from a private buffer is not a bound for two
// ranks sharing one memory system -- ubep beat that old "copy bound".
#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>

#include "bench.hpp"
#include "ep/dispatch_call.hpp"
#include "or_reduce.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"
#include "workload.hpp"
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
// copy moves 2 bytes of traffic per byte instead of 3. Three widths: 16-byte SSE2 stores (any
// x86-64), 32-byte AVX2 stores (where the CPU has AVX2 but not AVX-512) and 64-byte AVX-512
// stores (one full line per store), since the library's own row copy uses the widest one and a
// narrower loop is not a bound for it. The fence is once per op, as a call publishes its rows
// with one release after them.
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
// 32-byte stores, two per line, where the CPU has AVX2 and not AVX-512 (the library's row copy
// uses them there: row_kernels.cpp).
__attribute__((target("avx2"))) void copy_nt32(char* dst, const char* src, size_t n) {
  size_t i = 0;
  if (reinterpret_cast<uintptr_t>(dst) % 32 == 0)
    for (; i + 32 <= n; i += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  if (i < n) std::memcpy(dst + i, src + i, n - i);
}
#else
void copy_nt32(char* dst, const char* src, size_t n) { copy_nt16(dst, src, n); }
void copy_nt64(char* dst, const char* src, size_t n) { copy_nt16(dst, src, n); }
const bool kHaveAvx512 = false;
#endif

void fence_nt() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
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
      if (layout == Layout::kThroughput) {
        if (n > 0) out.push_back({d, t});
        continue;
      }
      for (int j = 0; j < topk; ++j) {
        const int64_t e = idx[static_cast<size_t>(t * topk + j)];
        if (e >= 0 && e / El == d) out.push_back({d, t, static_cast<int>(e)});
      }
    }
  }
  return out;
}

namespace {

// Copy and or-reduce loops, the candidates of each op.
using Copy = void (*)(char*, const char*, size_t);
void plain_copy(char* d, const char* s, size_t n) { std::memcpy(d, s, n); }
struct Kernel {
  const char* name;
  Copy copy;  // nullptr: the or-reduce combine
  bool nt;
  OrReduce how = {};  // the or-reduce's access pattern
  // Dispatch: a rank's rows to itself with plain stores while they fit the library's bound
  // (ep::DispatchCall::streams_row), the rest with `copy`.
  bool self_plain = false;
  // Dispatch: token by token (each token's rows to every destination, then the next token), as
  // the library sends a large call (ep::DispatchCall::sends_by_token); else destination by
  // destination.
  bool by_token = false;
};

}  // namespace

struct BoundHarness::Impl {
  Impl(Group& group, const std::vector<SendRow>& rows, const char* tokens, size_t rb,
       const char* token_scales, size_t sb)
      : g(group),
        start(group),
        sends(rows),
        x(tokens),
        row_bytes(rb),
        scales(token_scales),
        scale_bytes(sb) {}
  Group& g;
  StartBarrier start;  // before every timed op, as the calls' (bench.cpp)
  const std::vector<SendRow> sends;
  const char* x;
  size_t row_bytes;
  const char* scales;
  size_t scale_bytes;
  // The call's layout, and for the latency layout also the rows packed by source ("packed":
  // what the layout's addresses cost), timed interleaved so both see the same machine.
  std::vector<RowPlaces> layouts;
  size_t region = 0, scale_region = 0;
  std::unique_ptr<SharedWindow> win;
  std::vector<char> y;
  char* ya = nullptr;
  std::vector<std::vector<size_t>> of_token;  // each token's rows, in send order (k order)
  std::vector<size_t> token_order;            // the sends token by token (of_token in turn)
  size_t rows_to_self = 0;                    // sends into this rank's own window
  std::vector<Kernel> dk, ck;
  std::vector<std::vector<double>> td, tc;  // [layout * kernels + kernel]: samples
  int par = 0;                              // the window half of the last op
  int64_t fp8_hidden = 0;  // set_fp8_expert: the expert dequantizes rows of this many codes
  // set_fp8_expert_into: the expert dequantizes this harness's received fp8 rows (codes and
  // scales) into that harness's combine input, and the combine runs there.
  Impl* fp8_into = nullptr;
  std::vector<float> scratch, ones;
  const RowPlaces* last_pl = nullptr;  // the last expert step's rows and window half
  int last_half = 0;
  bool recording = false;  // the expert steps' time, for rows()
  double expert_us_sum = 0;
  int64_t expert_steps = 0;
  int64_t iterations = 0;  // run so far, for rotating the candidates

  char* row_at(int d, int reg, int64_t pos) const {
    auto base = (reinterpret_cast<uintptr_t>(win->base(d)) + 63) & ~uintptr_t(63);
    return reinterpret_cast<char*>(base) + static_cast<size_t>(reg) * region +
           static_cast<size_t>(pos) * row_bytes;
  }
  char* scale_at(int d, int half, int64_t pos) const {
    return row_at(d, 0, 0) + 4 * region + static_cast<size_t>(half) * scale_region +
           static_cast<size_t>(pos) * scale_bytes;
  }
  // Scales (fp8): their whole lines with the kernel's stores, a partial line at either end with
  // plain ones, as the call writes them (row_kernels.cpp).
  void dispatch(const Kernel& k, const RowPlaces& pl, int half) const {
    const bool self_plain = k.self_plain && rows_to_self * (row_bytes + scale_bytes) <=
                                                ep::DispatchCall::kPlainSelfBytes;
    for (size_t i = 0; i < sends.size(); ++i) {
      const size_t r = k.by_token ? token_order[i] : i;
      const auto t = static_cast<size_t>(sends[r].token);
      const bool plain = !k.nt || (self_plain && sends[r].dest == g.rank());
      (plain ? plain_copy : k.copy)(row_at(sends[r].dest, half, pl.pos[r]), x + t * row_bytes,
                                    row_bytes);
      if (!scale_bytes) continue;
      char* sd = scale_at(sends[r].dest, half, pl.pos[r]);
      const char* ss = scales + t * scale_bytes;
      const size_t head =
          !plain ? std::min(scale_bytes, (64 - reinterpret_cast<uintptr_t>(sd) % 64) % 64)
                 : scale_bytes;
      std::memcpy(sd, ss, head);
      if (head < scale_bytes) k.copy(sd + head, ss + head, scale_bytes - head);
    }
    if (k.nt) fence_nt();
  }
  // The bench's expert (untimed, as in the bench): each rank copies the rows it received into
  // its combine input, so the combine finds them where and as warm as a real call does. With
  // set_fp8_expert (the fp8 combine's bound, bf16 rows) it does the bench's fp8 expert's work
  // instead: each row's first hidden bytes as codes, scales of one, dequantized into the bf16
  // combine input (expert_fp8_row), the reads and writes of the calls' step before their combine.
  // With set_fp8_expert_into (the fp8 dispatch's bound) it dequantizes the fp8 rows it received,
  // with their scales, into the bf16 harness's combine input, as the calls' expert does.
  // The fp8 expert's codes per row (0: the expert copies), and where its bf16 rows go.
  int64_t dequantized_values() const {
    return fp8_into ? static_cast<int64_t>(row_bytes) : fp8_hidden;
  }
  const Impl& expert_output() const { return fp8_into ? *fp8_into : *this; }
  void expert(const RowPlaces& pl, int half) {
    const auto t0 = Clock::now();
    last_pl = &pl;
    last_half = half;
    if (dequantized_values() == 0) {
      for (const auto& [pos, n] : pl.runs)
        std::memcpy(row_at(g.rank(), 2 + half, pos), row_at(g.rank(), half, pos),
                    static_cast<size_t>(n) * row_bytes);
    } else {
      const Impl& out = expert_output();
      const int64_t codes = dequantized_values();
      for (const auto& [pos, n] : pl.runs)
        for (int64_t i = pos; i < pos + n; ++i)
          expert_fp8_row(
              reinterpret_cast<const uint8_t*>(row_at(g.rank(), half, i)),
              fp8_into ? reinterpret_cast<const float*>(scale_at(g.rank(), half, i)) : ones.data(),
              codes, scratch.data(),
              reinterpret_cast<uint16_t*>(out.row_at(g.rank(), 2 + half, i)));
    }
    if (recording) {
      expert_us_sum += us_since(t0);
      ++expert_steps;
    }
  }
  void combine(const Kernel& k, const RowPlaces& pl, int half) {
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
            ptrs[n++] = row_at(sends[rs[i0]].dest, 2 + half, pl.pos[rs[i0]]);
          // The next token's rows, for the pattern that prefetches on into them.
          const char* next[64];
          int next_n = 0;
          if (k.how.next && i0 >= rs.size() && t + 1 < of_token.size())
            for (size_t r : of_token[t + 1])
              if (next_n < 64) next[next_n++] = row_at(sends[r].dest, 2 + half, pl.pos[r]);
          OrReduce how = k.how;
          how.stream = how.stream && row_bytes % 64 == 0;
          or_reduce(out, ptrs, n, row_bytes, how, next, next_n);
        }
        continue;
      }
      for (size_t r : rs) k.copy(out, row_at(sends[r].dest, 2 + half, pl.pos[r]), row_bytes);
    }
    if (k.nt) fence_nt();
  }
};

BoundHarness::BoundHarness(Group& g, const std::vector<SendRow>& sends, const char* x,
                           size_t row_bytes, const BoundShape& shape, const char* scales,
                           size_t scale_bytes)
    : impl_(std::make_unique<Impl>(g, sends, x, row_bytes, scales, scale_bytes)) {
  Impl& b = *impl_;
  const int R = g.size(), me = g.rank();
  const int64_t tokens = shape.max_tokens;
  b.layouts.push_back(place_rows(g, sends, shape, false));
  if (shape.layout == Layout::kLatency) b.layouts.push_back(place_rows(g, sends, shape, true));
  int64_t region_rows = 1;
  for (const RowPlaces& pl : b.layouts) region_rows = std::max(region_rows, pl.region_rows);
  // Regions of every window: 0 and 1, the dispatch halves, 2 and 3 the experts' outputs (the
  // combine's input) of each half, all laid out as the call lays its rows out; then the scales
  // of dispatch halves 0 and 1 (fp8). Successive ops use alternate halves, as calls do, so an
  // op never finds its lines in cache from the last.
  b.region = static_cast<size_t>(region_rows) * row_bytes;
  b.scale_region = static_cast<size_t>(region_rows) * scale_bytes;
  b.win = g.allocate_window(4 * b.region + 2 * b.scale_region + 64);
  for (int d = 0; d < R; ++d)
    UBEP_CHECK(b.win->base(d) != nullptr, Error, "ubep-bench bound: rank ", d,
               " does not share memory with rank ", me, " (the bound needs one host)");
  b.y.assign(static_cast<size_t>(std::max<int64_t>(tokens, 1)) * row_bytes + 64, 0);
  b.ya = b.y.data() + (64 - reinterpret_cast<uintptr_t>(b.y.data()) % 64) % 64;
  b.of_token.resize(static_cast<size_t>(std::max<int64_t>(tokens, 0)));
  for (size_t r = 0; r < sends.size(); ++r)
    b.of_token[static_cast<size_t>(sends[r].token)].push_back(r);
  for (const auto& rows : b.of_token)
    b.token_order.insert(b.token_order.end(), rows.begin(), rows.end());
  b.dk = {{"memcpy", plain_copy, false}, {"nt-store-16B", copy_nt16, true}};
  b.ck = {{"memcpy", plain_copy, false},
          {"or-reduce", nullptr, false},
          {"or-reduce-prefetch", nullptr, false, {true}},
          {"or-reduce-128B-prefetch", nullptr, false, {true, true}}};
  const bool vector_or = or_reduce_has_avx512() || or_reduce_has_avx2();
  if (or_reduce_has_avx2())  // the library's reduction's own pattern (reduce_bf16.cpp)
    b.ck.push_back({"or-reduce-prefetch-next", nullptr, false, {true, true, false, true}});
  if (kHaveAvx512) {
    b.dk.push_back({"nt-store-64B", copy_nt64, true});
    b.ck.push_back({"nt-store-64B", copy_nt64, true});
  } else {
    if (or_reduce_has_avx2()) b.dk.push_back({"nt-store-32B", copy_nt32, true});
    b.ck.push_back({"nt-store-16B", copy_nt16, true});
  }
  // The widest copy token by token too, with and without plain stores to itself: destination
  // by destination, a prefill's x (30-60 MB) is read from memory once per destination, and the
  // library's token-ordered send ran at 0.83-0.87x a bound without these (issue 31).
  const Copy widest = b.dk.back().copy;
  const bool w64 = kHaveAvx512, w32 = !w64 && or_reduce_has_avx2();
  b.dk.push_back({w64   ? "nt-store-64B-by-token"
                  : w32 ? "nt-store-32B-by-token"
                        : "nt-store-16B-by-token",
                  widest,
                  true,
                  {},
                  false,
                  true});
  b.dk.push_back({w64   ? "nt-store-64B+self-plain-by-token"
                  : w32 ? "nt-store-32B+self-plain-by-token"
                        : "nt-store-16B+self-plain-by-token",
                  widest,
                  true,
                  {},
                  true,
                  true});
  // Last, so that the combines' untimed dispatches (staging, run()) store as the library does:
  // the widest non-temporal copy, and plain stores for a small call's rows to itself.
  b.dk.push_back({kHaveAvx512            ? "nt-store-64B+self-plain"
                  : or_reduce_has_avx2() ? "nt-store-32B+self-plain"
                                         : "nt-store-16B+self-plain",
                  widest,
                  true,
                  {},
                  true});
  for (const SendRow& s : sends) b.rows_to_self += s.dest == me ? 1 : 0;
  if (vector_or) {  // outputs the library streams (4 MiB and more: prefill)
    b.ck.push_back({"or-reduce-stream", nullptr, true, {false, false, true}});
    b.ck.push_back({"or-reduce-128B-prefetch-stream", nullptr, true, {true, true, true}});
    if (or_reduce_has_avx2())
      b.ck.push_back({"or-reduce-prefetch-next-stream", nullptr, true, {true, true, true, true}});
  }
  b.td.resize(b.layouts.size() * b.dk.size());
  b.tc.resize(b.layouts.size() * b.ck.size());
}

BoundHarness::~BoundHarness() {
  // Nobody unmaps the window while a peer still reads it (a failed run is already past
  // recovery: the bench ends there).
  if (!std::uncaught_exceptions()) impl_->g.barrier();
}

std::vector<uint16_t> BoundHarness::last_expert_row(size_t k) const {
  const Impl& b = *impl_;
  if (!b.last_pl) return {};
  size_t first = 0;  // the index of the run's first row
  for (const auto& [pos, n] : b.last_pl->runs) {
    if (k < first + static_cast<size_t>(n)) {
      const auto* row = reinterpret_cast<const uint16_t*>(b.expert_output().row_at(
          b.g.rank(), 2 + b.last_half, pos + static_cast<int64_t>(k - first)));
      return {row, row + b.dequantized_values()};
    }
    first += static_cast<size_t>(n);
  }
  return {};
}

void BoundHarness::set_fp8_expert(int64_t hidden) {
  Impl& b = *impl_;
  UBEP_CHECK_ARG(hidden > 0 && b.scale_bytes == 0 && b.row_bytes == 2 * static_cast<size_t>(hidden),
                 "set_fp8_expert: hidden ", hidden, " does not fit bf16 rows of ", b.row_bytes,
                 " bytes (scales ", b.scale_bytes, ")");
  b.fp8_hidden = hidden;
  b.scratch.assign(static_cast<size_t>(hidden), 0.0f);
  b.ones.assign(static_cast<size_t>(fp8_scales_per_row(hidden)), 1.0f);
}

void BoundHarness::set_fp8_expert_into(BoundHarness& bf16_rows) {
  Impl& b = *impl_;
  Impl& o = *bf16_rows.impl_;
  UBEP_CHECK_ARG(b.scale_bytes > 0 && o.scale_bytes == 0 && o.fp8_into == nullptr &&
                     o.row_bytes == 2 * b.row_bytes,
                 "set_fp8_expert_into: rows of ", b.row_bytes, " bytes with scales ", b.scale_bytes,
                 " need a harness of bf16 rows (", 2 * b.row_bytes, " bytes, no scales), not ",
                 o.row_bytes, " bytes with scales ", o.scale_bytes);
  bool same = o.sends.size() == b.sends.size() && o.layouts.size() == b.layouts.size();
  for (size_t l = 0; same && l < b.layouts.size(); ++l) same = o.layouts[l].pos == b.layouts[l].pos;
  UBEP_CHECK_ARG(same, "set_fp8_expert_into: the harnesses place different rows");
  b.fp8_into = &o;
  b.scratch.assign(b.row_bytes, 0.0f);
}

void BoundHarness::run(int iters, bool record) {
  Impl& b = *impl_;
  Group& g = b.g;
  const size_t L = b.layouts.size(), D = b.dk.size(), C = b.ck.size();
  // Every timed op starts from the memory state a call leaves its successor: the window half
  // flips at every op, as the epoch parity does, and each combine follows its own fresh
  // dispatch (untimed, with the stores a call uses: ep::DispatchCall::streams_row) and expert
  // copy. Combines run back to back over the same rows instead
  // find them in L3 from the previous candidate's copy: on the Zen 4 VM (2 ranks, decode) the
  // library's own reduction ran 25-40% faster there than inside a real combine -- a "bound"
  // no call can reach, because no call reads its rows twice.
  const Kernel& staging = b.dk.back();
  b.recording = record;
  for (int i = 0; i < iters; ++i, ++b.iterations) {
    // Rotate the order of the candidates, so none always runs first (or last) in an iteration.
    const auto rot = static_cast<size_t>(b.iterations);
    // A dispatch finds its window half as a call finds it: written by its own dispatch two
    // calls earlier, then read by the owner's expert, with a combine's traffic in between. So
    // three steps of dispatch + expert + combine per candidate, the last dispatch timed. Timed
    // right after the other candidates instead, plain stores found the lines evicted by a
    // non-temporal one, and bsp's memcpy beat that "bound" on small calls (tiny: 7.5 vs 8.3 us;
    // 8 tokens, throughput: 8.8 vs 12.2 us; with the steps 0.98-0.99x and 0.97x).
    for (size_t n = 0; n < L * D; ++n) {
      const size_t c = (n + rot) % (L * D);
      const RowPlaces& pl = b.layouts[c / D];
      for (int step = 0; step < 3; ++step) {
        b.par ^= 1;
        b.start.wait();  // all ranks at once
        const auto t0 = Clock::now();
        b.dispatch(b.dk[c % D], pl, b.par);
        if (record && step == 2) b.td[c].push_back(us_since(t0));
        g.barrier();  // every row is placed before its owner's expert copies it
        b.expert(pl, b.par);
        g.barrier();  // every expert output is written before anyone reads it back
        // Chained (fp8): the calls' combine, of the expert's bf16 rows (the same places).
        if (b.fp8_into)
          b.fp8_into->combine(b.fp8_into->ck[1], b.fp8_into->layouts[c / D], b.par);
        else
          b.combine(b.ck[1], pl, b.par);  // ck[1]: plain or-reduce
      }
    }
    // Chained to a bf16 harness, this one bounds the dispatch only (the combine is the other's).
    for (size_t n = 0; n < (b.fp8_into ? 0 : L * C); ++n) {
      const size_t c = (n + rot) % (L * C);
      const RowPlaces& pl = b.layouts[c / C];
      b.par ^= 1;
      g.barrier();
      b.dispatch(staging, pl, b.par);
      g.barrier();  // every row is placed before its owner's expert copies it
      b.expert(pl, b.par);
      b.start.wait();  // every expert output is written before anyone reads it back
      const auto t0 = Clock::now();
      b.combine(b.ck[c % C], pl, b.par);
      if (record) b.tc[c].push_back(us_since(t0));
    }
  }
}

std::vector<BenchRow> BoundHarness::rows() {
  Impl& b = *impl_;
  const double bytes = static_cast<double>(b.sends.size()) * static_cast<double>(b.row_bytes);
  const double dispatch_bytes =
      static_cast<double>(b.sends.size()) * static_cast<double>(b.row_bytes + b.scale_bytes);
  auto fastest = [&](const std::vector<Kernel>& ks, std::vector<std::vector<double>>& ts,
                     size_t layout, const char* op, double op_bytes) {
    BenchRow best;
    std::vector<std::pair<std::string, double>> all;
    for (size_t k = 0; k < ks.size(); ++k) {
      BenchRow r = make_row(b.g, layout == 0 ? "bound" : "bound_packed", ks[k].name, op,
                            ts[layout * ks.size() + k], op_bytes);
      all.emplace_back(ks[k].name, r.median_us);
      if (k == 0 || r.median_us < best.median_us) best = r;
    }
    best.candidates = std::move(all);
    return best;
  };
  std::vector<BenchRow> out;
  const double step_us = mean_over_ranks(
      b.g, b.expert_steps ? b.expert_us_sum / static_cast<double>(b.expert_steps) : 0.0);
  for (size_t l = 0; l < b.layouts.size(); ++l) {
    out.push_back(fastest(b.dk, b.td, l, "dispatch", dispatch_bytes));
    if (!b.fp8_into) out.push_back(fastest(b.ck, b.tc, l, "combine", bytes));
  }
  for (BenchRow& r : out) r.expert_step_us = step_us;
  return out;
}

}  // namespace ubep::tools
