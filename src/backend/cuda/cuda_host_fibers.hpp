// Simulated GPU threads as fibers: every thread of one launch runs on the thread that launched it,
// switched in turn at each wait (a warp's or block's barrier, a spin on a flag). See
// cuda_host_sim.hpp, which uses this unless a sanitizer build asks for OS threads.
//
// Why: one OS thread per simulated thread meant thousands of threads on two cores that met at
// warp barriers (two per shuffle or ballot) through futexes and sched_yield; those syscalls took
// 75% of the CUDA simulation's time, and the simulation half of the release suite's CPU time.
// A fiber switch is a function call: six registers and the stack pointer on x86-64 (ucontext's
// swapcontext elsewhere, which also makes a signal-mask syscall).
//
// Why it is correct: fibers of one launch never run at the same time (one OS thread), so what
// they share needs no atomics, and a fiber runs until it waits, so a wait's check and its yield
// are atomic with respect to the other fibers. Fibers of different launches (ranks' launches
// running concurrently on their own threads) share only the flags and data of the kernels, which
// use the same atomics as on the GPU. A fiber spinning on another launch's flag yields at every
// try, so the other fibers of its launch keep running; when a whole round of fibers made no
// progress (only failed flag checks), the OS thread yields, so the other launches get the core.
// The waits keep their deadlines (clock64 is the wall clock), so a flag never set still ends in
// the kernels' own timeout error.
#pragma once

#include <ucontext.h>

#include <cstdint>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores the stack pointer in *save_sp,
// and resumes the stack at next_sp the same way (System V x86-64 ABI: rbx, rbp, r12-r15 are
// callee-saved; the caller saved the rest). Weak: each translation unit that includes this file
// emits it, and the linker keeps one.
extern "C" void ubep_sim_fiber_switch(void** save_sp, void* next_sp);
asm(R"(
  .text
  .weak ubep_sim_fiber_switch
  .type ubep_sim_fiber_switch, @function
ubep_sim_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ubep_sim_fiber_switch, .-ubep_sim_fiber_switch
)");
#define UBEP_SIM_FIBER_ASM 1
#else
#define UBEP_SIM_FIBER_ASM 0
#endif

namespace ubep::sim::fibers {

class Scheduler {
 public:
  // Runs every body to its end on the calling thread. `resume(i)` runs each time fiber i is
  // switched in (it restores that simulated thread's thread-local identity).
  static void run(std::vector<std::function<void()>> bodies, std::function<void(size_t)> resume,
                  size_t stack_bytes = 256 * 1024) {
    Scheduler s(std::move(bodies), std::move(resume), stack_bytes);
    s.loop();
  }
  // From a fiber: lets the launch's other fibers run; returns when this one's turn comes again.
  // Outside a fiber (a host thread): yields the OS thread.
  static void yield() {
    Scheduler* s = current();
    if (s == nullptr) {
      std::this_thread::yield();
      return;
    }
    s->switch_to_main(s->fibers_[s->running_]);
  }
  // A fiber made progress another may wait for (a barrier opened): the round does not end in an
  // OS-level yield.
  static void note_progress() {
    if (Scheduler* s = current()) s->progress_ = true;
  }

 private:
  struct Fiber {
#if UBEP_SIM_FIBER_ASM
    void* sp = nullptr;
#else
    ucontext_t context{};
#endif
    std::unique_ptr<char[]> stack;
    std::function<void()> body;
    bool done = false;
  };

  static Scheduler*& current() {
    static thread_local Scheduler* s = nullptr;
    return s;
  }

  Scheduler(std::vector<std::function<void()>> bodies, std::function<void(size_t)> resume,
            size_t stack_bytes)
      : resume_(std::move(resume)) {
    fibers_.resize(bodies.size());
    for (size_t i = 0; i < bodies.size(); ++i) {
      Fiber& f = fibers_[i];
      f.body = std::move(bodies[i]);
      f.stack.reset(new char[stack_bytes]);  // not zeroed: pages are touched only as used
      prepare(f, stack_bytes);
    }
  }

#if UBEP_SIM_FIBER_ASM
  // A new fiber's stack as ubep_sim_fiber_switch leaves one: six saved registers, then the
  // address it returns to (trampoline), at the alignment a call gives (rsp = 8 mod 16 on entry).
  static void prepare(Fiber& f, size_t stack_bytes) {
    auto top = reinterpret_cast<uintptr_t>(f.stack.get() + stack_bytes) & ~uintptr_t{15};
    auto* sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;  // trampoline's own "return address": it never returns
    *--sp = reinterpret_cast<void*>(&Scheduler::trampoline);
    for (int r = 0; r < 6; ++r) *--sp = nullptr;
    f.sp = sp;
  }
  void switch_to_fiber(Fiber& f) { ubep_sim_fiber_switch(&main_sp_, f.sp); }
  void switch_to_main(Fiber& f) { ubep_sim_fiber_switch(&f.sp, main_sp_); }
#else
  void prepare(Fiber& f, size_t stack_bytes) {
    if (getcontext(&f.context) != 0) fail("getcontext");
    f.context.uc_stack.ss_sp = f.stack.get();
    f.context.uc_stack.ss_size = stack_bytes;
    f.context.uc_link = nullptr;  // trampoline never returns
    makecontext(&f.context, &Scheduler::trampoline, 0);
  }
  void switch_to_fiber(Fiber& f) {
    if (swapcontext(&main_, &f.context) != 0) fail("swapcontext");
  }
  void switch_to_main(Fiber& f) { swapcontext(&f.context, &main_); }
#endif

  static void trampoline() noexcept {
    Scheduler* s = current();
    Fiber& f = s->fibers_[s->running_];
    f.body();  // kernels do not throw; an escaping exception ends the process (noexcept path)
    f.done = true;
    s->switch_to_main(f);  // never resumed: the scheduler frees this stack
    fail("a finished fiber resumed");
  }

  void loop() {
    Scheduler* const outer = current();
    current() = this;
    size_t live = fibers_.size();
    while (live > 0) {
      progress_ = false;
      for (size_t i = 0; i < fibers_.size(); ++i) {
        if (fibers_[i].done) continue;
        running_ = i;
        resume_(i);
        switch_to_fiber(fibers_[i]);
        if (fibers_[i].done) {
          --live;
          progress_ = true;
          fibers_[i].stack.reset();
        }
      }
      if (!progress_) std::this_thread::yield();  // all waiting on other launches' flags
    }
    current() = outer;
  }

  [[noreturn]] static void fail(const char* what) {
    std::fprintf(stderr, "cuda_host_sim: %s failed\n", what);
    std::abort();
  }

  std::vector<Fiber> fibers_;
  std::function<void(size_t)> resume_;
#if UBEP_SIM_FIBER_ASM
  void* main_sp_ = nullptr;
#else
  ucontext_t main_{};
#endif
  size_t running_ = 0;
  bool progress_ = false;
};

}  // namespace ubep::sim::fibers
