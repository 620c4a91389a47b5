#include "kill_run.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "bootstrap/fork_bootstrap.hpp"
#include "ubep/bf16.hpp"
#include "ubep/buffer.hpp"
#include "ubep/error.hpp"

namespace ubep::elastic {

namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for every process

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

// What the processes share: the first kill's time and every rank's report.
struct Shared {
  std::atomic<double> kill_us{0};
  std::atomic<int> input_iter[64];         // the loop iteration whose inputs rank r dispatches now
  std::atomic<int> done[64];               // rank r finished its loop
  std::atomic<int> replacement_calls[64];  // dispatches rank r's replacement completed
  RankReport reports[64];
  RankReport replacement_reports[64];
};

uint64_t mix(uint64_t a) {
  a ^= a >> 33;
  a *= 0xff51afd7ed558ccdull;
  a ^= a >> 33;
  a *= 0xc4ceb9fe1a85ec53ull;
  return a ^ (a >> 33);
}

// Every rank's inputs of call i, computable by any rank.
struct Inputs {
  const RunOptions& o;
  int experts() const { return o.ranks * o.experts_per_rank; }
  // topk distinct experts (or -1: dropped) of token t of rank s in call i.
  void route(int s, int t, int i, int64_t* idx, float* w) const {
    const uint64_t base = mix(static_cast<uint64_t>(s) << 40 ^ static_cast<uint64_t>(t) << 20 ^
                              static_cast<uint64_t>(i));
    const int E = experts();
    int first = static_cast<int>(base % static_cast<uint64_t>(E));
    for (int k = 0; k < o.topk; ++k) {
      idx[k] = (first + k * 5) % E;  // distinct while topk * 5 < E or gcd allows; checked below
      for (int j = 0; j < k; ++j)
        if (idx[j] == idx[k]) idx[k] = -1;
      if ((mix(base + static_cast<uint64_t>(k)) & 7u) == 0) idx[k] = -1;  // some drops
      w[k] = 0.125f * static_cast<float>(1 + ((base >> (8 * k)) & 3u));
    }
  }
  // x[s][t][h] in call i: a small integer, exact in bf16 and in every sum of weighted rows.
  float value(int s, int t, int h, int i) const {
    return static_cast<float>((s * 7 + t * 3 + h + i) % 16 - 8);
  }
};

// CPU time (user + system) of this process's thread named `name`, from /proc; -1 if none.
double thread_cpu_us(const char* name) {
  double total = -1;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string dir = std::string("/proc/self/task/") + e->d_name;
      char comm[64] = {};
      if (FILE* f = std::fopen((dir + "/comm").c_str(), "r")) {
        if (!std::fgets(comm, sizeof comm, f)) comm[0] = 0;
        std::fclose(f);
      }
      if (std::strncmp(comm, name, std::strlen(name)) != 0) continue;
      if (FILE* f = std::fopen((dir + "/stat").c_str(), "r")) {
        char buf[1024] = {};
        const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
        std::fclose(f);
        const char* p = std::strrchr(buf, ')');
        unsigned long long ut = 0, st = 0;
        if (n && p &&
            std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) ==
                2)
          total = std::max(total, 0.0) +
                  1e6 * static_cast<double>(ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
      }
    }
    closedir(d);
  }
  return total;
}

void note(char (&dst)[200], const std::string& s) {
  std::snprintf(dst, sizeof dst, "%s", s.c_str());
}

// One rank's loop. replacement: a new process for rank `me` after its first one died, joining
// the live group through make_rejoin_group; it runs until the live ranks are done.
void rank_main(const RunOptions& o, bootstrap::ForkMeeting& meeting, Shared& shared, int me,
               const Victim* replacing) {
  const double start_us = now_us();
  RankReport& rep = replacing ? shared.replacement_reports[me] : shared.reports[me];
  GroupOptions gopt;
  gopt.timeout = std::chrono::milliseconds(o.timeout_ms);
  gopt.elastic_name = o.elastic_name;
  std::shared_ptr<bootstrap::ForkBootstrap> boot;
  std::unique_ptr<Group> group;
  if (replacing) {
    group = make_rejoin_group(o.elastic_name, me, gopt);
  } else {
    boot = std::make_shared<bootstrap::ForkBootstrap>(meeting, me, gopt.timeout);
    group = make_bootstrap_group(boot, gopt);
  }
  BufferConfig cfg;
  cfg.max_tokens_per_rank = o.tokens;
  cfg.hidden = o.hidden;
  cfg.num_experts = o.ranks * o.experts_per_rank;
  cfg.max_topk = o.topk;
  cfg.num_workers = 0;
  cfg.mask_dead_ranks = true;
  Buffer buf(*group, cfg);
  if (boot) boot->barrier();  // set-up done everywhere: kills land in calls

  const Inputs in{o};
  const int T = o.tokens, H = o.hidden, K = o.topk, El = o.experts_per_rank;
  std::vector<uint16_t> x(static_cast<size_t>(T * H));
  std::vector<int64_t> idx(static_cast<size_t>(T * K));
  std::vector<float> w(static_cast<size_t>(T * K));
  auto others_done = [&] {
    for (int r = 0; r < o.ranks; ++r)
      if (r != me && !shared.done[r].load()) {
        bool victim = false;
        for (const Victim& c : o.victims) victim = victim || (c.rank == r && !c.replace);
        if (!victim) return false;
      }
    return true;
  };
  // Some live rank finished its loop: the calls from here on may pair with nobody.
  auto some_done = [&] {
    for (int r = 0; r < o.ranks; ++r)
      if (r != me && shared.done[r].load()) return true;
    return false;
  };
  bool tail_now = false;
  // A call threw: records what and when, and counts it. A PeerFailedError once peers finished
  // their loop and left (the tail) is not a failure under test and is counted apart; anything
  // else counts as `other` wherever it happens.
  auto failed = [&](const std::string& what, bool peer_failed) {
    if (rep.first_error_us < 0 && shared.kill_us.load() > 0) {
      rep.first_error_us = now_us() - shared.kill_us.load();
      note(rep.first_error, what);
    }
    note(rep.last_error, what);
    if (!peer_failed)
      ++rep.other_errors;
    else if (tail_now || (replacing && some_done()))
      ++rep.tail_failed;
    else
      ++rep.failed;
  };
  int first_i = 0;
  if (replacing)
    for (int r = 0; r < o.ranks; ++r)
      if (r != me) first_i = std::max(first_i, shared.input_iter[r].load() + 1);
  // When a replacement is expected, a survivor's loop runs on (up to 10 s) until it has made
  // full calls with it, so a replacement that is slow to start (a loaded machine) is still met.
  bool expect_replacement = false;
  for (const Victim& c : o.victims) expect_replacement = expect_replacement || c.replace;
  // Every replacement made 3 calls (with the survivors: dispatches are collective), or was
  // meant to die.
  auto replacements_served = [&] {
    for (const Victim& c : o.victims)
      if (c.replace && c.kill_replacement_at < 0 && shared.replacement_calls[c.rank].load() < 3)
        return false;
    return true;
  };
  const double give_up_us = start_us + 10e6;
  int calls = o.calls;
  for (int i = first_i;; ++i) {
    if (!replacing && expect_replacement && i == calls - 3 && !replacements_served() &&
        now_us() < give_up_us)
      ++calls;
    if (replacing ? others_done() : i >= calls) break;
    const bool tail = replacing ? some_done() : i >= calls - 3;
    const int k = i - first_i;  // the replacement's own call count
    Victim replacement_kill;
    const Victim* v = nullptr;
    for (const Victim& c : o.victims)
      if (!replacing && c.rank == me && c.at_call == i) v = &c;
    if (replacing && replacing->kill_replacement_at == k) {
      replacement_kill.phase =
          replacing->kill_replacement_at == 0 ? KillPhase::kDuring : KillPhase::kBefore;
      v = &replacement_kill;
    }
    shared.input_iter[me].store(i);
    if (o.pace_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(o.pace_us));
    auto die = [&](int sig) {
      double expected = 0;
      shared.kill_us.compare_exchange_strong(expected, now_us());
      raise(sig);
    };
    if (v && v->phase == KillPhase::kBefore) die(SIGKILL);
    if (v && v->phase == KillPhase::kStop) die(SIGSTOP);
    if (v && v->phase == KillPhase::kDuring) {
      // A kernel timer delivers the SIGKILL 30 us into the dispatch. A thread that slept 30 us
      // and then raised it could, on a loaded machine, go unscheduled until after the victim's
      // last call, and the victim would never die.
      double expected = 0;
      shared.kill_us.compare_exchange_strong(expected, now_us() + 30);
      sigevent ev{};
      ev.sigev_notify = SIGEV_SIGNAL;
      ev.sigev_signo = SIGKILL;
      timer_t timer;
      itimerspec at{};
      at.it_value.tv_nsec = 30000;
      if (timer_create(CLOCK_MONOTONIC, &ev, &timer) != 0 ||
          timer_settime(timer, 0, &at, nullptr) != 0)
        raise(SIGKILL);  // no timer: die now rather than not at all
    }
    for (int t = 0; t < T; ++t) {
      in.route(me, t, i, &idx[static_cast<size_t>(t * K)], &w[static_cast<size_t>(t * K)]);
      for (int h = 0; h < H; ++h)
        x[static_cast<size_t>(t * H + h)] = float_to_bf16(in.value(me, t, h, i));
    }
    tail_now = tail;
    DispatchArgs args;
    args.x = TensorView(x.data(), DType::kBF16, {T, H});
    args.topk_idx = TensorView(idx.data(), DType::kInt64, {T, K});
    args.topk_weights = TensorView(w.data(), DType::kFP32, {T, K});
    args.layout = Layout::kLatency;
    DispatchResult r;
    try {
      if (v && v->phase == KillPhase::kReceive) {
        buf.dispatch_send(args);
        die(SIGKILL);
      }
      r = buf.dispatch(args);
      ++rep.completed;
    } catch (const PeerFailedError& e) {
      // A peer that finished its loop left (its Buffer's departure word): no call of this rank
      // can complete any more, so its loop is over too. The loops need not end together: a
      // survivor whose dispatch held the agreement (it failed no call) runs up to two iterations
      // behind those that failed calls around it (ubep-elastic under load: 56 calls completed
      // in 28 iterations against 30, and its 29th dispatch met its peers' departures).
      tail_now = tail_now || some_done();
      failed(e.what(), true);
      if (some_done()) break;
      continue;
    } catch (const BrokenBufferError& e) {
      // Broken by a departure seen earlier in this call (the same end of the loop as above).
      if (some_done()) {
        ++rep.tail_failed;
        break;
      }
      failed(e.what(), false);
      continue;
    } catch (const std::exception& e) {
      if (replacing && some_done()) {  // the live ranks finish and leave: its loop is over
        ++rep.tail_failed;
        break;
      }
      failed(e.what(), false);
      continue;
    }
    if (rep.first_call_us < 0) rep.first_call_us = now_us() - start_us;
    if (replacing) shared.replacement_calls[me].fetch_add(1);
    if (rep.first_after_us < 0 && shared.kill_us.load() > 0)
      rep.first_after_us = now_us() - shared.kill_us.load();
    const std::vector<int> masked = buf.masked_ranks();
    if (!tail && !(replacing && some_done())) rep.final_masked = static_cast<int>(masked.size());
    if (masked.empty() && shared.kill_us.load() > 0) ++rep.full_calls_after_kill;
    auto is_masked = [&](int s) {
      return std::find(masked.begin(), masked.end(), s) != masked.end();
    };
    if (!masked.empty()) {
      ++rep.masked_calls;
      if (rep.first_masked_us < 0 && shared.kill_us.load() > 0)
        rep.first_masked_us = now_us() - shared.kill_us.load();
    }
    // Dispatch: per live source, its tokens routed to each local expert, in token order. After
    // a failure the ranks' loops need not be in step (one may have finished the call another
    // failed), so a source's rows may come from its call i-2..i+2: the check finds the one
    // call whose routing gives exactly the received rows and then checks every value of it
    // (rows of any other call, or stale ones, match none).
    const auto* count = r.recv_count.as<const int64_t>();
    const auto* range = r.recv_range.as<const int64_t>();
    const auto* src = r.recv_src.as<const int64_t>();
    const auto* rx = r.recv_x.as<const uint16_t>();
    const int64_t RT = r.recv_x.dim(1);
    std::vector<int64_t> sidx(static_cast<size_t>(K));
    std::vector<float> sw(static_cast<size_t>(K));
    std::vector<int64_t> total(static_cast<size_t>(El), 0);
    for (int s = 0; s < o.ranks; ++s) {
      auto tokens_of = [&](int e, int call) {
        std::vector<int> tokens;
        if (is_masked(s)) return tokens;
        for (int t = 0; t < T; ++t) {
          in.route(s, t, call, sidx.data(), sw.data());
          bool here = false;
          for (int k = 0; k < K; ++k)
            here = here || (sidx[k] == me * El + e && !is_masked(static_cast<int>(sidx[k] / El)));
          if (here) tokens.push_back(t);
        }
        return tokens;
      };
      auto matches = [&](int call) {
        for (int e = 0; e < El; ++e) {
          const std::vector<int> tokens = tokens_of(e, call);
          const int64_t* rg = range + 2 * (e * o.ranks + s);
          if (rg[1] != static_cast<int64_t>(tokens.size())) return false;
          for (int64_t p = 0; p < rg[1]; ++p) {
            const int64_t row = e * RT + rg[0] + p;
            if (src[2 * row] != s || src[2 * row + 1] != tokens[static_cast<size_t>(p)])
              return false;
          }
        }
        return true;
      };
      // Candidates: this rank's own neighbourhood, and the iteration the source says it is on
      // (or just left): a replacement's loop counts from where it joined.
      int call = -1;
      const int theirs = shared.input_iter[s].load();
      for (int c = std::max(0, i - 2); c <= i + 2 && call < 0; ++c)
        if (matches(c)) call = c;
      for (int c = std::max(0, theirs - 2); c <= theirs && call < 0; ++c)
        if (matches(c)) call = c;
      if (call < 0) {
        ++rep.wrong;
        continue;
      }
      for (int e = 0; e < El; ++e) {
        const int64_t* rg = range + 2 * (e * o.ranks + s);
        total[static_cast<size_t>(e)] += rg[1];
        for (int64_t p = 0; p < rg[1]; ++p) {
          const int64_t row = e * RT + rg[0] + p;
          const int t = static_cast<int>(src[2 * row + 1]);
          for (int h = 0; h < H; ++h)
            if (bf16_to_float(rx[row * H + h]) != in.value(s, t, h, call)) ++rep.wrong;
        }
      }
    }
    for (int e = 0; e < El; ++e)
      if (count[e] != total[static_cast<size_t>(e)]) ++rep.wrong;
    if (v && v->phase == KillPhase::kBetween) die(SIGKILL);
    // Combine with the identity expert: y[t] = sum over live k of w_k * x[t], exact.
    try {
      CombineArgs ca;
      ca.x = r.recv_x;
      ca.handle = r.handle;
      TensorView y = buf.combine(ca);
      ++rep.completed;
      const auto* yv = y.as<const uint16_t>();
      for (int t = 0; t < T; ++t) {
        float wsum = 0;
        for (int k = 0; k < K; ++k) {
          const int64_t e = idx[static_cast<size_t>(t * K + k)];
          if (e >= 0 && !is_masked(static_cast<int>(e / El)))
            wsum += w[static_cast<size_t>(t * K + k)];
        }
        for (int h = 0; h < H; ++h)
          if (bf16_to_float(yv[t * H + h]) != wsum * in.value(me, t, h, i)) ++rep.wrong;
      }
    } catch (const PeerFailedError& e) {
      failed(e.what(), true);
    } catch (const std::exception& e) {
      failed(e.what(), false);
    }
  }
  shared.done[me].store(1);
  rep.run_us = now_us() - start_us;
  rep.watch_cpu_us = thread_cpu_us("ubep-deathwatch");
}

}  // namespace

const char* phase_name(KillPhase p) {
  switch (p) {
    case KillPhase::kBefore:
      return "before";
    case KillPhase::kDuring:
      return "during";
    case KillPhase::kReceive:
      return "receive";
    case KillPhase::kBetween:
      return "between";
    case KillPhase::kStop:
      return "stop";
  }
  return "?";
}

KillPhase parse_phase(const std::string& s) {
  for (KillPhase p : {KillPhase::kBefore, KillPhase::kDuring, KillPhase::kReceive,
                      KillPhase::kBetween, KillPhase::kStop})
    if (s == phase_name(p)) return p;
  throw InvalidArgument("phase must be before|during|receive|between|stop, got '" + s + "'");
}

RunResult run_kill_loop(const RunOptions& opt) {
  RunResult result;
  RunOptions o = opt;
  for (const Victim& v : o.victims)
    if (v.replace && o.elastic_name.empty())
      o.elastic_name = "kill-run-" + std::to_string(getpid());
  UBEP_CHECK_ARG(o.ranks >= 2 && o.ranks <= 64, "ranks must be in [2, 64], got ", o.ranks);
  UBEP_CHECK_ARG(o.topk >= 1 && o.topk <= o.ranks * o.experts_per_rank, "bad topk ", o.topk);
  void* mem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw SystemError("run_kill_loop: mmap");
  Shared* shared = new (mem) Shared();
  const std::vector<std::string> before = shm_segments();  // not this run's, whatever their pid
  bootstrap::ForkMeeting meeting(o.ranks);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        rank_main(o, meeting, *shared, r, nullptr);
      } catch (const std::exception& e) {
        note(shared->reports[r].last_error, std::string("set-up: ") + e.what());
        ++shared->reports[r].other_errors;
        code = 1;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<pid_t> replacements;
  for (const Victim& v : o.victims) {
    if (!v.replace || v.rank >= o.ranks) continue;
    int status = 0;
    waitpid(pids[static_cast<size_t>(v.rank)], &status, 0);  // dead: start its replacement
    shared->reports[v.rank].died = WIFSIGNALED(status);
    shared->reports[v.rank].exit_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        rank_main(o, meeting, *shared, v.rank, &v);
      } catch (const std::exception& e) {
        note(shared->replacement_reports[v.rank].last_error, std::string("set-up: ") + e.what());
        ++shared->replacement_reports[v.rank].other_errors;
        code = 1;
      }
      _exit(code);
    }
    replacements.push_back(pid);
  }
  for (const Victim& v : o.victims)
    if (v.phase == KillPhase::kStop && v.rank < o.ranks) {
      // Resume the stopped rank once it has been stopped for stop_ms.
      int status = 0;
      waitpid(pids[static_cast<size_t>(v.rank)], &status, WUNTRACED);
      std::this_thread::sleep_for(std::chrono::milliseconds(o.stop_ms));
      kill(pids[static_cast<size_t>(v.rank)], SIGCONT);
    }
  for (int r = 0; r < o.ranks; ++r) {
    int status = 0;
    RankReport& rep = shared->reports[r];
    if (waitpid(pids[static_cast<size_t>(r)], &status, 0) == pids[static_cast<size_t>(r)]) {
      rep.died = WIFSIGNALED(status);
      rep.exit_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    result.ranks.push_back(rep);
  }
  size_t n = 0;
  for (const Victim& v : o.victims) {
    if (!v.replace) continue;
    int status = 0;
    const pid_t pid = replacements[n++];
    waitpid(pid, &status, 0);
    RankReport rep = shared->replacement_reports[v.rank];
    rep.died = WIFSIGNALED(status);
    rep.exit_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    result.replacements.push_back(rep);
    pids.push_back(pid);
  }
  result.pids.assign(pids.begin(), pids.end());
  for (std::string& name : shm_segments(result.pids))
    if (std::find(before.begin(), before.end(), name) == before.end())
      result.leftover_names.push_back(std::move(name));
  const std::string rdv = "ubep-rdv-" + o.elastic_name;
  if (!o.elastic_name.empty() && access(("/dev/shm/" + rdv).c_str(), F_OK) == 0 &&
      std::find(before.begin(), before.end(), rdv) == before.end())
    result.leftover_names.push_back(rdv);
  shared->~Shared();
  munmap(mem, sizeof(Shared));
  return result;
}

std::vector<std::string> shm_segments(const std::vector<int>& pids) {
  std::vector<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, "ubep-", 5) != 0) continue;
      if (!pids.empty()) {
        const int pid = std::atoi(e->d_name + 5);
        if (std::find(pids.begin(), pids.end(), pid) == pids.end()) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // a live process holds the pid now
      }
      names.emplace_back(e->d_name);
    }
    closedir(d);
  }
  return names;
}

}  // namespace ubep::elastic
