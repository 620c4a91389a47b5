#include "interrupt.hpp"

#include <signal.h>

#include <atomic>

#include "core/wait.hpp"

namespace ubep::python {

namespace {

std::atomic<bool> g_interrupted{false};
unsigned long g_main_thread = 0;
struct sigaction g_previous {};

void on_sigint(int sig, siginfo_t* info, void* ctx) {
  g_interrupted.store(true, std::memory_order_relaxed);  // async-signal-safe (lock-free)
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  }
}

bool hook() { return g_interrupted.load(std::memory_order_relaxed); }

}  // namespace

void install_interrupt_hook() {
  if (g_main_thread == 0)
    g_main_thread = pybind11::module_::import("threading")
                        .attr("main_thread")()
                        .attr("ident")
                        .cast<unsigned long>();
  wait_interrupt_hook.store(&hook);
  struct sigaction current {};
  if (sigaction(SIGINT, nullptr, &current) != 0) return;
  // Already in front; or put back in front of whatever signal.signal() installed since.
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigint) return;
  // Only in front of a real handler: SIG_DFL kills the process anyway, SIG_IGN means the
  // program chose to ignore Ctrl-C.
  const bool has_handler = (current.sa_flags & SA_SIGINFO)
                               ? current.sa_sigaction != nullptr
                               : (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
  if (!has_handler) return;
  g_previous = current;
  struct sigaction mine {};
  mine.sa_sigaction = on_sigint;
  mine.sa_flags = SA_SIGINFO | (current.sa_flags & SA_RESTART);
  sigemptyset(&mine.sa_mask);
  sigaction(SIGINT, &mine, nullptr);
}

bool in_main_thread() { return PyThread_get_thread_ident() == g_main_thread; }
bool interrupt_pending() { return g_interrupted.load(std::memory_order_relaxed); }
void clear_interrupt() { g_interrupted.store(false, std::memory_order_relaxed); }
void raise_interrupt_flag() { g_interrupted.store(true, std::memory_order_relaxed); }

}  // namespace ubep::python
