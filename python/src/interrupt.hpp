// Ctrl-C during a wait. While a call is in C++ (GIL released) Python's SIGINT handler only sets a
// flag that the interpreter checks between bytecodes, which never come while a rank waits for a
// peer. So at import the module chains its own C handler in front of Python's: it records the
// signal in an atomic and calls Python's handler as before. ubep's bounded wait polls the atomic
// (wait_interrupt_hook in core/wait.hpp) in its yielding phase and gives up with an Error; the
// binding turns that into KeyboardInterrupt (or whatever the Python handler raises).
#pragma once

#include <pybind11/pybind11.h>

#include "ubep/error.hpp"

namespace ubep::python {

// Installs the chained handler (when SIGINT has a C handler, i.e. Python's) and the wait hook.
// Called at import and again when a Buffer is made, so a handler set with signal.signal() in
// between gets chained too. Idempotent.
void install_interrupt_hook();
bool interrupt_pending();
void clear_interrupt();
// Test hook: marks an interrupt as if SIGINT had arrived.
void raise_interrupt_flag();
// Whether the calling thread is Python's main thread (where its signal handlers run), whichever
// thread imported the module. Set by install_interrupt_hook's first call (with the GIL held).
bool in_main_thread();

// Runs a C++ call without the GIL. If a Ctrl-C ended one of its waits, the Python handler runs
// here (in the main thread: KeyboardInterrupt); elsewhere the Error says it was interrupted.
template <typename F>
auto without_gil(F&& f) {
  const bool main = in_main_thread();
  // A stale flag (Ctrl-C handled by Python outside any wait) must not end this call's waits.
  // Only the main thread clears: thread ranks may be waiting on it from other threads.
  if (main) clear_interrupt();
  try {
    pybind11::gil_scoped_release nogil;
    return f();
  } catch (const Error&) {
    if (!interrupt_pending()) throw;
    if (main) {
      clear_interrupt();
      if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
    }
    throw;
  }
}

}  // namespace ubep::python
