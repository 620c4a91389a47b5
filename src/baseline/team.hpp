// The MPI baseline's helper threads (src/baseline only).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "ubep/group.hpp"

namespace ubep::baseline {

// Persistent helper threads for the baseline's pack, unpack and reduce loops, so that with
// workers > 0 the baseline gets the cores ubep's roles get (a fair comparison). The caller is
// member 0. for_range publishes a job under the mutex (a sleeping helper cannot miss it), each
// member runs one contiguous chunk, and the caller waits for every helper's `done_` increment
// (release/acquire: their writes are visible when for_range returns). The loops it runs do not
// throw (copies and arithmetic on validated indices).
class Team {
 public:
  explicit Team(int workers) {
    for (int i = 1; i <= workers; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~Team() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // fn(member, begin, end) over [0, n), cut into size() contiguous chunks.
  template <typename F>
  void for_range(int64_t n, F&& fn) {
    if (threads_.empty() || n < 2) {
      fn(0, int64_t{0}, n);
      return;
    }
    auto chunk = [&fn, n, m = size()](int i) { fn(i, n * i / m, n * (i + 1) / m); };
    obj_ = &chunk;
    call_ = [](void* o, int i) { (*static_cast<decltype(chunk)*>(o))(i); };
    done_.store(0, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++gen_;
    }
    cv_.notify_all();
    chunk(0);
    const int others = size() - 1;
    for (unsigned k = 0; done_.load(std::memory_order_acquire) < others; ++k)
      if (k > 1024) std::this_thread::yield();
  }

 private:
  void loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return gen_ != seen; });
        seen = gen_;
        if (stop_) return;
      }
      call_(obj_, i);
      done_.fetch_add(1, std::memory_order_release);
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t gen_ = 0;
  bool stop_ = false;
  void* obj_ = nullptr;
  void (*call_)(void*, int) = nullptr;
  std::atomic<int> done_{0};
};

// Worker threads as ubep::Buffer sizes them: -1 = cores per rank on this host, minus the caller.
inline int resolve_workers(const Group& g, int n) {
  if (n >= 0) return n;
  int local = 0;
  for (int r = 0; r < g.size(); ++r) local += g.same_host(r, g.rank());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(0, cores / std::max(1, local) - 1);
}

}  // namespace ubep::baseline
