// The _ubep extension module: errors, groups, the Buffer. The user-facing API (DeepEP's names)
// is the pure-Python package around it (python/ubep/).
#include <pybind11/pybind11.h>

#include <chrono>

#include "arrays.hpp"
#include "buffer.hpp"
#include "interrupt.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace pb = pybind11;

namespace ubep::python {
void bind_bootstrap(pb::module_& m);  // bootstrap.cpp
void bind_mpi(pb::module_& m);        // mpi.cpp
void bind_baseline(pb::module_& m);   // baseline.cpp

namespace {

// Made once, leaked: they must outlive every translated exception.
PyObject* g_error = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_peer_failed = nullptr;

PyObject* new_exception(const char* name, PyObject* bases, const char* doc) {
  PyObject* e = PyErr_NewExceptionWithDoc(name, doc, bases, nullptr);
  if (!e) throw pb::error_already_set();
  return e;
}

void bind_errors(pb::module_& m) {
  g_error = new_exception("ubep.Error", PyExc_Exception,
                          "Base class of every error ubep reports (the C++ ubep::Error).");
  pb::tuple invalid_bases = pb::make_tuple(pb::handle(g_error), pb::handle(PyExc_ValueError));
  g_invalid = new_exception("ubep.InvalidArgument", invalid_bases.ptr(),
                            "A bad value (dtype, shape, device, expert id, capacity...). Nothing "
                            "was sent: the buffer stays usable.");
  pb::tuple timeout_bases = pb::make_tuple(pb::handle(g_error), pb::handle(PyExc_TimeoutError));
  g_timeout = new_exception("ubep.TimeoutError", timeout_bases.ptr(),
                            "A peer did not arrive within the group's timeout.");
  // Its own class so that elastic-EP callers can retry a call that met a group change (the
  // message names the agreement) without catching every ubep.Error.
  g_peer_failed = new_exception("ubep.PeerFailedError", g_error,
                                "A peer failed or the group changed (a rank masked or back) "
                                "during the call; with elastic EP the next dispatch agrees on "
                                "the new group.");
  m.attr("Error") = pb::handle(g_error);
  m.attr("PeerFailedError") = pb::handle(g_peer_failed);
  m.attr("InvalidArgument") = pb::handle(g_invalid);
  m.attr("TimeoutError") = pb::handle(g_timeout);
  pb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(g_invalid, e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(g_timeout, e.what());
    } catch (const PeerFailedError& e) {
      PyErr_SetString(g_peer_failed, e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });
}

void bind_groups(pb::module_& m) {
  pb::class_<Group>(m, "Group", "The ranks that exchange tokens (ubep::Group).")
      .def_property_readonly("rank", &Group::rank)
      .def_property_readonly("size", &Group::size)
      .def_property_readonly("kind", &Group::kind)
      .def_property_readonly("num_hosts", &Group::num_hosts)
      .def("host_of", &Group::host_of)
      .def_property_readonly("barrier_count", &Group::barrier_count)
      .def("barrier",
           [](Group& g) {
             without_gil([&] {
               g.barrier();
               return 0;
             });
           })
      .def("__repr__", [](const Group& g) {
        return std::string("<ubep.Group ") + g.kind() + " rank " + std::to_string(g.rank()) +
               " of " + std::to_string(g.size()) + ">";
      });

  pb::class_<ThreadWorld>(m, "ThreadWorld",
                          "Ranks as threads of this process: one Group per rank (run_on_threads).")
      .def(pb::init([](int ranks, double timeout_s, int ranks_per_host) {
             UBEP_CHECK_ARG(timeout_s > 0, "timeout must be > 0 seconds, got ", timeout_s);
             GroupOptions o;
             o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
             o.ranks_per_host = ranks_per_host;
             return std::make_unique<ThreadWorld>(ranks, o);
           }),
           pb::arg("ranks"), pb::arg("timeout") = 60.0, pb::arg("ranks_per_host") = 0)
      .def("group", &ThreadWorld::group, pb::arg("rank"));
}

}  // namespace
}  // namespace ubep::python

PYBIND11_MODULE(_ubep, m) {
  using namespace ubep::python;
  m.doc() = "ubep C++ extension: groups, Buffer, DLPack arrays (use the ubep package).";
  install_interrupt_hook();
  bind_errors(m);
  bind_arrays(m);
  bind_groups(m);
  bind_buffer(m);
  bind_bootstrap(m);
  bind_mpi(m);
  bind_baseline(m);
  m.def("_install_interrupt_hook", &install_interrupt_hook);
  m.def("_interrupt_pending", &interrupt_pending);
  m.def("_clear_interrupt", &clear_interrupt);
  m.def("_raise_interrupt_flag", &raise_interrupt_flag,
        "Test hook: behave as if SIGINT had arrived during a wait.");
}
