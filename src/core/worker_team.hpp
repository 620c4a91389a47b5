// A team of persistent worker threads that run the ubep role groups of one rank concurrently.
// In core, not in backend/cpu, because the CPU backend, the moe executor and the MPI baseline all
// run on it (the baseline gets the same threads ubep gets). The name stays cpu::WorkerTeam: it is
// the CPU's way of running roles (the CUDA backend runs them as warp groups).
//
// Protocol: run() publishes the job, then bumps `generation_` (release, under the mutex so a
// sleeping worker cannot miss the notify). A worker that observes a new generation (acquire)
// sees the job, runs its share, and increments `done_` (release). run() waits for done_ to
// reach the team size (acquire), so every worker's writes are visible to the caller when run()
// returns, and the job object outlives every use of it. Workers spin briefly before sleeping,
// because the next call usually follows within microseconds.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/wait.hpp"

namespace ubep::cpu {

class WorkerTeam {
 public:
  explicit WorkerTeam(int workers) : errors_(static_cast<size_t>(workers) + 1) {
    for (int i = 1; i <= workers; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~WorkerTeam() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  WorkerTeam(const WorkerTeam&) = delete;
  WorkerTeam& operator=(const WorkerTeam&) = delete;

  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Runs fn(i) for every member i in [0, size()); member 0 is the calling thread. fn is called
  // through a non-owning reference (no allocation per call).
  template <typename Fn>
  void run(Fn&& fn) {
    if (threads_.empty()) {
      fn(0);
      return;
    }
    job_obj_ = static_cast<void*>(&fn);
    job_ = [](void* obj, int i) { (*static_cast<std::remove_reference_t<Fn>*>(obj))(i); };
    done_.store(0, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    execute(0);
    const int others = size() - 1;
    // Workers finish in bounded time (their own waits time out), so this wait is bounded too.
    for (unsigned n = 0; done_.load(std::memory_order_acquire) < others; ++n) {
      if (n < 1024)
        UBEP_CPU_RELAX();
      else
        std::this_thread::yield();
    }
    job_ = nullptr;
    for (auto& e : errors_) {
      if (e) {
        auto first = e;
        for (auto& x : errors_) x = nullptr;
        std::rethrow_exception(first);
      }
    }
  }

 private:
  void execute(int i) {
    try {
      job_(job_obj_, i);
    } catch (...) {
      errors_[static_cast<size_t>(i)] = std::current_exception();
    }
  }

  void loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = generation_.load(std::memory_order_acquire);
      for (int spin = 0; g == seen && spin < 4096; ++spin) {
        if (spin < 256)
          UBEP_CPU_RELAX();
        else
          std::this_thread::yield();
        g = generation_.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        g = generation_.load(std::memory_order_acquire);
      }
      seen = g;
      if (stop_) return;
      execute(i);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  std::vector<std::thread> threads_;
  std::vector<std::exception_ptr> errors_;
  void (*job_)(void*, int) = nullptr;
  void* job_obj_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace ubep::cpu
