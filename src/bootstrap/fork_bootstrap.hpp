// A Bootstrap for processes forked from one parent (the elastic tests and tools/elastic): the
// parent maps a small shared region before fork, and the children meet in it. No launcher, so
// a test can SIGKILL a child and keep the others running (mpirun would end the whole job).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>

#include "bootstrap/death_check.hpp"
#include "core/wait.hpp"
#include "ubep/bootstrap.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {

// The region the children share: a sense-reversing barrier and one allgather slot per rank.
class ForkMeeting {
 public:
  static constexpr size_t kSlotBytes = 256;
  explicit ForkMeeting(int ranks) : ranks_(ranks) {
    bytes_ = sizeof(State) + static_cast<size_t>(ranks) * kSlotBytes;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw SystemError("ForkMeeting: mmap failed");
    state_ = new (p) State();
  }
  ~ForkMeeting() { munmap(state_, bytes_); }
  ForkMeeting(const ForkMeeting&) = delete;
  ForkMeeting& operator=(const ForkMeeting&) = delete;

  int ranks() const { return ranks_; }
  // Arrive and wait for every rank. The last to arrive resets the count, then bumps the
  // generation (release); the others wait for the generation to change (acquire), so the reset
  // is visible before anyone can arrive at the next barrier.
  void barrier(std::chrono::milliseconds timeout, const DeathCheck* deaths = nullptr) {
    const uint32_t gen = state_->generation.load(std::memory_order_acquire);
    if (state_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == ranks_) {
      state_->arrived.store(0, std::memory_order_relaxed);
      state_->generation.fetch_add(1, std::memory_order_release);
      return;
    }
    WaitPolicy policy;
    policy.timeout = timeout;
    auto what = [] { return std::string("the forked ranks' set-up barrier"); };
    DeathAbort abort(deaths, -1, what);
    wait_until([&] { return state_->generation.load(std::memory_order_acquire) != gen; },
               abort.applied_to(policy), what);
  }
  char* slot(int r) {
    return reinterpret_cast<char*>(state_ + 1) + static_cast<size_t>(r) * kSlotBytes;
  }

 private:
  struct State {
    std::atomic<int> arrived{0};
    std::atomic<uint32_t> generation{0};
  };
  State* state_ = nullptr;
  size_t bytes_ = 0;
  int ranks_;
};

class ForkBootstrap final : public Bootstrap, public DeathAwareBootstrap {
 public:
  ForkBootstrap(ForkMeeting& meeting, int rank, std::chrono::milliseconds timeout)
      : meeting_(meeting), rank_(rank), timeout_(timeout) {}
  int rank() const override { return rank_; }
  int size() const override { return meeting_.ranks(); }
  // Barrier-separated: write my slot, wait, read all, wait (so no slot is rewritten while read).
  void allgather(const void* in, void* out, size_t bytes) override {
    auto* dst = static_cast<char*>(out);
    for (size_t done = 0; done < bytes || done == 0; done += ForkMeeting::kSlotBytes) {
      const size_t n = std::min(ForkMeeting::kSlotBytes, bytes - done);
      std::memcpy(meeting_.slot(rank_), static_cast<const char*>(in) + done, n);
      barrier();
      for (int r = 0; r < size(); ++r)
        std::memcpy(dst + static_cast<size_t>(r) * bytes + done, meeting_.slot(r), n);
      barrier();
      if (bytes == 0) break;
    }
  }
  void barrier() override { meeting_.barrier(timeout_, deaths_); }
  void watch_deaths(const DeathCheck* deaths) override { deaths_ = deaths; }

 private:
  const DeathCheck* deaths_ = nullptr;
  ForkMeeting& meeting_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

}  // namespace ubep::bootstrap
