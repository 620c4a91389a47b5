// The owner side of combine: the fixed-order reduction of one token into the combine output.
// Both algorithms reduce through here, so their results are the same bits (DESIGN §2): fp32
// accumulation from 0 in ascending rank (throughput) or ascending k (latency), rounded once;
// across hosts, this host's partial and the remote hosts' partials (relay.hpp) added in ascending
// host order.
#pragma once

#include <algorithm>
#include <vector>

#include "backend/data_path.hpp"
#include "core/local_array.hpp"
#include "ep/dispatch_call.hpp"
#include "ep/policy_tuner.hpp"
#include "ep/waiter.hpp"
#include "ep/window.hpp"

namespace ubep::ep {

inline constexpr int kMaxFusedRows = 256;  // > max_topk (64); groups up to 256 ranks

class TokenReducer {
 public:
  // relay: nullptr when the group is on one host.
  TokenReducer(const Group& g, const BufferConfig& cfg, backend::DataPath& dp, const Window& win,
               const Waiter& waiter, HostRelay* relay);

  // Where a combine's y goes: the caller's memory (CombineArgs::out), or else the reducer's own
  // [max tokens per rank, combine row], in the combine dtype.
  char* y(char* out) const { return out ? out : y_.get(); }
  TensorView y_view(int64_t tokens, char* out) const {
    return TensorView(y(out), cdtype_, {tokens, H_});
  }
  // Member m's fp32 accumulator row [hidden] (a role team member reduces with its own).
  float* acc(int m) { return &acc_[static_cast<size_t>(m) * static_cast<size_t>(H_)]; }

  // Around a combine's reduction of `call`, on the thread that runs the call: begin() before
  // any reduce() (and before the worker team starts), reduced() after, with the stage's own
  // work in microseconds (waits on peers excluded). They let prefetch_tuner_ choose whether a
  // throughput call's rows take software prefetch (see prefetch_sequential_).
  void begin(const DispatchCall& call);
  void reduced(double own_us);

  // Reduces token t of `call` into y(out); acc_row is the caller's scratch; locate(t, j) -> the
  // row of the j-th contribution (throughput: j is the expert rank; latency: j is k), waited for.
  // where(t, j): the same row's address without waiting; next: the token this thread reduces
  // after t (-1: none), whose rows the data path starts fetching as t's reduction ends.
  template <typename Locate, typename Where>
  void reduce(const DispatchCall& call, char* out, int64_t t, int64_t next, float* acc_row,
              Locate&& locate, Where&& where);

 private:
  // One host, at most kMaxFusedRows contributions: gather the rows (waiting for each), then one
  // fused pass over them into out.
  template <typename Locate, typename Where>
  void reduce_fused(const DispatchCall& call, char* out, int64_t t, int64_t next, Locate&& locate,
                    Where&& where);
  bool same_host(int r) const { return grp_.same_host(r, rank_); }
  // A remote host's partial of token t, waited for (nullptr if the token has no expert there).
  const float* remote_partial(int h, int64_t t);

  const Group& grp_;
  backend::DataPath& dp_;
  const Waiter& waiter_;
  HostRelay* relay_;
  int rank_, ranks_;
  int64_t H_;
  DType cdtype_;
  size_t row_bytes_;
  LocalArray y_;
  std::vector<float> part_;  // [hidden] this host's partial (multi-host)
  std::vector<float> acc_;   // [members, hidden]
  // Whether this call's throughput rows take the software prefetch (into L2, and the next
  // token's rows as a token ends) that the latency layout's scattered rows always take. A
  // throughput call's rows continue where the previous token's ended, so the hardware's
  // prefetchers follow them; whether the hints still pay depends on the machine: on the Zen 4
  // VM (prefill, 2 process ranks) the reduction took 6.7-7.3 ms with them against 5.4 without;
  // on the Xeon VM of 2026-12-05 (Emerald Rapids) the whole combine 8.9 ms with them against
  // 11.2 without (docs/PERFORMANCE.md, issue 31, fourteenth session). So prefetch_tuner_
  // measures both on this rank (first policy: none).
  // Written by begin() on the call's thread before the worker team starts, read by the members
  // in reduce_fused(): the team's start (release/acquire) orders the write before every read,
  // and nobody writes it again until the team has ended. The stress test
  // UbepStress.BackToBackCallsWithRandomDelays (throughput and latency calls, 0-2 workers,
  // under ThreadSanitizer in CI) flips it while probing.
  bool prefetch_sequential_ = false;
  bool timing_ = false;  // this call's reduction is a sample for prefetch_tuner_
  PolicyTuner prefetch_tuner_;
};

template <typename Locate, typename Where>
void TokenReducer::reduce(const DispatchCall& call, char* y_out, int64_t t, int64_t next, float* a,
                          Locate&& locate, Where&& where) {
  const int64_t H = H_;
  const Routing& routing = call.routing();
  const int K = routing.topk;
  const Layout layout = call.layout();
  char* out = y(y_out) + static_cast<size_t>(t) * row_bytes_;
  // This host's contributions, from 0, in ascending rank (throughput) or ascending k (latency).
  auto local_partial = [&](float* p) {
    std::fill(p, p + H, 0.0f);
    if (layout == Layout::kThroughput) {
      for (int r = 0; r < ranks_; ++r)
        if (routing.sent(t, r) && same_host(r))
          dp_.accumulate_row(p, locate(t, r), cdtype_, H, nullptr);
    } else {
      for (int j = 0; j < K; ++j) {
        const size_t tk = static_cast<size_t>(t * K + j);
        const int32_t e = routing.topk_idx[tk];
        if (e < 0 || !same_host(routing.expert_rank[static_cast<size_t>(e)])) continue;
        dp_.accumulate_row(p, locate(t, j), cdtype_, H, &routing.topk_weights[tk]);
      }
    }
  };
  if (!relay_ && ranks_ <= kMaxFusedRows) {
    reduce_fused(call, out, t, next, locate, where);
    return;
  }
  if (!relay_) {
    local_partial(a);
  } else {
    // Per-host partials added in ascending host order: the first one is taken as is.
    bool first = true;
    for (int h = 0; h < grp_.num_hosts(); ++h) {
      const float* p = nullptr;
      if (h == grp_.host_of(rank_)) {
        bool any = false;
        for (int r = 0; r < ranks_ && !any; ++r) any = routing.sent(t, r) && same_host(r);
        if (!any) continue;
        local_partial(part_.data());
        p = part_.data();
      } else {
        p = remote_partial(h, t);
        if (!p) continue;
      }
      if (first)
        std::copy(p, p + H, a);
      else
        for (int64_t i = 0; i < H; ++i) a[i] += p[i];
      first = false;
    }
    if (first) std::fill(a, a + H, 0.0f);
  }
  dp_.store_row(out, a, cdtype_, H);
}

template <typename Locate, typename Where>
void TokenReducer::reduce_fused(const DispatchCall& call, char* out, int64_t t, int64_t next,
                                Locate&& locate, Where&& where) {
  const Routing& routing = call.routing();
  const int K = routing.topk;
  const Layout layout = call.layout();
  const void* rows[kMaxFusedRows];
  const void* next_rows[kMaxFusedRows];
  float weights[kMaxFusedRows];
  auto gather = [&](int64_t tok, auto&& row_of, const void** out_rows) {
    int n = 0;
    if (layout == Layout::kThroughput) {
      for (int r = 0; r < ranks_; ++r)
        if (routing.sent(tok, r)) out_rows[n++] = row_of(tok, r);
    } else {
      for (int j = 0; j < K; ++j) {
        const size_t tk = static_cast<size_t>(tok * K + j);
        if (routing.topk_idx[tk] < 0) continue;
        weights[n] = routing.topk_weights[tk];
        out_rows[n++] = row_of(tok, j);
      }
    }
    return n;
  };
  // Throughput rows lie in token order at each expert rank (a source's rows are contiguous),
  // so the hardware prefetchers follow them; they take the software prefetches (and hint the
  // next token's rows) only where this rank measured that faster (prefetch_sequential_).
  const bool sequential = layout == Layout::kThroughput && !prefetch_sequential_;
  // The next token first: its gather overwrites `weights`, which t's gather then sets.
  const int next_n = next >= 0 && !sequential ? gather(next, where, next_rows) : 0;
  const int n = gather(t, locate, rows);
  // Outputs larger than the streaming threshold skip the cache (like dispatch's rows).
  const bool stream = static_cast<double>(routing.num_tokens) * static_cast<double>(row_bytes_) >=
                      DispatchCall::kStreamBytes;
  dp_.reduce_rows(out, cdtype_, H_, rows, layout == Layout::kLatency ? weights : nullptr, n, stream,
                  next_rows, next_n, sequential);
}

}  // namespace ubep::ep
