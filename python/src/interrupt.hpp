// Ctrl-C during a wait. While a call is in C++ (GIL released) Python's SIGINT handler only sets a
// flag that the interpreter checks between bytecodes, which never come while a rank waits for a
// peer. So at import the module chains its own C handler in front of Python's: it records the
// signal in an atomic and calls Python's handler as before. ubep's bounded wait polls the atomic
// (wait_interrupt_hook in core/wait.hpp) in its yielding phase and gives up with an Error; the
// binding turns that into KeyboardInterrupt (or whatever the Python handler raises).
#pragma once

namespace ubep::python {

// Installs the chained handler (when SIGINT has a C handler, i.e. Python's) and the wait hook.
// Called at import and again when a Buffer is made, so a handler set with signal.signal() in
// between gets chained too. Idempotent.
void install_interrupt_hook();
bool interrupt_pending();
void clear_interrupt();
// Test hook: marks an interrupt as if SIGINT had arrived.
void raise_interrupt_flag();

}  // namespace ubep::python
