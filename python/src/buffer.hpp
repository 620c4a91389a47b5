// The Buffer binding (see buffer.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "interrupt.hpp"
#include "ubep/buffer.hpp"

namespace ubep::python {

namespace pb = pybind11;

// The benchmark helpers and ubep.deep_ep's calls copy with memcpy: host memory (cpu, cuda-sim)
// only; InvalidArgument naming `what` for a GPU buffer.
void check_host_memory(const Buffer& buf, const char* what);

// dispatch's x (and, for fp8 codes, x_scales) borrowed as a buffer of `cfg` takes them: fp8
// buffers take codes with scales, or x_dtype ("bf16"/"fp32", "" for bf16) values cast on send.
struct DispatchX {
  Borrowed x, scales;  // scales.view empty (ndim 0) without x_scales
};
DispatchX borrow_dispatch_x(const BufferConfig& cfg, pb::handle x, pb::handle x_scales,
                            const std::string& x_dtype);

// A new torch tensor holding a copy of host view `v` (None for an empty view), in a block made
// for it (huge pages from 2 MiB: make_host_block's written_whole).
pb::object owned_copy(const TensorView& v);

// DeepEP's low-latency handle arrays of one dispatch (deep_ep.cpp): views of one block made for
// the call, which `owner` keeps (and every tensor exported from them).
struct DeepEPHandleArrays {
  pb::object owner;
  TensorView count, src_info, layout_range;
};

class PyBuffer {
 public:
  // Collective over the group's ranks (made with the GIL released: thread ranks call it at once).
  PyBuffer(pb::object group, BufferConfig cfg);
  ~PyBuffer();

  // `self` is this object: every exported view holds a reference to it, so the Buffer's memory
  // outlives the last view. kind: how results are returned (arrays.hpp Kind).
  // topk_weights may be None (ones; the latency layout's combine takes the real ones).
  // x_scales: fp8 buffers, the scales of fp8 codes x (None: x is x_dtype, cast on send).
  // Returns (recv_x, recv_topk_idx | None, recv_topk_weights | None, recv_count, handle,
  // recv_x_scales | None).
  static pb::tuple dispatch(pb::handle self, pb::handle x, pb::handle topk_idx,
                            pb::handle topk_weights, bool latency, int kind, bool send_only,
                            pb::handle x_scales, const std::string& x_dtype);
  static pb::tuple dispatch_recv(pb::handle self, int kind);
  // out: None, or where y goes (CombineArgs::out; the cpu device).
  static pb::object combine(pb::handle self, pb::handle x, uint64_t handle, pb::handle topk_weights,
                            int kind, bool send_only, pb::handle out);
  static pb::object combine_recv(pb::handle self, int kind);
  // "combine_buffer", "recv_src" or "recv_range" of the dispatch `handle` (the last one).
  static pb::object view(pb::handle self, const std::string& which, uint64_t handle, int kind);

  pb::dict last_stats() const;
  pb::dict config() const;
  pb::list time_calls(pb::handle x, pb::handle topk_idx, pb::handle topk_weights, bool latency,
                      int iters, int warmup, bool barrier);
  void expert_identity();
  // ubep.deep_ep's low-latency handle of the last dispatch (`handle`), written in one call
  // (host memory): count [El] int32, src_info [El, rows] int32 (each received row's source
  // token; other rows untouched),
  // layout_range [El, ranks] int64 (begin << 32 | count).
  void deep_ep_layout(uint64_t handle, pb::handle count, pb::handle src_info,
                      pb::handle layout_range);
  // ubep.deep_ep's low-latency dispatch in one call (host memory; deep_ep.cpp), for the call
  // shape its caller has seen pass its checks: x an exact torch.Tensor [tokens, hidden] of the
  // buffer's dtype (an fp8 buffer: of x_dtype, "bf16" or "fp32", cast on send), topk_idx int64
  // [tokens, topk], both on the cpu; any other shape returns None with nothing done. Dispatches
  // with the weights to come at combine (ones meanwhile) and makes DeepEP's handle arrays
  // (deep_ep_layout's), new for the call, filled now or, with send_only (the split phase), by
  // deep_ep_dispatch_recv. Returns (recv_x, recv_x_scales or None, count, src_info,
  // layout_range, handle), torch tensors (fp8 codes as uint8).
  static pb::object deep_ep_dispatch(pb::handle self, pb::handle x, pb::handle topk_idx, int topk,
                                     const std::string& x_dtype, bool send_only);
  // Completes deep_ep_dispatch(send_only=True): the receive, then its handle arrays.
  void deep_ep_dispatch_recv();
  // ubep.deep_ep's normal dispatch in one call (host memory; deep_ep_normal.cpp): the layout
  // arguments checked against the routing (topk_idx, or without it is_token_in_rank, bool
  // [tokens, ranks]; num_tokens_per_rank and num_tokens_per_expert int32), the dispatch, the
  // count exchange through `counts` (an fp32 window of ranks + experts columns over `ranks`
  // experts) and DeepEP's results made new. Returns (recv_x, recv_x_scales | None,
  // recv_topk_idx int64 | None, recv_topk_weights | None, num_recv_tokens_per_expert_list,
  // rank_prefix_matrix, channel_prefix_matrix, recv_channel_prefix_matrix, recv_src_idx,
  // send_head, the routing made from is_token_in_rank | None, dispatch handle).
  static pb::tuple deep_ep_normal_dispatch(pb::handle self, PyBuffer& counts, pb::handle x,
                                           pb::handle x_scales, const std::string& x_dtype,
                                           pb::handle topk_idx, pb::handle topk_weights,
                                           pb::handle is_token_in_rank,
                                           pb::handle num_tokens_per_rank,
                                           pb::handle num_tokens_per_expert,
                                           int64_t expert_alignment);
  // combine(x, handle, topk_weights, out=out) returning nothing (y is `out`, the cpu device):
  // no result array to convert. x None: the zero-copy combine buffer of the last dispatch.
  // send_only: the split phase (combine_finish completes it; x and out must stay alive).
  void combine_into(pb::handle x, uint64_t handle, pb::handle topk_weights, pb::handle out,
                    bool send_only);
  // The same into a new torch tensor [tokens, hidden] (DeepEP's combine returns a new one) of
  // the last dispatch `handle`, made here: a torch.empty from Python costs more.
  pb::object combine_new(pb::handle x, uint64_t handle, pb::handle topk_weights, bool send_only);

  // New torch tensors holding the last dispatch's recv_x and recv_x_scales (None for bf16/fp32
  // buffers), copied here (DeepEP's normal dispatch returns new tensors): (recv_x, scales).
  pb::tuple owned_recv(uint64_t handle);

  // The receive hook per piece of the outstanding dispatch `handle`: (begin, count).
  pb::tuple wait_recv_range(uint64_t handle, int source, int local_expert);

  // ubep.deep_ep's normal dispatch again with an earlier one's routing (DeepEP's cached
  // dispatch, handle=; host memory; deep_ep_cached.cpp): x (and x_scales, x_dtype as dispatch)
  // sent along `route` (int64 [tokens, k], the earlier dispatch's topk_idx or the routing made
  // from its is_token_in_rank), its weights ones. Returns (recv_x, recv_x_scales | None,
  // dispatch handle), the rows made new as DeepEP's.
  static pb::tuple deep_ep_cached_dispatch(pb::handle self, pb::handle x, pb::handle x_scales,
                                           const std::string& x_dtype, pb::handle route);
  // ubep.deep_ep's normal combine with topk_weights (Megatron's backward of dispatch; host
  // memory; deep_ep_cached.cpp): combine_new(x, handle), then the weights [received rows, k]
  // fp32 summed per token over the ranks they come from, as DeepEP's combined_topk_weights:
  // a dispatch along `route` and a combine on `weights` (an fp32 window of k columns). Returns
  // (y, combined_topk_weights [tokens, k], the weights window's dispatch handle).
  pb::tuple deep_ep_normal_combine(pb::handle x, uint64_t handle, PyBuffer& weights,
                                   pb::handle route, pb::handle topk_weights);

  Buffer& buffer() { return *buf_; }
  uint64_t last_handle() const { return last_handle_; }
  pb::object group_object() const { return group_; }

 private:
  pb::tuple result_tuple(pb::handle self, const DispatchResult& r, int kind);
  // Dispatch r of `tokens` tokens as this window's last (what combines and views refer to).
  void remember(const DispatchResult& r, int64_t tokens) {
    last_handle_ = r.handle;
    last_result_ = r;
    last_tokens_ = tokens;
  }
  // Ones [rows, cols] fp32 in host memory on this window's device: dispatch weights that come
  // later with combine. Valid until the next call asks for more.
  TensorView ones(int64_t rows, int64_t cols) {
    const auto n = static_cast<size_t>(std::max<int64_t>(rows * cols, 0));
    if (ones_.size() < n) ones_.assign(n, 1.0f);
    TensorView v(ones_.data(), DType::kFP32, {rows, cols});
    v.device = buf_->config().device;
    return v;
  }

  pb::object group_;  // keeps the Group (and its shared memory) alive as long as the Buffer
  std::unique_ptr<Buffer> buf_;
  std::vector<float> ones_;  // dispatch weights when None (they come with combine)
  uint64_t last_handle_ = ~uint64_t{0};
  DispatchResult last_result_;
  int64_t last_tokens_ = 0;  // rows of the last dispatch's topk_idx (combine_new's y)
  // deep_ep_dispatch(send_only=True)'s arrays until deep_ep_dispatch_recv fills them
  std::optional<DeepEPHandleArrays> pending_arrays_;
};

void bind_buffer(pb::module_& m);

// DeepEP's get_dispatch_layout for an int64 topk_idx [tokens, topk] in host memory
// (deep_ep_normal.cpp): (num_tokens_per_rank int32 [ranks], num_tokens_per_expert int32
// [experts], is_token_in_rank uint8 [tokens, ranks], 0 or 1, for the caller to view as bool).
pb::tuple deep_ep_dispatch_layout(pb::handle topk_idx, int64_t num_experts, int64_t num_ranks);

// ubep.bench's timing loop, for any implementation: `warmup` untimed then `iters` timed
// dispatch + combine pairs, without the GIL; barrier: an untimed group barrier before each timed
// call, so untimed work in between does not show up as one rank waiting inside the next call.
// dispatch() returns what between(result) (untimed: the expert) and combine(result) take.
// Returns [(dispatch µs, combine µs), ...].
template <typename Dispatch, typename Between, typename Combine>
pb::list time_pairs(Group& group, int iters, int warmup, bool barrier, Dispatch&& dispatch,
                    Between&& between, Combine&& combine) {
  std::vector<std::pair<double, double>> times;
  without_gil([&] {
    using Clock = std::chrono::steady_clock;
    for (int i = 0; i < warmup + iters; ++i) {
      if (barrier) group.barrier();
      const auto t0 = Clock::now();
      auto r = dispatch();
      const auto t1 = Clock::now();
      between(r);
      if (barrier) group.barrier();
      const auto t2 = Clock::now();
      combine(r);
      const auto t3 = Clock::now();
      if (i >= warmup)
        times.emplace_back(std::chrono::duration<double, std::micro>(t1 - t0).count(),
                           std::chrono::duration<double, std::micro>(t3 - t2).count());
    }
    return 0;
  });
  pb::list out;
  for (auto& [d, c] : times) out.append(pb::make_tuple(d, c));
  return out;
}

}  // namespace ubep::python
