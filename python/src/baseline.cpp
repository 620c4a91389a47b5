// The C++ AlltoallBaseline (include/ubep/baseline.hpp) for ubep.bench: the pack -> count
// exchange -> MPI_Alltoallv -> unpack path users write without ubep ("mpi" on a group from
// make_mpi_group, the in-process exchange "a2a" on thread ranks), timed in a C++ loop like
// PyBuffer::time_calls so it gets no Python overhead ubep's Python rows pay: a conservative
// baseline. The last combine's y is kept so the bench can check ubep's results against it.
// exchange="oneccl" (a build with -DUBEP_ONECCL_ROOT, cmake/oneccl.cmake) runs the same pack,
// unpack and reduce over oneCCL's alltoallv instead, on any group (its communicator is made
// through the group's set-up exchange), so the oneccl-vs-mpi rows differ only in the transport.
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "buffer.hpp"
#include "interrupt.hpp"
#include "ubep/baseline.hpp"
#include "ubep/error.hpp"
#ifdef UBEP_HAVE_ONECCL
#include "bench/oneccl_exchange.hpp"
#endif

namespace pb = pybind11;

namespace ubep::python {

namespace {

class PyBaseline {
 public:
  // Same group and config as `buffer` (a _ubep.Buffer), which it keeps alive. Collective.
  // exchange: "default" (the group's own: MPI_Alltoallv, or the thread-rank exchange) or "oneccl".
  PyBaseline(pb::object buffer, const std::string& exchange) : buffer_(std::move(buffer)) {
    Buffer& buf = buffer_.cast<PyBuffer&>().buffer();
    UBEP_CHECK_ARG(buf.config().device.type == DeviceType::kCpu,
                   "Baseline: the all-to-all baseline runs on host memory (device cpu), not on ",
                   buf.config().device.describe());
    UBEP_CHECK_ARG(exchange == "default" || exchange == "oneccl", "Baseline: exchange '", exchange,
                   "' (expected 'default' or 'oneccl')");
    if (exchange == "default") {
      base_ = without_gil(
          [&] { return std::make_unique<AlltoallBaseline>(buf.group(), buf.config()); });
      return;
    }
#ifdef UBEP_HAVE_ONECCL
    base_ = without_gil([&] {
      return std::make_unique<AlltoallBaseline>(buf.group(), buf.config(),
                                                tools::make_oneccl_exchange(buf.group()));
    });
#else
    UBEP_CHECK_ARG(false, "Baseline: exchange 'oneccl' needs an extension built with oneCCL ",
                   "(cmake -DUBEP_ONECCL_ROOT=<prefix of oneccl-cpu-devel>, e.g. the venv of ",
                   "scripts/venv.sh --oneccl); this _ubep was built without it");
#endif
  }

  std::string name() const { return base_->name(); }

  // Per iteration (dispatch µs, combine µs); the combine's input is the received rows as they
  // are (the identity expert, as ubep-bench runs the baseline). barrier: an untimed group
  // barrier before each timed call, as PyBuffer::time_calls.
  pb::list time_calls(pb::handle x, pb::handle topk_idx, pb::handle topk_weights, bool latency,
                      int iters, int warmup, bool barrier) {
    UBEP_CHECK_ARG(iters >= 0 && warmup >= 0, "Baseline.time_calls: iters ", iters, " and warmup ",
                   warmup, " must be >= 0");
    Buffer& buf = buffer_.cast<PyBuffer&>().buffer();
    const Device& dev = buf.config().device;
    Borrowed bx = borrow(x, "Baseline: x", buf.config().dtype, dev);
    Borrowed bi = borrow(topk_idx, "Baseline: topk_idx", DType::kInt64, dev);
    Borrowed bw = borrow(topk_weights, "Baseline: topk_weights", DType::kFP32, dev);
    DispatchArgs a{bx.view, bi.view, bw.view, latency ? Layout::kLatency : Layout::kThroughput};
    return time_pairs(
        buf.group(), iters, warmup, barrier, [&] { return base_->dispatch(a); },
        [](const DispatchResult&) {},  // the identity expert: combine takes recv_x as it is
        [&](const DispatchResult& r) {
          TensorView y = base_->combine({r.recv_x, r.handle});
          last_y_.assign(static_cast<const char*>(y.data),
                         static_cast<const char*>(y.data) + y.bytes());
        });
  }

  // The raw bytes of the last combine's y (bf16 bits or fp32), rows of `hidden`.
  pb::bytes last_y() const { return pb::bytes(last_y_.data(), last_y_.size()); }

 private:
  pb::object buffer_;
  std::unique_ptr<AlltoallBaseline> base_;
  std::vector<char> last_y_;
};

}  // namespace

void bind_baseline(pb::module_& m) {
  pb::class_<PyBaseline>(m, "Baseline",
                         "ubep::AlltoallBaseline on a Buffer's group and config (benchmarks).")
      .def(pb::init<pb::object, std::string>(), pb::arg("buffer"), pb::arg("exchange") = "default")
      .def_property_readonly("name", &PyBaseline::name)
      .def("time_calls", &PyBaseline::time_calls, pb::arg("x"), pb::arg("topk_idx"),
           pb::arg("topk_weights"), pb::arg("latency"), pb::arg("iters"), pb::arg("warmup"),
           pb::arg("barrier"))
      .def("last_y", &PyBaseline::last_y);
#ifdef UBEP_HAVE_ONECCL
  m.attr("has_oneccl") = true;
#else
  m.attr("has_oneccl") = false;
#endif
}

}  // namespace ubep::python
