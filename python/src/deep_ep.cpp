// ubep.deep_ep's low-latency calls in one native call each (python/ubep/_deep_ep_ll.py): the
// per-call Python work, more than the native call itself for a small dispatch, is the cost of
// DeepEP's API over ubep's own (docs/DEEPEP.md, Performance). Part of the _ubep.Buffer binding
// (buffer.cpp binds these methods).
#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <utility>

#include "arrays.hpp"
#include "buffer.hpp"
#include "interrupt.hpp"
#include "ubep/error.hpp"

namespace ubep::python {

// One call instead of the dozen torch ops it takes from Python (each dearer than the loops):
// the per-call overhead of ubep.deep_ep over the native API (docs/DEEPEP.md, Performance).
namespace {
// deep_ep_layout's arrays, borrowed and checked against the dispatch r.
struct DeepEPLayout {
  Borrowed count, src_info, layout_range;
};

DeepEPLayout borrow_deep_ep_layout(const DispatchResult& r, const Device& dev, pb::handle count,
                                   pb::handle src_info, pb::handle layout_range) {
  UBEP_CHECK_ARG(r.layout == Layout::kLatency, "deep_ep_layout: not a latency-layout dispatch");
  const int64_t El = r.recv_src.dim(0), rows = r.recv_src.dim(1), R = r.recv_range.dim(1);
  DeepEPLayout l{borrow_writable(count, "deep_ep_layout: count", DType::kInt32, dev),
                 borrow_writable(src_info, "deep_ep_layout: src_info", DType::kInt32, dev),
                 borrow_writable(layout_range, "deep_ep_layout: layout_range", DType::kInt64, dev)};
  UBEP_CHECK_ARG(l.count.view.numel() == El && l.src_info.view.numel() == El * rows &&
                     l.layout_range.view.numel() == El * R,
                 "deep_ep_layout: expected count [", El, "], src_info [", El, ", ", rows,
                 "], layout_range [", El, ", ", R, "], got ", l.count.view.describe(), ", ",
                 l.src_info.view.describe(), ", ", l.layout_range.view.describe());
  return l;
}

// Fills DeepEP's formats from r (no GIL needed): count [El], src_info [El, rows] and
// layout_range [El, R] as deep_ep_layout describes them.
void fill_deep_ep_layout(const DispatchResult& r, int32_t* c, int32_t* si, int64_t* lr) {
  const int64_t El = r.recv_src.dim(0), rows = r.recv_src.dim(1), R = r.recv_range.dim(1);
  const auto* rc = r.recv_count.as<const int64_t>();
  const auto* src = r.recv_src.as<const int64_t>();
  const auto* rr = r.recv_range.as<const int64_t>();
  for (int64_t e = 0; e < El; ++e) c[e] = static_cast<int32_t>(rc[e]);
  // Only the received rows: the rest of src_info is undefined, as in DeepEP (a few hundred
  // rows of the 32K a decode window has).
  for (int64_t i = 0; i < El * R; ++i) {
    lr[i] = (rr[2 * i] << 32) | rr[2 * i + 1];
    const int64_t base = (i / R) * rows;
    for (int64_t p = base + rr[2 * i]; p < base + rr[2 * i] + rr[2 * i + 1]; ++p)
      si[p] = static_cast<int32_t>(src[2 * p + 1]);
  }
}

constexpr size_t line_up(size_t bytes) { return (bytes + 63) / 64 * 64; }

// DeepEP's handle arrays for dispatch r, new for the call, in one block: count [El] int32,
// src_info [El, rows] int32, layout_range [El, R] int64.
DeepEPHandleArrays make_handle_arrays(const DispatchResult& r, const Device& dev) {
  const int64_t El = r.recv_src.dim(0), rows = r.recv_src.dim(1), R = r.recv_range.dim(1);
  const size_t count_bytes = line_up(static_cast<size_t>(El) * 4);
  const size_t src_bytes = line_up(static_cast<size_t>(El * rows) * 4);
  HostBlock block = make_host_block(count_bytes + src_bytes + static_cast<size_t>(El * R) * 8);
  DeepEPHandleArrays a{std::move(block.owner), TensorView(block.data, DType::kInt32, {El}),
                       TensorView(block.data + count_bytes, DType::kInt32, {El, rows}),
                       TensorView(block.data + count_bytes + src_bytes, DType::kInt64, {El, R})};
  for (TensorView* v : {&a.count, &a.src_info, &a.layout_range}) v->device = dev;
  return a;
}

void fill_handle_arrays(const DispatchResult& r, DeepEPHandleArrays& a) {
  without_gil([&] {
    fill_deep_ep_layout(r, a.count.as<int32_t>(), a.src_info.as<int32_t>(),
                        a.layout_range.as<int64_t>());
    return 0;
  });
}
}  // namespace

void PyBuffer::deep_ep_layout(uint64_t handle, pb::handle count, pb::handle src_info,
                              pb::handle layout_range) {
  UBEP_CHECK_ARG(handle == last_handle_, "deep_ep_layout: handle ", handle,
                 " is not the last dispatch on this buffer (", last_handle_, ")");
  check_host_memory(*buf_, "deep_ep_layout");
  const DispatchResult& r = last_result_;
  const DeepEPLayout l =
      borrow_deep_ep_layout(r, buf_->config().device, count, src_info, layout_range);
  without_gil([&] {
    fill_deep_ep_layout(r, static_cast<int32_t*>(l.count.view.data),
                        static_cast<int32_t*>(l.src_info.view.data),
                        static_cast<int64_t*>(l.layout_range.view.data));
    return 0;
  });
}

pb::object PyBuffer::deep_ep_dispatch(pb::handle self, pb::handle x, pb::handle topk_idx, int topk,
                                      const std::string& x_dtype, bool send_only) {
  PyBuffer& b = self.cast<PyBuffer&>();
  Buffer& buf = *b.buf_;
  check_host_memory(buf, "deep_ep_dispatch");
  const BufferConfig& cfg = buf.config();
  const Device& dev = cfg.device;
  // x holds the buffer's values, or on an fp8 buffer the values it casts on send.
  const bool fp8 = cfg.dtype == DType::kFP8E4M3;
  UBEP_CHECK_ARG(fp8 != x_dtype.empty(), "deep_ep_dispatch: x_dtype '", x_dtype, "' given for a ",
                 dtype_name(cfg.dtype), " buffer (an fp8 buffer's values only)");
  const DType x_values = fp8 ? parse_dtype(x_dtype) : cfg.dtype;
  UBEP_CHECK_ARG(x_values == DType::kBF16 || x_values == DType::kFP32,
                 "deep_ep_dispatch: x_dtype must be bf16 or fp32, got ", x_dtype);
  // The call shape the caller set this path up for, or None before anything is done: another
  // shape (or a tensor subclass, another device or dtype) is for its full path to check.
  std::optional<Borrowed> bx = borrow_torch_matrix(x, "dispatch: x", x_values, cfg.hidden, dev);
  if (!bx) return pb::none();
  std::optional<Borrowed> bi =
      borrow_torch_matrix(topk_idx, "dispatch: topk_idx", DType::kInt64, topk, dev);
  if (!bi) return pb::none();
  DispatchArgs a;
  a.x = bx->view;
  a.topk_idx = bi->view;
  // The weights come with combine (DeepEP's low-latency API): ones meanwhile, as dispatch.
  a.topk_weights = b.ones(bi->view.dim(0), bi->view.dim(1));
  a.layout = Layout::kLatency;
  DispatchResult r = without_gil([&] {
    if (!send_only) return buf.dispatch(a);
    buf.dispatch_send(a);
    return buf.pending_dispatch();  // views: the counts fill in as the receive completes
  });
  b.remember(r, bi->view.dim(0));
  b.pending_arrays_.reset();  // a dispatch_send whose receive never came: its arrays stay unfilled
  // DeepEP's handle arrays, new at every call as DeepEP's (a handle may outlive later
  // dispatches: a combine of it replays its dispatch), made here: three torch.empty from Python
  // cost more than the whole native call (docs/DEEPEP.md). Filled once the rows are here.
  DeepEPHandleArrays arrays = make_handle_arrays(r, dev);
  pb::tuple out =
      pb::make_tuple(to_array(r.recv_x, self, Kind::kTorch),
                     fp8 ? to_array(r.recv_x_scales, self, Kind::kTorch) : pb::none(),
                     to_array(arrays.count, arrays.owner, Kind::kTorch),
                     to_array(arrays.src_info, arrays.owner, Kind::kTorch),
                     to_array(arrays.layout_range, arrays.owner, Kind::kTorch), r.handle);
  if (send_only)
    b.pending_arrays_ = std::move(arrays);
  else
    fill_handle_arrays(r, arrays);
  return out;
}

void PyBuffer::deep_ep_dispatch_recv() {
  UBEP_CHECK_ARG(pending_arrays_.has_value(),
                 "deep_ep_dispatch_recv: no deep_ep_dispatch(send_only=True) outstanding");
  // Taken first: a receive that fails leaves nothing pending (the next dispatch starts clean).
  DeepEPHandleArrays arrays = std::move(*pending_arrays_);
  pending_arrays_.reset();
  const DispatchResult r = without_gil([&] { return buf_->dispatch_recv(); });
  last_result_ = r;
  fill_handle_arrays(r, arrays);
}

}  // namespace ubep::python
