// The host-driven engine behind a Buffer (backend/engine.hpp) on the CPU backend: the parts it
// is composed of, and the glue the algorithms share (bounded waits that keep the cross-host
// relay going, the fixed-order reduction of one token).
//
//   DataPath   (backend)  how bytes and tags move, where roles run   src/backend/data_path.hpp
//   Window     (ep)       window map, epochs, count records, tags    src/ep/window.hpp
//   CallState  (ep)       routing, offsets, arrivals of one call     src/ep/call_state.hpp
//   Algorithm  (ep)       bsp | ubep over the three above            src/ep/algorithm.hpp
//   HostRelay  (ep)       the cross-host relay, over a Remote        src/ep/relay.hpp
#pragma once

#include <memory>
#include <vector>

#include "backend/data_path.hpp"
#include "backend/engine.hpp"
#include "core/local_array.hpp"
#include "core/wait.hpp"
#include "ep/algorithm.hpp"
#include "ep/call_state.hpp"
#include "ep/window.hpp"
#include "ubep/buffer.hpp"
#include "ubep/scheduler.hpp"

namespace ubep {

class HostRelay;

namespace ep {

struct HostEngine final : backend::Engine {
  Group& grp;
  BufferConfig cfg;
  DType cdtype;  // combine_dtype(cfg): combine's rows (dispatch rows follow the window's codec)
  int rank, ranks, local_experts;
  int64_t T;  // max tokens per rank
  std::unique_ptr<backend::DataPath> dp;
  ep::Window win;
  ep::CallState call;
  ep::FailureWatch watch;  // every wait of this buffer polls the peers' failure words
  WaitPolicy wait;

  // Collective calls started on this buffer (dispatch and combine each count one), and why the
  // buffer is broken ("" while usable): once the ranks are out of step no call may return data.
  uint64_t calls = 0;
  uint64_t rejected = 0;  // the last call whose input this rank rejected (0: none)
  std::string broken;
  uint64_t window_barriers = 0;  // bsp's barriers through the window (one host)
  // Starts call number `calls + 1`; throws BrokenBufferError if the buffer is broken.
  void start_call(const char* what);
  // After the call's inputs were accepted: fails the call if a peer's buffer broke.
  void join_call(const char* what);
  // This rank rejected its input before sending anything: tell peers waiting in this call.
  void reject_call();
  // The call failed after the ranks started it: the buffer is broken, for this rank and (through
  // its failure word) for its peers.
  void break_call(const char* what, const std::exception& cause);

  enum class Phase { kIdle, kDispatchSent, kCombineSent } phase = Phase::kIdle;
  bool have_dispatch = false;
  bool combined = false;  // the last dispatch was combined (at most once: see ubep.cpp)

  std::unique_ptr<HostRelay> relay;             // cross-host relay, when the group spans hosts
  std::unique_ptr<sched::Scheduler> scheduler;  // when cfg.schedule plans the send work
  sched::Plan plan;
  std::vector<int64_t> plan_rows;  // [R] rows per destination handed to the scheduler

  LocalArray y;                 // [T, row] combine output
  LocalArray compacted;         // [valid rows, payload] compact() output
  LocalArray compacted_scales;  // [valid rows, scales] its scales (fp8)
  int64_t compacted_rows = -1;  // rows of the last compact() (-1: none since the last dispatch)
  // fp8 cast on send: this rank's x as e4m3 codes and scales, [T, payload] and [T, scales].
  LocalArray cast_x, cast_scales;
  std::vector<float> part;  // [hidden] one host's partial (multi-host combine)
  std::vector<float> acc;   // [members, hidden] fp32 accumulators
  CallStats stats;
  std::unique_ptr<ep::Algorithm> bsp, ubep;

  HostEngine(Group& g, const BufferConfig& c, std::unique_ptr<backend::DataPath> data_path);
  ~HostEngine() override;

  // backend::Engine: Buffer's calls (host_engine.cpp).
  DispatchResult dispatch(const DispatchArgs& args) override;
  TensorView combine(const CombineArgs& args) override;
  void dispatch_send(const DispatchArgs& args) override;
  DispatchResult dispatch_recv() override;
  void combine_send(const CombineArgs& args) override;
  TensorView combine_recv() override;
  std::array<int64_t, 2> wait_recv_range(int source, int local_expert) override;
  DispatchResult pending_dispatch() const override;
  TensorView pending_combine() const override;
  TensorView compact() override;
  TensorView compact_scales() const override;
  TensorView combine_buffer() const override;
  const BufferConfig& config() const override { return cfg; }
  Group& group() override { return grp; }
  int num_workers() const override { return dp->members() - 1; }
  void set_algorithm(ubep::Algorithm a) override;
  void set_sync_mode(SyncMode m) override;
  const CallStats& last_stats() const override { return stats; }
  size_t shared_bytes() const override { return win.bytes(); }

  ep::Algorithm& algorithm() const { return cfg.algorithm == ubep::Algorithm::kBsp ? *bsp : *ubep; }
  void record_network();  // copies the relay's counters into stats

  size_t row_bytes() const { return win.row_bytes(); }       // a combine row
  const protocol::RowCodec& codec() const { return win.codec(); }  // dispatch rows
  int64_t RT() const { return call.RT(); }
  bool multi_host() const { return relay != nullptr; }
  bool same_host(int r) const { return grp.same_host(r, rank); }

  // Waits for pred; on the caller's thread it keeps the cross-host relay going meanwhile.
  template <typename Pred, typename Describe>
  void wait_for(Pred&& pred, bool caller, Describe&& describe);
  // Owner side: reduce token t into y; locate(t, j) -> (row pointer) for the j-th contribution.
  template <typename Locate>
  void reduce_token(int64_t t, float* acc_row, Locate&& locate);

  // Multi-host helpers (relay.cpp): keep the relay going; a remote host's partial of token t,
  // waited for (nullptr if the token has no expert on that host).
  void relay_progress();
  const float* remote_partial(int h, int64_t t);

  void begin_dispatch(const DispatchArgs& a);
  void set_dispatch_source(const DispatchArgs& a);  // call.source; casts to fp8 if asked
  DispatchResult result() const;
  TensorView combine_input_view() const;
  TensorView compact_rows();
  TensorView y_view() const;
  void check_combine(const CombineArgs& a) const;
  void set_combine_weights(const CombineArgs& a);  // after check_combine accepted them
};

inline constexpr int kMaxFusedRows = 256;  // > max_topk (64); groups up to 256 ranks

template <typename Locate>
void HostEngine::reduce_token(int64_t t, float* a, Locate&& locate) {
  const int64_t H = cfg.hidden;
  const ep::Routing& routing = call.routing;
  const int K = routing.topk;
  const Layout layout = call.layout;
  char* out = y.get() + static_cast<size_t>(t) * row_bytes();
  // This host's contributions, from 0, in ascending rank (throughput) or ascending k (latency).
  auto local_partial = [&](float* p) {
    std::fill(p, p + H, 0.0f);
    if (layout == Layout::kThroughput) {
      for (int r = 0; r < ranks; ++r)
        if (routing.sent(t, r) && same_host(r))
          dp->accumulate_row(p, locate(t, r), cdtype, H, nullptr);
    } else {
      for (int j = 0; j < K; ++j) {
        const size_t tk = static_cast<size_t>(t * K + j);
        const int32_t e = routing.topk_idx[tk];
        if (e < 0 || !same_host(e / local_experts)) continue;
        dp->accumulate_row(p, locate(t, j), cdtype, H, &routing.topk_weights[tk]);
      }
    }
  };
  if (!multi_host() && ranks <= kMaxFusedRows) {
    // One host: gather the rows (waiting for each), then one fused pass over them.
    const void* rows[kMaxFusedRows];
    float weights[kMaxFusedRows];
    int n = 0;
    if (layout == Layout::kThroughput) {
      for (int r = 0; r < ranks; ++r)
        if (routing.sent(t, r)) rows[n++] = locate(t, r);
    } else {
      for (int j = 0; j < K; ++j) {
        const size_t tk = static_cast<size_t>(t * K + j);
        if (routing.topk_idx[tk] < 0) continue;
        weights[n] = routing.topk_weights[tk];
        rows[n++] = locate(t, j);
      }
    }
    // Outputs larger than the streaming threshold skip the cache (like dispatch's rows).
    const bool stream =
        static_cast<double>(routing.num_tokens) * static_cast<double>(row_bytes()) >=
        ep::CallState::kStreamBytes;
    dp->reduce_rows(out, cdtype, H, rows, layout == Layout::kLatency ? weights : nullptr, n,
                    stream);
    return;
  }
  if (!multi_host()) {
    local_partial(a);
  } else {
    // Per-host partials added in ascending host order: the first one is taken as is.
    bool first = true;
    for (int h = 0; h < grp.num_hosts(); ++h) {
      const float* p = nullptr;
      if (h == grp.host_of(rank)) {
        bool any = false;
        for (int r = 0; r < ranks && !any; ++r) any = routing.sent(t, r) && same_host(r);
        if (!any) continue;
        local_partial(part.data());
        p = part.data();
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
  dp->store_row(out, a, cdtype, H);
}

template <typename Pred, typename Describe>
void HostEngine::wait_for(Pred&& pred, bool caller, Describe&& describe) {
  auto named = [&] { return detail::concat(describe(), " in call ", watch.call()); };
  if (caller && relay) {
    wait_until([&] { return pred() || (relay_progress(), pred()); }, wait, named);
  } else {
    wait_until(pred, wait, named);
  }
}

}  // namespace ep
}  // namespace ubep
