// Ranks as threads of one process. Memory is shared by construction; windows are plain
// anonymous mappings whose ownership is shared by every rank's window object, so a rank that
// finishes first can never unmap memory a slower peer still writes into.
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "bootstrap/flag_barrier.hpp"
#include "bootstrap/group_hooks.hpp"
#include "core/wait.hpp"
#include "transport/inproc/inproc_remote.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep {

namespace {

struct Mapping {
  void* addr = nullptr;
  size_t bytes = 0;
  explicit Mapping(size_t n) : bytes(std::max<size_t>(n, 1)) {
    addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (addr == MAP_FAILED) throw SystemError(detail::concat("mmap of ", n, " bytes failed"));
  }
  ~Mapping() { munmap(addr, bytes); }
};

class ThreadWindow : public SharedWindow {
 public:
  ThreadWindow(size_t bytes, int rank, std::vector<std::shared_ptr<Mapping>> regions)
      : regions_(std::move(regions)) {
    bytes_ = bytes;
    for (auto& r : regions_) bases_.push_back(r->addr);
    local_ = bases_[static_cast<size_t>(rank)];
  }

 private:
  std::vector<std::shared_ptr<Mapping>> regions_;
};

}  // namespace

struct ThreadWorld::State {
  int size;
  GroupOptions options;
  std::unique_ptr<bootstrap::ArrivalCounter[]> counters;
  // Rendezvous slots: rank r publishes a pointer in slot r, then all ranks meet at a barrier.
  std::vector<const void*> slots;
  std::vector<bool> taken;
  std::mutex mu;
  int ranks_per_host = 0;
  std::shared_ptr<transport::Mailboxes> mailboxes = std::make_shared<transport::Mailboxes>();
};

namespace {

class ThreadGroup : public Group, private bootstrap::GroupHooks {
 public:
  ThreadGroup(int rank, std::shared_ptr<ThreadWorld::State> state)
      : Group(rank, state->size, state->options),
        state_(std::move(state)),
        barrier_(rank, state_->size, [s = state_.get()](int p) { return &s->counters[p]; }) {
    set_hooks(this);
    if (state_->ranks_per_host > 0) {
      std::vector<int> hosts(static_cast<size_t>(size()));
      for (int r = 0; r < size(); ++r) hosts[static_cast<size_t>(r)] = r / state_->ranks_per_host;
      set_hosts(std::move(hosts));
      if (num_hosts() > 1)
        remote_ = std::make_unique<transport::InprocRemote>(rank, state_->mailboxes);
    }
  }

  transport::Remote* remote() override { return remote_.get(); }

  std::unique_ptr<SharedWindow> allocate_window(size_t bytes) override {
    auto mine = std::make_shared<Mapping>(bytes);
    std::vector<std::shared_ptr<Mapping>> all(static_cast<size_t>(size()));
    publish_and_meet(&mine);
    for (int p = 0; p < size(); ++p)
      all[static_cast<size_t>(p)] = *static_cast<const std::shared_ptr<Mapping>*>(slot(p));
    sync();  // nobody may leave (and destroy `mine`) before every rank copied it
    return std::make_unique<ThreadWindow>(bytes, rank(), std::move(all));
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    publish_and_meet(in);
    for (int p = 0; p < size(); ++p)
      std::memcpy(static_cast<char*>(out) + static_cast<size_t>(p) * bytes, slot(p), bytes);
    sync();
  }

  const char* kind() const override { return "threads"; }

 protected:
  void barrier_impl() override { sync(); }

 private:
  const void* slot(int p) const { return state_->slots[static_cast<size_t>(p)]; }
  void publish_and_meet(const void* p) {
    // The slot write happens-before peers' reads: release/acquire through the barrier counters.
    state_->slots[static_cast<size_t>(rank())] = p;
    sync();
  }
  void sync() { barrier_.arrive_and_wait(WaitPolicy{options().timeout}); }

  std::shared_ptr<ThreadWorld::State> state_;
  bootstrap::FlagBarrier barrier_;
  std::unique_ptr<transport::InprocRemote> remote_;
};

}  // namespace

ThreadWorld::ThreadWorld(int ranks, GroupOptions options) : state_(std::make_shared<State>()) {
  UBEP_CHECK_ARG(ranks >= 1, "number of thread ranks must be >= 1, got ", ranks);
  state_->size = ranks;
  state_->options = options;
  state_->counters.reset(new bootstrap::ArrivalCounter[static_cast<size_t>(ranks)]);
  state_->slots.assign(static_cast<size_t>(ranks), nullptr);
  state_->taken.assign(static_cast<size_t>(ranks), false);
  UBEP_CHECK_ARG(options.ranks_per_host >= 0, "ranks_per_host must be >= 0, got ",
                 options.ranks_per_host);
  state_->ranks_per_host = options.ranks_per_host;
}

ThreadWorld::~ThreadWorld() = default;

std::unique_ptr<Group> ThreadWorld::group(int rank) {
  std::lock_guard<std::mutex> lock(state_->mu);
  UBEP_CHECK_ARG(rank >= 0 && rank < state_->size, "rank ", rank, " out of range [0, ",
                 state_->size, ")");
  UBEP_CHECK_ARG(!state_->taken[static_cast<size_t>(rank)], "rank ", rank, " already taken");
  state_->taken[static_cast<size_t>(rank)] = true;
  return std::make_unique<ThreadGroup>(rank, state_);
}

void run_on_threads(int ranks, const std::function<void(Group&)>& fn, GroupOptions options) {
  ThreadWorld world(ranks, options);
  std::vector<std::unique_ptr<Group>> groups;
  for (int r = 0; r < ranks; ++r) groups.push_back(world.group(r));
  // The error to report is the cause, not its echo: a rank that rejects its input makes its
  // peers time out later, so prefer the earliest error that is not a TimeoutError.
  struct Failure {
    std::exception_ptr error;
    std::chrono::steady_clock::time_point when;
    bool timeout = false;
  };
  std::vector<Failure> failures(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*groups[static_cast<size_t>(r)]);
      } catch (const TimeoutError&) {
        failures[static_cast<size_t>(r)] = {std::current_exception(),
                                            std::chrono::steady_clock::now(), true};
      } catch (...) {
        failures[static_cast<size_t>(r)] = {std::current_exception(),
                                            std::chrono::steady_clock::now(), false};
      }
    });
  }
  for (auto& t : threads) t.join();
  const Failure* cause = nullptr;
  for (const Failure& f : failures) {
    if (!f.error) continue;
    if (!cause || (cause->timeout && !f.timeout) ||
        (cause->timeout == f.timeout && f.when < cause->when))
      cause = &f;
  }
  if (cause) std::rethrow_exception(cause->error);
}

}  // namespace ubep
