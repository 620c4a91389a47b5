// ubep.deep_ep's normal-mode calls that reuse a dispatch's routing, in one native call each
// (python/ubep/_deep_ep_normal.py): the cached dispatch (handle=) and the combine with
// topk_weights. Megatron-LM's DeepEP path makes both in every backward pass (the backward of
// combine is a cached dispatch, the backward of dispatch a combine with the weights' gradient);
// from Python each took a dozen objects and two or three native calls around the data movement
// (docs/DEEPEP.md, Performance). Part of the _ubep.Buffer binding (buffer.cpp binds them).
#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>

#include "arrays.hpp"
#include "buffer.hpp"
#include "interrupt.hpp"
#include "ubep/error.hpp"

namespace ubep::python {

namespace {

// The routing a DeepEP handle keeps (int64 [tokens, k]), borrowed for a dispatch of `tokens`.
Borrowed borrow_route(pb::handle route, int64_t tokens, const Device& dev) {
  Borrowed r = borrow(route, "dispatch: the handle's routing", DType::kInt64, dev);
  UBEP_CHECK_ARG(r.view.ndim == 2, "dispatch: the handle's routing must be [tokens, k], got ",
                 r.view.describe());
  UBEP_CHECK_ARG(r.view.dim(0) == tokens, "dispatch: x has ", tokens,
                 " tokens, the handle's dispatch had ", r.view.dim(0),
                 " (a cached dispatch sends the same tokens again)");
  return r;
}

}  // namespace

pb::tuple PyBuffer::deep_ep_cached_dispatch(pb::handle self, pb::handle x, pb::handle x_scales,
                                            const std::string& x_dtype, pb::handle route) {
  PyBuffer& b = self.cast<PyBuffer&>();
  Buffer& buf = *b.buf_;
  check_host_memory(buf, "deep_ep_cached_dispatch");
  const BufferConfig& cfg = buf.config();
  const DispatchX bx = borrow_dispatch_x(cfg, x, x_scales, x_dtype);
  const int64_t T = bx.x.view.ndim >= 1 ? bx.x.view.dim(0) : 0;
  const Borrowed br = borrow_route(route, T, cfg.device);
  DispatchArgs a;
  a.x = bx.x.view;
  a.x_scales = bx.scales.view;
  a.topk_idx = br.view;
  a.topk_weights = b.ones(T, br.view.dim(1));  // DeepEP's cached dispatch sends no weights
  a.layout = Layout::kThroughput;
  const DispatchResult r = without_gil([&] { return buf.dispatch(a); });
  b.remember(r, T);
  return pb::make_tuple(owned_copy(r.recv_x), owned_copy(r.recv_x_scales), r.handle);
}

pb::tuple PyBuffer::deep_ep_normal_combine(pb::handle x, uint64_t handle, PyBuffer& weights,
                                           pb::handle route, pb::handle topk_weights) {
  check_host_memory(*buf_, "deep_ep_normal_combine");
  UBEP_CHECK_ARG(handle == last_handle_, "combine: handle ", handle,
                 " is not the last dispatch on this buffer (", last_handle_, ")");
  Buffer& wbuf = *weights.buf_;
  const BufferConfig& wcfg = wbuf.config();
  const Device& dev = wcfg.device;
  // Every argument checked before the first combine: a call that fails leaves neither window
  // with a combine begun.
  const int64_t rows = last_result_.recv_x.dim(0), k = wcfg.hidden;
  const Borrowed bw = borrow(topk_weights, "combine: topk_weights", DType::kFP32, dev);
  UBEP_CHECK_ARG(bw.view.ndim == 2 && bw.view.dim(0) == rows && bw.view.dim(1) == k,
                 "combine: topk_weights must be [", rows, ", ", k,
                 "] (one row per received token), got ", bw.view.describe());
  UBEP_CHECK_ARG(wcfg.dtype == DType::kFP32 && wcfg.device.type == buf_->config().device.type,
                 "deep_ep_normal_combine: the weights window must be fp32 on ",
                 buf_->config().device.describe());
  const Borrowed br = borrow_route(route, last_tokens_, dev);
  pb::object y = combine_new(x, handle, pb::none(), false);

  // The weights travel back along the dispatch's routing: a dispatch on the weights window sets
  // up each received row's place (its values do not matter: ones, as its weights), and the
  // combine of the caller's weights sums each token's rows in ascending rank order.
  DispatchArgs a;
  const int64_t T = last_tokens_, topk = br.view.dim(1);
  a.x = weights.ones(T, std::max(k, topk));  // one array of ones for x [T, k] and the weights
  a.topk_weights = a.x;
  a.x.shape = {T, k, 0};
  a.topk_weights.shape = {T, topk, 0};
  a.topk_idx = br.view;
  a.layout = Layout::kThroughput;
  const DispatchResult r = without_gil([&] { return wbuf.dispatch(a); });
  weights.remember(r, T);
  pb::object combined = weights.combine_new(topk_weights, r.handle, pb::none(), false);
  return pb::make_tuple(y, combined, r.handle);
}

}  // namespace ubep::python
