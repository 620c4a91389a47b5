// A peer that dies inside a shared-memory window's set-up (ShmGroup::allocate_window): the
// survivors name its death, whichever step found it. A survivor's death watch unlinks a dead
// rank's segment names before it publishes the death, so a slower survivor can find a name gone
// while it maps its peers' windows; when the set-up's closing allgather still completed (MPI's
// can: the victim had sent its part before it died), that survivor threw the shm_open error
// instead ("No such file or directory": CI of 75bb10e, mpi_kill_wait_setup_local, once in many
// runs). Here that interleaving happens every run: rank 2 posts its part of the closing allgather
// and dies, and rank 0 maps the windows only once rank 2's name is gone.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/fork_bootstrap.hpp"
#include "kill_run.hpp"  // shm_segments
#include "ubep/bootstrap.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep::bootstrap {
namespace {

using namespace std::chrono_literals;

constexpr int kRanks = 3;
constexpr int kVictim = 2;
constexpr int kSlow = 0;

// What a child saw, written into memory the parent shares.
enum class Seen { kNothing, kPeerFailed, kOtherError, kNoError };
struct Outcome {
  Seen seen = Seen::kNothing;
  char what[400] = {};
};

// Shared by the children: the staged allgather's posts, and their count of finished survivors.
struct Shared {
  std::atomic<int> posted{0};
  char slot[kRanks][64] = {};
  std::atomic<int> finished{0};
  Outcome outcomes[kRanks];
};

template <typename Pred>
bool wait_for(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (!pred() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  return pred();
}

// The fork bootstrap with the two allgathers of the window's set-up staged, once arm()ed: the
// exchange of segment names (each slot holds a name), after which the victim goes on and the
// slow rank waits for the victim's name to go; and the exchange of the mapping results, which
// completes with a part the victim posted before it died, as an MPI allgather can.
class StagedBootstrap final : public Bootstrap, public DeathAwareBootstrap {
 public:
  StagedBootstrap(ForkMeeting& meeting, Shared& shared, int rank)
      : inner_(meeting, rank, 5000ms), shared_(shared) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void barrier() override { inner_.barrier(); }
  void watch_deaths(const DeathCheck* deaths) override { inner_.watch_deaths(deaths); }
  void arm() { step_ = 1; }
  bool name_was_gone() const { return name_gone_; }

  void allgather(const void* in, void* out, size_t bytes) override {
    if (step_ == 2) {  // the mapping results
      step_ = 0;
      UBEP_CHECK(bytes <= sizeof shared_.slot[0], SystemError, "staged allgather of ", bytes);
      std::memcpy(shared_.slot[rank()], in, bytes);
      shared_.posted.fetch_add(1, std::memory_order_release);  // the slot before the count
      if (rank() == kVictim) raise(SIGKILL);
      if (!wait_for([&] { return shared_.posted.load(std::memory_order_acquire) == kRanks; }))
        throw SystemError("staged allgather: not every rank posted within 5 s");
      for (int r = 0; r < kRanks; ++r)
        std::memcpy(static_cast<char*>(out) + r * bytes, shared_.slot[r], bytes);
      return;
    }
    inner_.allgather(in, out, bytes);
    if (step_ != 1) return;
    step_ = 2;
    if (rank() != kSlow) return;
    const char* victim = static_cast<const char*>(out) + kVictim * bytes;
    const std::string path = "/dev/shm" + std::string(victim, strnlen(victim, bytes));
    name_gone_ = wait_for([&] { return access(path.c_str(), F_OK) != 0; });
  }

 private:
  ForkBootstrap inner_;
  Shared& shared_;
  int step_ = 0;
  bool name_gone_ = false;
};

void run_rank(ForkMeeting& meeting, Shared& shared, int rank) {
  Outcome* out = &shared.outcomes[rank];
  auto boot = std::make_shared<StagedBootstrap>(meeting, shared, rank);
  GroupOptions opts;
  opts.timeout = 5000ms;
  try {
    auto group = make_bootstrap_group(boot, opts);
    boot->arm();
    auto window = group->allocate_window(4096);
    out->seen = Seen::kNoError;
  } catch (const PeerFailedError& e) {
    out->seen = Seen::kPeerFailed;
    std::snprintf(out->what, sizeof out->what, "%s", e.what());
  } catch (const Error& e) {
    out->seen = Seen::kOtherError;
    std::snprintf(out->what, sizeof out->what, "%s", e.what());
  }
  if (rank == kSlow && !boot->name_was_gone())
    std::snprintf(out->what, sizeof out->what, "the victim's name was still there after 5 s");
  // No survivor leaves while the other still looks for the death (it would find this exit).
  shared.finished.fetch_add(1);
  wait_for([&] { return shared.finished.load() == kRanks - 1; });
}

TEST(WindowSetupDeath, ASurvivorThatFindsTheDeadPeersNameGoneNamesTheDeath) {
  ForkMeeting meeting(kRanks);
  void* mem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* shared = new (mem) Shared();
  const Outcome* outcomes = shared->outcomes;
  pid_t pids[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    pids[r] = fork();
    ASSERT_GE(pids[r], 0);
    if (pids[r] == 0) {
      run_rank(meeting, *shared, r);
      _exit(0);
    }
  }
  int status[kRanks];
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(waitpid(pids[r], &status[r], 0), pids[r]);
  ASSERT_TRUE(WIFSIGNALED(status[kVictim]) && WTERMSIG(status[kVictim]) == SIGKILL)
      << "the victim was to die in the set-up";
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0);
    EXPECT_EQ(outcomes[r].seen, Seen::kPeerFailed)
        << "expected PeerFailedError, got: " << outcomes[r].what;
    EXPECT_NE(std::strstr(outcomes[r].what, "rank 2"), nullptr) << outcomes[r].what;
  }
  // Nothing of the three ranks is left in /dev/shm (the survivors unlinked the victim's names).
  EXPECT_EQ(elastic::shm_segments({pids, pids + kRanks}), std::vector<std::string>{});
  munmap(mem, sizeof(Shared));
}

}  // namespace
}  // namespace ubep::bootstrap
