// libFuzzer target: random routing, shapes, layouts, placements, algorithms and configs through
// dispatch + combine on thread ranks (docs/FUZZING.md). Every rank's outcome must be what the
// documented rules say (fuzz_scenario.cpp): results bit-identical to the reference, or
// InvalidArgument on the rank with the bad input and PeerFailedError on its peers; never another
// exception, a crash (the sanitizers watch) or a hang (the group timeout, then libFuzzer's).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fuzz_check.hpp"
#include "fuzz_scenario.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep::fuzz {

// What a rank saw in one call.
enum class Outcome : uint8_t {
  kNotRun,
  kOk,
  kWrongResult,
  kInvalidArgument,
  kPeerFailed,
  kTimeout,
  kOtherError
};
const char* outcome_name(Outcome o) {
  const char* n[] = {"not-run",         "ok",           "wrong-result", "InvalidArgument",
                     "PeerFailedError", "TimeoutError", "other-error"};
  return n[static_cast<int>(o)];
}

struct RankLog {
  Outcome construct = Outcome::kNotRun;
  std::vector<Outcome> dispatch, combine;
  std::string message;  // the first error text or mismatch
};

// The input tensors of rank `me`, with its defect applied.
DispatchArgs dispatch_args(const Scenario& s, const CallPlan& c, int me, std::vector<float>& wide) {
  const test::RankInput& in = c.problem.inputs[static_cast<size_t>(me)];
  const RankCall& rc = c.ranks[static_cast<size_t>(me)];
  DispatchArgs a = in.args(s.config.dtype, s.config.hidden, rc.layout);
  switch (rc.defect) {
    case Defect::kNone:
      break;
    case Defect::kNullX:
      a.x.data = nullptr;
      break;
    case Defect::kNullIdx:
      a.topk_idx.data = nullptr;
      break;
    case Defect::kNullWeights:
      a.topk_weights.data = nullptr;
      break;
    case Defect::kWrongDtype:
      a.x.dtype = s.config.dtype == DType::kBF16 ? DType::kFP32 : DType::kBF16;
      break;
    case Defect::kWrongHidden:
      wide.assign(static_cast<size_t>(in.tokens * (s.config.hidden + 1)) + 1, 0.0f);
      a.x = TensorView(wide.data(), DType::kFP32, {in.tokens, s.config.hidden + 1});
      a.x.dtype = s.config.dtype;
      break;
  }
  return a;
}

Outcome classify(std::string* message) {
  try {
    throw;
  } catch (const InvalidArgument& e) {
    *message = e.what();
    return Outcome::kInvalidArgument;
  } catch (const PeerFailedError& e) {
    *message = e.what();
    return Outcome::kPeerFailed;
  } catch (const TimeoutError& e) {
    *message = e.what();
    return Outcome::kTimeout;
  } catch (const std::exception& e) {
    *message = e.what();
    return Outcome::kOtherError;
  }
}

// One call on one rank. Returns false when the rank must stop (its call failed).
bool run_call(const Scenario& s, const CallPlan& c, Buffer& buf, int me, RankLog& log) {
  const RankCall& rc = c.ranks[static_cast<size_t>(me)];
  std::vector<float> wide;
  buf.set_algorithm(c.algorithm);
  const BufferConfig& cfg = s.config;
  const Placement placement =
      cfg.placement == Placement::kAuto ? placement_for(rc.layout) : cfg.placement;
  test::Problem problem = c.problem;  // this rank's copy: combine may replace its weights
  RankView view{problem, me, cfg, rc.layout, placement};
  DispatchResult r;
  try {
    const DispatchArgs args = dispatch_args(s, c, me, wide);
    if (c.split_phase) {
      buf.dispatch_send(args);
      r = buf.dispatch_recv();
    } else {
      r = buf.dispatch(args);
    }
  } catch (...) {
    log.dispatch.push_back(classify(&log.message));
    return false;
  }
  std::string err = check_dispatch(view, r);
  std::vector<char> outputs;
  CombineArgs ca;
  ca.handle = r.handle + (rc.bad_combine_handle ? 1 : 0);
  try {
    if (err.empty() && c.combine == CombineMode::kCompacted) {
      err = check_compact(view, buf.compact(), &outputs);
      ca.compacted = true;
      ca.x = TensorView(outputs.data(), cfg.dtype, {r.num_recv_rows, cfg.hidden});
      if (rc.layout == Layout::kLatency) {
        int64_t rows = 0;
        for (int e = 0; e < buf.num_local_experts(); ++e) rows += r.recv_count.as<int64_t>()[e];
        ca.x = TensorView(outputs.data(), cfg.dtype, {rows, cfg.hidden});
      }
    } else {
      outputs = expert_outputs(view, r);
      ca.x = r.recv_x;
      ca.x.data = outputs.data();
      if (c.combine == CombineMode::kZeroCopy) {
        TensorView zc = buf.combine_buffer();
        if (zc.bytes() != outputs.size()) err = "combine_buffer() has the wrong size";
        if (!outputs.empty())
          std::memcpy(zc.data, outputs.data(), std::min(zc.bytes(), outputs.size()));
        ca.x = zc;
      }
    }
  } catch (...) {
    log.dispatch.push_back(classify(&log.message));  // compact/combine_buffer must not throw
    log.dispatch.back() = Outcome::kOtherError;
    return false;
  }
  log.dispatch.push_back(err.empty() ? Outcome::kOk : Outcome::kWrongResult);
  if (!err.empty() && log.message.empty()) log.message = "dispatch: " + err;
  // Keep communicating after a mismatch so the peers are not left waiting.
  const bool replace = c.replace_weights && s.ranks_per_host == 0 && rc.layout == Layout::kLatency;
  std::vector<float> weights = c.combine_weights[static_cast<size_t>(me)];
  if (replace) {
    const test::RankInput& in = problem.inputs[static_cast<size_t>(me)];
    ca.topk_weights = TensorView(weights.data(), DType::kFP32, {in.tokens, in.topk});
    problem.inputs[static_cast<size_t>(me)].topk_weights = weights;
  }
  TensorView y;
  try {
    if (c.split_phase) {
      buf.combine_send(ca);
      y = buf.combine_recv();
    } else {
      y = buf.combine(ca);
    }
  } catch (...) {
    log.combine.push_back(classify(&log.message));
    return false;
  }
  err = check_combine(view, y);
  log.combine.push_back(err.empty() ? Outcome::kOk : Outcome::kWrongResult);
  if (!err.empty() && log.message.empty()) log.message = "combine: " + err;
  return true;
}

void run_rank(const Scenario& s, Group& g, RankLog& log) {
  std::optional<Buffer> buf;
  try {
    buf.emplace(g, s.config);
    log.construct = Outcome::kOk;
  } catch (...) {
    log.construct = classify(&log.message);
    return;
  }
  // Every rank stops after the first call that is to fail (all know which), so none waits
  // for a peer that has stopped.
  for (const CallPlan& c : s.calls)
    if (!run_call(s, c, *buf, g.rank(), log) || expect_call(s, c) != Expect::kSuccess) return;
}

// The first way the ranks' outcomes break the rules, or "".
std::string judge(const Scenario& s, const std::vector<RankLog>& logs) {
  auto fail = [&](int r, const std::string& what) {
    return "rank " + std::to_string(r) + ": " + what + " (" + logs[static_cast<size_t>(r)].message +
           ")";
  };
  for (int r = 0; r < s.ranks; ++r) {
    const Outcome want = config_valid(s) ? Outcome::kOk : Outcome::kInvalidArgument;
    if (logs[static_cast<size_t>(r)].construct != want)
      return fail(r, std::string("Buffer construction gave ") +
                         outcome_name(logs[static_cast<size_t>(r)].construct) + ", want " +
                         outcome_name(want));
  }
  for (size_t i = 0; i < s.calls.size(); ++i) {
    const CallPlan& c = s.calls[i];
    const Expect e = expect_call(s, c);
    for (int r = 0; r < s.ranks; ++r) {
      const RankLog& l = logs[static_cast<size_t>(r)];
      const Outcome d = i < l.dispatch.size() ? l.dispatch[i] : Outcome::kNotRun;
      const Outcome cb = i < l.combine.size() ? l.combine[i] : Outcome::kNotRun;
      const std::string call = "call " + std::to_string(i) + " (" + expect_name(e) + "): ";
      const bool self_bad = !dispatch_valid(s, c, r);
      switch (e) {
        case Expect::kSuccess:
          if (d != Outcome::kOk || cb != Outcome::kOk)
            return fail(r, call + "dispatch " + outcome_name(d) + ", combine " + outcome_name(cb));
          break;
        case Expect::kDispatchRejected:
          if (self_bad ? d != Outcome::kInvalidArgument
                       : d != Outcome::kPeerFailed && d != Outcome::kInvalidArgument)
            return fail(r, call + "dispatch " + outcome_name(d));
          break;
        case Expect::kDisagreement:
          if (d != Outcome::kInvalidArgument && d != Outcome::kPeerFailed)
            return fail(r, call + "dispatch " + outcome_name(d));
          break;
        case Expect::kCombineRejected: {
          // A peer may finish its combine when none of its tokens went to the bad rank.
          const bool bad = c.ranks[static_cast<size_t>(r)].bad_combine_handle;
          if (d != Outcome::kOk ||
              (bad ? cb != Outcome::kInvalidArgument
                   : cb != Outcome::kPeerFailed && cb != Outcome::kInvalidArgument &&
                         cb != Outcome::kOk))
            return fail(r, call + "dispatch " + outcome_name(d) + ", combine " + outcome_name(cb));
          break;
        }
        case Expect::kConfigRejected:
          break;
      }
    }
    if (e != Expect::kSuccess) break;  // the ranks stopped there
  }
  return "";
}

}  // namespace ubep::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ubep;
  const fuzz::Scenario s = fuzz::decode(data, size);
  GroupOptions opts;
  // Short: a rank with bad input publishes its failure, so peers never need to wait this long;
  // only a lost failure notice runs into it (and is reported as a finding).
  opts.timeout = std::chrono::milliseconds(3000);
  opts.ranks_per_host = s.ranks_per_host;
  ThreadWorld world(s.ranks, opts);
  std::vector<std::unique_ptr<Group>> groups;
  for (int r = 0; r < s.ranks; ++r) groups.push_back(world.group(r));
  std::vector<fuzz::RankLog> logs(static_cast<size_t>(s.ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < s.ranks; ++r)
    threads.emplace_back([&, r] {
      fuzz::run_rank(s, *groups[static_cast<size_t>(r)], logs[static_cast<size_t>(r)]);
    });
  for (auto& t : threads) t.join();
  const std::string verdict = fuzz::judge(s, logs);
  if (!verdict.empty()) {
    std::fprintf(stderr, "ubep fuzz finding: %s\nscenario: %s", verdict.c_str(),
                 s.describe().c_str());
    for (int r = 0; r < s.ranks; ++r) {
      const fuzz::RankLog& l = logs[static_cast<size_t>(r)];
      std::fprintf(stderr, "rank %d:", r);
      for (size_t i = 0; i < l.dispatch.size(); ++i)
        std::fprintf(stderr, " call %zu dispatch %s combine %s;", i,
                     fuzz::outcome_name(l.dispatch[i]),
                     i < l.combine.size() ? fuzz::outcome_name(l.combine[i]) : "not-run");
      std::fprintf(stderr, " first error: %s\n", l.message.c_str());
    }
    std::abort();
  }
  return 0;
}
