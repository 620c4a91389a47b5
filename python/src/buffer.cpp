// _ubep.Buffer: ubep::Buffer with arrays through DLPack. The methods here are the hot path, so
// they do the argument work in C++ (one Python call per dispatch or combine) and hand results
// back already converted to the caller's framework. The DeepEP-shaped API is ubep/buffer.py.
#include "buffer.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "arrays.hpp"
#include "backend/cpu/row_kernels.hpp"
#include "interrupt.hpp"
#include "ubep/error.hpp"

namespace ubep::python {

namespace {

DType dtype_of(const std::string& name) { return parse_dtype(name); }

}  // namespace

DispatchX borrow_dispatch_x(const BufferConfig& cfg, pb::handle x, pb::handle x_scales,
                            const std::string& x_dtype) {
  const DType dt = cfg.dtype;
  // fp8 buffers take fp8 codes with their scales, or bf16/fp32 values that ubep casts on send
  // (x_dtype says which, so the error for a wrong array names what was meant).
  DType expect_x = dt;
  if (dt == DType::kFP8E4M3 && x_scales.is_none())
    expect_x = x_dtype.empty() ? DType::kBF16 : dtype_of(x_dtype);
  UBEP_CHECK_ARG(x_scales.is_none() || dt == DType::kFP8E4M3,
                 "dispatch: x_scales given (an fp8 x) but the buffer's dtype is ", dtype_name(dt),
                 "; make the Buffer with dtype='fp8'");
  DispatchX out;
  out.x = borrow(x, "dispatch: x", expect_x, cfg.device);
  if (!x_scales.is_none())
    out.scales = borrow(x_scales, "dispatch: x_scales", DType::kFP32, cfg.device);
  return out;
}

pb::object owned_copy(const TensorView& v) {
  if (v.ndim == 0) return pb::none();
  const size_t bytes = static_cast<size_t>(v.numel()) * dtype_size(v.dtype);
  HostBlock block = make_host_block(bytes, /*written_whole=*/true);
  TensorView out = v;
  out.data = block.data;
  // From 16 MiB with non-temporal stores: far larger than a cache holds, the copy skips reading
  // every destination line first. glibc's memcpy switches by the L3 size the CPU reports, on
  // the project's VMs the host's (256 MB), so it never did. 2 process ranks, Zen 3 VM, a cached
  // dispatch then a read of its rows (docs/PERFORMANCE.md, thirtieth session): 1024 tokens (29
  // MB) 10.4-11.9 -> 9.0-9.9 ms, 4096 tokens 47.1-47.9 -> 40.7-41.4 ms; at 256 tokens (7.3 MB)
  // no gain (the caller's read then found fewer rows in cache).
  constexpr size_t kStreamCopyBytes = size_t{16} << 20;
  without_gil([&] {
    if (bytes >= kStreamCopyBytes)
      kernels::copy_row_to_peer(block.data, v.data, bytes);  // non-temporal, then a fence
    else
      std::memcpy(block.data, v.data, bytes);
    return 0;
  });
  return to_array(out, block.owner, Kind::kTorch);
}

PyBuffer::PyBuffer(pb::object group_obj, BufferConfig cfg) : group_(std::move(group_obj)) {
  install_interrupt_hook();
  Group& g = group_.cast<Group&>();
  buf_ = without_gil([&] { return std::make_unique<Buffer>(g, cfg); });
}

PyBuffer::~PyBuffer() {
  pb::gil_scoped_release nogil;  // joins the worker threads
  buf_.reset();
}

pb::tuple PyBuffer::dispatch(pb::handle self, pb::handle x, pb::handle topk_idx,
                             pb::handle topk_weights, bool latency, int kind, bool send_only,
                             pb::handle x_scales, const std::string& x_dtype) {
  PyBuffer& b = self.cast<PyBuffer&>();
  Buffer& buf = *b.buf_;
  const Device& dev = buf.config().device;
  const DispatchX bx = borrow_dispatch_x(buf.config(), x, x_scales, x_dtype);
  Borrowed bi = borrow(topk_idx, "dispatch: topk_idx", DType::kInt64, dev);
  DispatchArgs a;
  a.x = bx.x.view;
  a.x_scales = bx.scales.view;
  a.topk_idx = bi.view;
  Borrowed bw;
  if (topk_weights.is_none() && dev.type == DeviceType::kCuda && bi.view.ndim == 2) {
    // Ones in GPU memory (host ones will not do for a GPU buffer).
    bw = borrow(device_ones(bi.view.dim(0), bi.view.dim(1), topk_idx), "dispatch: topk_weights",
                DType::kFP32, dev);
    a.topk_weights = bw.view;
  } else if (topk_weights.is_none()) {
    // Weights that come later, with combine (DeepEP's low-latency API): ones meanwhile, without
    // an array to export from Python.
    // (host memory: cpu or the simulation device). Not 2-D: validation names the bad topk_idx.
    a.topk_weights = bi.view.ndim == 2 ? b.ones(bi.view.dim(0), bi.view.dim(1)) : bi.view;
  } else {
    bw = borrow(topk_weights, "dispatch: topk_weights", DType::kFP32, dev);
    a.topk_weights = bw.view;
  }
  a.layout = latency ? Layout::kLatency : Layout::kThroughput;
  DispatchResult r = without_gil([&] {
    if (!send_only) return buf.dispatch(a);
    buf.dispatch_send(a);
    return buf.pending_dispatch();
  });
  b.last_tokens_ = bi.view.dim(0);
  return b.result_tuple(self, r, kind);
}

pb::tuple PyBuffer::dispatch_recv(pb::handle self, int kind) {
  PyBuffer& b = self.cast<PyBuffer&>();
  DispatchResult r = without_gil([&] { return b.buf_->dispatch_recv(); });
  return b.result_tuple(self, r, kind);
}

pb::tuple PyBuffer::result_tuple(pb::handle self, const DispatchResult& r, int kind) {
  last_handle_ = r.handle;
  last_result_ = r;
  const Kind k = static_cast<Kind>(kind);
  pb::object none = pb::none();
  const bool tp = r.layout == Layout::kThroughput;
  return pb::make_tuple(to_array(r.recv_x, self, k), tp ? to_array(r.recv_topk_idx, self, k) : none,
                        tp ? to_array(r.recv_topk_weights, self, k) : none,
                        to_array(r.recv_count, self, k), r.handle,
                        r.recv_x_scales.ndim ? to_array(r.recv_x_scales, self, k) : none);
}

pb::object PyBuffer::combine(pb::handle self, pb::handle x, uint64_t handle,
                             pb::handle topk_weights, int kind, bool send_only, pb::handle out) {
  PyBuffer& b = self.cast<PyBuffer&>();
  Buffer& buf = *b.buf_;
  const Device& dev = buf.config().device;
  Borrowed bx = borrow(x, "combine: x", combine_dtype(buf.config()), dev);
  Borrowed bw;
  CombineArgs a;
  a.x = bx.view;
  a.handle = handle;
  if (!topk_weights.is_none()) {
    bw = borrow(topk_weights, "combine: topk_weights", DType::kFP32, dev);
    a.topk_weights = bw.view;
  }
  Borrowed bo;
  if (!out.is_none()) {
    bo = borrow_writable(out, "combine: out", combine_dtype(buf.config()), dev);
    a.out = bo.view;
  }
  TensorView y = without_gil([&] {
    if (!send_only) return buf.combine(a);
    buf.combine_send(a);
    return buf.pending_combine();
  });
  return to_array(y, self, static_cast<Kind>(kind));
}

pb::object PyBuffer::combine_recv(pb::handle self, int kind) {
  PyBuffer& b = self.cast<PyBuffer&>();
  TensorView y = without_gil([&] { return b.buf_->combine_recv(); });
  return to_array(y, self, static_cast<Kind>(kind));
}

pb::object PyBuffer::view(pb::handle self, const std::string& which, uint64_t handle, int kind) {
  PyBuffer& b = self.cast<PyBuffer&>();
  UBEP_CHECK_ARG(which == "combine_buffer" || which == "recv_src" || which == "recv_range",
                 "unknown view '", which, "'");
  UBEP_CHECK_ARG(handle == b.last_handle_, which, ": handle ", handle,
                 " is not the last dispatch on this buffer (", b.last_handle_,
                 "): its memory has been reused");
  if (which == "combine_buffer")
    return to_array(b.buf_->combine_buffer(), self, static_cast<Kind>(kind));
  return to_array(which == "recv_src" ? b.last_result_.recv_src : b.last_result_.recv_range, self,
                  static_cast<Kind>(kind));
}

pb::tuple PyBuffer::wait_recv_range(uint64_t handle, int source, int local_expert) {
  UBEP_CHECK_ARG(handle == last_handle_, "wait_recv_range: handle ", handle,
                 " is not the outstanding dispatch on this buffer (", last_handle_, ")");
  const std::array<int64_t, 2> r =
      without_gil([&] { return buf_->wait_recv_range(source, local_expert); });
  return pb::make_tuple(r[0], r[1]);
}

pb::dict PyBuffer::last_stats() const {
  const CallStats& s = buf_->last_stats();
  pb::list stages;
  for (const auto& [name, us] : s.stage_us) stages.append(pb::make_tuple(name, us));
  pb::dict d;
  d["barriers"] = s.barriers;
  d["stage_us"] = stages;
  d["network_bytes"] = s.network_bytes;
  d["network_rows"] = s.network_rows;
  return d;
}

pb::dict PyBuffer::config() const {
  const BufferConfig& c = buf_->config();
  pb::dict d;
  d["max_tokens_per_rank"] = c.max_tokens_per_rank;
  d["hidden"] = c.hidden;
  d["dtype"] = dtype_name(c.dtype);
  d["num_experts"] = c.num_experts;
  d["max_topk"] = c.max_topk;
  d["algorithm"] = algorithm_name(c.algorithm);
  d["sync"] = sync_mode_name(c.research.sync);
  d["num_workers"] = buf_->num_workers();
  d["enable_latency_layout"] = c.enable_latency_layout;
  d["placement"] = placement_name(c.placement);
  d["fp8_pow2_scales"] = c.fp8_pow2_scales;
  d["device"] = c.device.describe();
  return d;
}

namespace {
// The benchmarks' expert: the identity, writing the received rows into the zero-copy combine
// buffer (as ubep-bench does; a real expert GEMM writes its output there).
void identity_expert(Buffer& buf, const DispatchResult& r) {
  const size_t row = static_cast<size_t>(buf.config().hidden) * dtype_size(buf.config().dtype);
  TensorView out = buf.combine_buffer();
  const auto* src = static_cast<const char*>(r.recv_x.data);
  auto* dst = static_cast<char*>(out.data);
  // The valid rows: each (expert, source) range of recv_range (contiguous when compact).
  const bool latency = r.layout == Layout::kLatency;
  const int64_t experts = latency ? r.recv_x.dim(0) : 1;
  const int64_t ranks = r.recv_range.dim(latency ? 1 : 0), rows = latency ? r.recv_x.dim(1) : 0;
  const auto* range = r.recv_range.as<const int64_t>();
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t s = 0; s < ranks; ++s) {
      const int64_t* rr = range + 2 * (e * ranks + s);
      const size_t at = static_cast<size_t>(e * rows + rr[0]) * row;
      std::memcpy(dst + at, src + at, static_cast<size_t>(rr[1]) * row);
    }
}

}  // namespace

void check_host_memory(const Buffer& buf, const char* what) {
  UBEP_CHECK_ARG(buf.config().device.type != DeviceType::kCuda, what,
                 ": a host-memory benchmark helper, not available on a ",
                 buf.config().device.describe(),
                 " buffer (copy recv_x into the combine buffer with torch instead)");
}

void PyBuffer::expert_identity() {
  UBEP_CHECK_ARG(last_handle_ != ~uint64_t{0}, "expert_identity: no dispatch yet");
  check_host_memory(*buf_, "expert_identity");
  without_gil([&] {
    identity_expert(*buf_, last_result_);
    return 0;
  });
}

pb::tuple PyBuffer::owned_recv(uint64_t handle) {
  UBEP_CHECK_ARG(handle == last_handle_, "owned_recv: handle ", handle,
                 " is not the last dispatch on this buffer (", last_handle_, ")");
  check_host_memory(*buf_, "owned_recv");
  const DispatchResult& r = last_result_;
  return pb::make_tuple(owned_copy(r.recv_x), owned_copy(r.recv_x_scales));
}

namespace {
// Combine of `handle` into out() (a view of the caller's memory or of a block made for it),
// taken after x and topk_weights; x None: the zero-copy combine buffer of the last dispatch.
template <typename Out>
void combine_to(Buffer& buf, uint64_t last_handle, pb::handle x, uint64_t handle,
                pb::handle topk_weights, bool send_only, Out&& out) {
  const Device& dev = buf.config().device;
  CombineArgs a;
  a.handle = handle;
  Borrowed bx, bw;
  if (x.is_none()) {
    UBEP_CHECK_ARG(handle == last_handle, "combine_buffer: handle ", handle,
                   " is not the last dispatch on this buffer (", last_handle,
                   "): its memory has been reused");
    a.x = buf.combine_buffer();
  } else {
    bx = borrow(x, "combine: x", combine_dtype(buf.config()), dev);
    a.x = bx.view;
  }
  if (!topk_weights.is_none()) {
    bw = borrow(topk_weights, "combine: topk_weights", DType::kFP32, dev);
    a.topk_weights = bw.view;
  }
  Borrowed bo;  // keeps a borrowed out alive until the call ends
  a.out = out(bo);
  without_gil([&] {
    if (send_only)
      buf.combine_send(a);
    else
      buf.combine(a);
    return 0;
  });
}
}  // namespace

void PyBuffer::combine_into(pb::handle x, uint64_t handle, pb::handle topk_weights, pb::handle out,
                            bool send_only) {
  Buffer& buf = *buf_;
  const Device& dev = buf.config().device;
  UBEP_CHECK_ARG(dev.type == DeviceType::kCpu, "combine_into: cpu buffers only (else combine)");
  combine_to(buf, last_handle_, x, handle, topk_weights, send_only, [&](Borrowed& bo) {
    bo = borrow_writable(out, "combine: out", combine_dtype(buf.config()), dev);
    return bo.view;
  });
}

pb::object PyBuffer::combine_new(pb::handle x, uint64_t handle, pb::handle topk_weights,
                                 bool send_only) {
  Buffer& buf = *buf_;
  const BufferConfig& cfg = buf.config();
  UBEP_CHECK_ARG(cfg.device.type == DeviceType::kCpu,
                 "combine_new: cpu buffers only (else combine)");
  UBEP_CHECK_ARG(handle == last_handle_, "combine_new: handle ", handle,
                 " is not the last dispatch on this buffer (", last_handle_, ")");
  const DType dt = combine_dtype(cfg);
  HostBlock block = make_host_block(static_cast<size_t>(last_tokens_ * cfg.hidden) * dtype_size(dt),
                                    /*written_whole=*/true);
  TensorView y(block.data, dt, {last_tokens_, cfg.hidden});
  y.device = cfg.device;
  combine_to(buf, last_handle_, x, handle, topk_weights, send_only, [&](Borrowed&) { return y; });
  return to_array(y, block.owner, Kind::kTorch);
}

// The calls of a Python loop, timed in C++ with the GIL released throughout: dispatch, the
// identity expert (untimed), zero-copy combine. Their difference to the same loop from Python
// (ubep.bench) is the binding's cost. barrier: a group barrier (untimed) before each timed
// call, so untimed work in between does not show up as one rank waiting for another inside
// the next call.
pb::list PyBuffer::time_calls(pb::handle x, pb::handle topk_idx, pb::handle topk_weights,
                              bool latency, int iters, int warmup, bool barrier) {
  Buffer& buf = *buf_;
  check_host_memory(buf, "time_calls");
  const Device& dev = buf.config().device;
  Borrowed bx = borrow(x, "time_calls: x", buf.config().dtype, dev);
  Borrowed bi = borrow(topk_idx, "time_calls: topk_idx", DType::kInt64, dev);
  Borrowed bw = borrow(topk_weights, "time_calls: topk_weights", DType::kFP32, dev);
  DispatchArgs a{bx.view, bi.view, bw.view, latency ? Layout::kLatency : Layout::kThroughput};
  return time_pairs(
      buf.group(), iters, warmup, barrier, [&] { return buf.dispatch(a); },
      [&](const DispatchResult& r) { identity_expert(buf, r); },
      [&](const DispatchResult& r) {
        buf.combine({buf.combine_buffer(), r.handle});
      });
}

void bind_buffer(pb::module_& m) {
  pb::class_<PyBuffer>(m, "Buffer")
      .def(pb::init([](pb::object group, int64_t max_tokens_per_rank, int64_t hidden,
                       const std::string& dtype, int num_experts, int max_topk,
                       const std::string& algorithm, int num_workers, bool enable_latency_layout,
                       const std::string& sync, const std::string& placement, bool fp8_pow2_scales,
                       const std::string& device, bool mask_dead_ranks) {
             BufferConfig c;
             c.max_tokens_per_rank = max_tokens_per_rank;
             c.hidden = hidden;
             c.dtype = dtype_of(dtype);
             c.fp8_pow2_scales = fp8_pow2_scales;
             c.num_experts = num_experts;
             c.max_topk = max_topk;
             c.algorithm = parse_algorithm(algorithm);
             c.num_workers = num_workers;
             c.enable_latency_layout = enable_latency_layout;
             c.research.sync = parse_sync_mode(sync);
             c.placement = parse_placement(placement);
             c.device = Device::parse(device);
             c.mask_dead_ranks = mask_dead_ranks;
             return std::make_unique<PyBuffer>(std::move(group), c);
           }),
           pb::arg("group"), pb::arg("max_tokens_per_rank"), pb::arg("hidden"), pb::arg("dtype"),
           pb::arg("num_experts"), pb::arg("max_topk"), pb::arg("algorithm"),
           pb::arg("num_workers"), pb::arg("enable_latency_layout"), pb::arg("sync"),
           pb::arg("placement"), pb::arg("fp8_pow2_scales") = false, pb::arg("device") = "cpu",
           pb::arg("mask_dead_ranks") = false)
      .def("dispatch", &PyBuffer::dispatch, pb::arg("x"), pb::arg("topk_idx"),
           pb::arg("topk_weights"), pb::arg("latency"), pb::arg("kind"), pb::arg("send_only"),
           pb::arg("x_scales") = pb::none(), pb::arg("x_dtype") = "")
      .def("dispatch_recv", &PyBuffer::dispatch_recv)
      .def("wait_recv_range", &PyBuffer::wait_recv_range)
      .def("combine", &PyBuffer::combine, pb::arg("x"), pb::arg("handle"), pb::arg("topk_weights"),
           pb::arg("kind"), pb::arg("send_only"), pb::arg("out") = pb::none())
      .def("combine_recv", &PyBuffer::combine_recv)
      .def("view", &PyBuffer::view)
      .def("last_stats", &PyBuffer::last_stats)
      .def("config", &PyBuffer::config)
      .def("time_calls", &PyBuffer::time_calls)
      .def("deep_ep_layout", &PyBuffer::deep_ep_layout)
      .def("deep_ep_dispatch", &PyBuffer::deep_ep_dispatch, pb::arg("x"), pb::arg("topk_idx"),
           pb::arg("topk"), pb::arg("x_dtype") = "", pb::arg("send_only") = false)
      .def("deep_ep_dispatch_recv", &PyBuffer::deep_ep_dispatch_recv)
      .def("deep_ep_normal_dispatch", &PyBuffer::deep_ep_normal_dispatch, pb::arg("counts"),
           pb::arg("x"), pb::arg("x_scales"), pb::arg("x_dtype"), pb::arg("topk_idx"),
           pb::arg("topk_weights"), pb::arg("is_token_in_rank"), pb::arg("num_tokens_per_rank"),
           pb::arg("num_tokens_per_expert"), pb::arg("expert_alignment"))
      .def("deep_ep_cached_dispatch", &PyBuffer::deep_ep_cached_dispatch, pb::arg("x"),
           pb::arg("x_scales"), pb::arg("x_dtype"), pb::arg("route"))
      .def("deep_ep_normal_combine", &PyBuffer::deep_ep_normal_combine, pb::arg("x"),
           pb::arg("handle"), pb::arg("weights"), pb::arg("route"), pb::arg("topk_weights"))
      .def("combine_into", &PyBuffer::combine_into, pb::arg("x"), pb::arg("handle"),
           pb::arg("topk_weights"), pb::arg("out"), pb::arg("send_only") = false)
      .def("combine_new", &PyBuffer::combine_new, pb::arg("x"), pb::arg("handle"),
           pb::arg("topk_weights"), pb::arg("send_only") = false)
      .def("owned_recv", &PyBuffer::owned_recv)
      .def(
          "combine_finish",
          [](PyBuffer& b) { without_gil([&] { return b.buffer().combine_recv(); }); },
          "Completes combine_into / combine_new with send_only=True (y is already theirs).")
      .def("expert_identity", &PyBuffer::expert_identity,
           "Benchmark helper: copies the last dispatch's received rows into the combine buffer.")
      .def("set_algorithm",
           [](PyBuffer& b, const std::string& a) { b.buffer().set_algorithm(parse_algorithm(a)); })
      .def_property_readonly(
          "algorithm", [](PyBuffer& b) { return algorithm_name(b.buffer().config().algorithm); })
      .def_property_readonly("num_local_experts",
                             [](PyBuffer& b) { return b.buffer().num_local_experts(); })
      .def_property_readonly("shared_bytes", [](PyBuffer& b) { return b.buffer().shared_bytes(); })
      .def_property_readonly("last_dispatch", &PyBuffer::last_handle,
                             "The id of the last dispatch on this window (~0: none yet).")
      .def_property_readonly("group", [](PyBuffer& b) { return b.group_object(); })
      // Elastic EP (docs/ELASTIC.md). mask/rejoin only publish a local change (the agreement
      // runs at the next dispatch), so they need no GIL release.
      .def(
          "mask", [](PyBuffer& b, int rank) { b.buffer().mask(rank); }, pb::arg("rank"))
      .def("masked_ranks", [](PyBuffer& b) { return b.buffer().masked_ranks(); })
      .def("rejoin", [](PyBuffer& b) { b.buffer().rejoin(); });
  m.def("deep_ep_dispatch_layout", &deep_ep_dispatch_layout, pb::arg("topk_idx"),
        pb::arg("num_experts"), pb::arg("num_ranks"));
}

}  // namespace ubep::python
