// Ranks as processes on one host. The bootstrap is used at set-up only (to exchange segment
// names); ranks map each other's POSIX shared-memory segments and from then on write into them
// directly.
#include "bootstrap/shm_group.hpp"
#include "bootstrap/host_liveness.hpp"
#include "bootstrap/shm_window.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "core/log.hpp"
#include "core/wait.hpp"
#include "ubep/error.hpp"

namespace ubep::bootstrap {

std::vector<int> resolve_hosts(Bootstrap& bootstrap, const GroupOptions& options) {
  UBEP_CHECK_ARG(options.ranks_per_host >= 0, "ranks_per_host must be >= 0, got ",
                 options.ranks_per_host);
  if (options.ranks_per_host == 0) return bootstrap.host_map();
  std::vector<int> hosts(static_cast<size_t>(bootstrap.size()));
  for (int r = 0; r < bootstrap.size(); ++r)
    hosts[static_cast<size_t>(r)] = r / options.ranks_per_host;
  return hosts;
}

ShmGroup::ShmGroup(std::shared_ptr<Bootstrap> bootstrap, GroupOptions options,
                   std::vector<int> host_of, std::unique_ptr<transport::Remote> remote, bool beat)
    : Group(bootstrap->rank(), bootstrap->size(), options),
      bootstrap_(std::move(bootstrap)),
      host_vec_(host_of),
      remote_(std::move(remote)) {
  set_hooks(this);
  set_hosts(std::move(host_of));
  UBEP_CHECK_ARG(single_host() || remote_, "the group spans ", num_hosts(),
                 " hosts but has no transport between them (use make_mpi_group)");
  // Every rank's pid, so each process can watch its host-mates' (DeathWatch).
  const pid_t me = getpid();
  std::vector<pid_t> pids(static_cast<size_t>(size()));
  bootstrap_->allgather(&me, pids.data(), sizeof me);
  for (int r = 0; r < size(); ++r)
    if (r == rank() || !same_host(r, rank())) pids[static_cast<size_t>(r)] = 0;
  // A host-mate that dies inside a window's set-up leaves its segment named: its death unlinks
  // it, on the watch thread before the death is published (a survivor that names the death and
  // exits at once must not leave it behind), unless an elastic replacement will want the names.
  std::function<void(pid_t)> unlink_left;
  if (options.elastic_name.empty()) unlink_left = [](pid_t pid) { unlink_segments_of(pid); };
  deaths_ = std::make_unique<DeathWatch>(pids, std::move(unlink_left));
  if (remote_ && deaths_->active())
    notices_ = std::make_unique<DeathNotices>(*remote_, *deaths_, rank(), host_vec_);
  // A host with nobody left to send notices: named by its silence (collective when spanning).
  if (beat)
    heartbeat_ = start_host_liveness(*bootstrap_, rank(), host_vec_, *deaths_, &beat_addrs_);
  // From here every wait of the group watches the deaths (the exchange of pids above could not:
  // nobody's pid was known yet, so a death there is named at the timeout).
  death_check_ = std::make_unique<DeathCheck>(*deaths_, notices_.get(), rank());
  if (auto* aware = dynamic_cast<DeathAwareBootstrap*>(bootstrap_.get()))
    aware->watch_deaths(death_check_.get());
  if (!options.elastic_name.empty()) {
    UBEP_CHECK_ARG(single_host(), "elastic_name: elastic groups live on one host, this one spans ",
                   num_hosts());
    if (rank() == 0) rendezvous_ = Rendezvous::create(options.elastic_name, size());
    bootstrap_->barrier();
    if (rank() != 0) rendezvous_ = Rendezvous::open(options.elastic_name);
    rendezvous_->claim(rank(), false);
  }
  control_ = allocate_window(sizeof(ArrivalCounter));
  barrier_ = std::make_unique<FlagBarrier>(
      rank(), size(), [this](int p) { return static_cast<ArrivalCounter*>(control_->base(p)); },
      death_check_.get());
  log::debug("rank ", rank(), "/", size(), " on host ", Group::host_of(rank()), " of ",
             num_hosts());
}

ShmGroup::~ShmGroup() {
  // The bootstrap may outlive the group: its waits stop asking this group's watch.
  if (auto* aware = dynamic_cast<DeathAwareBootstrap*>(bootstrap_.get()))
    aware->watch_deaths(nullptr);
  heartbeat_.reset();  // its thread notes deaths into deaths_: gone first
  notices_.reset();    // its receives are withdrawn while the transport still exists
  if (rendezvous_) {
    // A rank that died and was never replaced cannot unlink its segments' names (a replacement
    // unlinks its predecessor's): do it here, when no replacement can come any more. Not on the
    // death itself: a replacement may be publishing its own names under that rank by then.
    for (int r = 0; r < size(); ++r)
      if (r != rank() && deaths_->dead(r) && rendezvous_->pid(r) == deaths_->pid_of(r))
        for (int w = 0; w < windows_; ++w)
          if (rendezvous_->window_incarnation(w, r) != 0)
            shm_unlink(rendezvous_->window_name(w, r).c_str());
    rendezvous_->unlink();
  }
}

std::unique_ptr<SharedWindow> ShmGroup::allocate_window(size_t bytes) {
  Bootstrap& boot = control_ ? window_bootstrap() : *bootstrap_;  // the constructor's: its own
  try {
    return std::make_unique<ShmWindow>(bytes, rank(), size(), host_vec_, boot, rendezvous_.get(),
                                       windows_++, 0);
  } catch (const SystemError& e) {
    // A peer's segment this rank could not map is most often a dead peer's: a survivor's death
    // watch unlinks a dead rank's names before it publishes the death, so a slower rank can find
    // the name gone before its own watch has seen the death (CI of 75bb10e,
    // mpi_kill_wait_setup_local: "shm_open(/ubep-...): No such file or directory" instead of
    // "rank 2 died (signal 9)"). Name the death once this rank's watch has it (it sees a death
    // within milliseconds); otherwise the window's own error stands.
    if (death_check_) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      do {
        death_check_->check(-1, [&] {
          return detail::concat("its peers' shared-memory windows (", e.what(), ")");
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } while (std::chrono::steady_clock::now() < until);
    }
    throw;
  }
}

void ShmGroup::peer_replaced(int rank) {
  if (rendezvous_) deaths_->rewatch(rank, rendezvous_->pid(rank));
}

// ---- the replacement's side -------------------------------------------------------------------

RejoinGroup::RejoinGroup(std::unique_ptr<Rendezvous> rdv, int rank, GroupOptions options)
    : Group(rank, rdv->ranks(), options), rdv_(std::move(rdv)) {
  set_hooks(this);
  host_vec_.assign(static_cast<size_t>(size()), 0);  // elastic groups live on one host
  set_hosts(host_vec_);
  // The predecessor's segments are of no use (this process makes new ones) and, dead, it cannot
  // unlink them: do it here, before publishing ours (the live ranks' death watch may have).
  for (int w = 0; w < Rendezvous::kMaxWindows; ++w)
    if (rdv_->window_incarnation(w, rank) != 0) shm_unlink(rdv_->window_name(w, rank).c_str());
  incarnation_ = rdv_->claim(rank, true);
  std::vector<pid_t> pids(static_cast<size_t>(size()), 0);
  for (int r = 0; r < size(); ++r)
    if (r != rank) pids[static_cast<size_t>(r)] = rdv_->pid(r);
  deaths_ = std::make_unique<DeathWatch>(pids);
  control_ = allocate_window(sizeof(ArrivalCounter));
  log::info("rank ", rank, ": rejoined as incarnation ", incarnation_);
}

RejoinGroup::~RejoinGroup() = default;

std::unique_ptr<SharedWindow> RejoinGroup::allocate_window(size_t bytes) {
  return std::make_unique<ShmWindow>(bytes, rank(), size(), host_vec_, *rdv_, windows_++,
                                     incarnation_);
}

void RejoinGroup::allgather(const void*, void*, size_t) {
  throw InvalidArgument(
      "a rejoined rank makes no collective set-up calls (allgather): its "
      "peers are in their calls; create Buffers only");
}

void RejoinGroup::barrier_impl() {
  throw InvalidArgument("a rejoined rank makes no group barriers: its peers are in their calls");
}

void RejoinGroup::peer_replaced(int rank) { deaths_->rewatch(rank, rdv_->pid(rank)); }

void ShmGroup::allgather(const void* in, void* out, size_t bytes) {
  bootstrap_->allgather(in, out, bytes);
}

void ShmGroup::barrier_impl() {
  if (single_host())
    barrier_->arrive_and_wait(WaitPolicy{options().timeout});
  else
    bootstrap_->barrier();
}

}  // namespace ubep::bootstrap

namespace ubep {

std::unique_ptr<Group> make_rejoin_group(const std::string& elastic_name, int rank,
                                         GroupOptions options) {
  auto rdv = bootstrap::Rendezvous::open(elastic_name);
  UBEP_CHECK_ARG(rank >= 0 && rank < rdv->ranks(), "make_rejoin_group: rank ", rank,
                 " out of range [0, ", rdv->ranks(), ") of group '", elastic_name, "'");
  options.elastic_name = elastic_name;
  return std::make_unique<bootstrap::RejoinGroup>(std::move(rdv), rank, options);
}

std::unique_ptr<Group> make_bootstrap_group(std::shared_ptr<Bootstrap> bootstrap,
                                            GroupOptions options) {
  UBEP_CHECK_ARG(bootstrap != nullptr, "make_bootstrap_group: bootstrap is null");
  UBEP_CHECK_ARG(options.timeout.count() > 0,
                 "make_bootstrap_group: timeout must be positive, got ", options.timeout.count(),
                 " ms");
  std::vector<int> hosts = bootstrap::resolve_hosts(*bootstrap, options);
  return std::make_unique<bootstrap::ShmGroup>(std::move(bootstrap), options, std::move(hosts),
                                               nullptr);
}

}  // namespace ubep
