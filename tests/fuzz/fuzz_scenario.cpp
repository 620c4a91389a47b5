#include "fuzz_scenario.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>

namespace ubep::fuzz {

namespace {

// Reads the fuzz input front to back; past the end every read is 0, so short inputs decode to
// small, valid scenarios and libFuzzer can grow them byte by byte.
class ByteReader {
 public:
  ByteReader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint8_t byte() { return pos_ < n_ ? d_[pos_++] : 0; }
  int in(int lo, int hi) { return lo + byte() % (hi - lo + 1); }  // [lo, hi]
  bool one_in(int n) { return byte() % n == n - 1; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return v;
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
};

// An expert id: mostly valid, some -1, some out of range (to be rejected).
int64_t decode_id(ByteReader& in, int experts) {
  const uint8_t b = in.byte();
  if (b < 40) return -1;
  if (b < 46) {
    const int64_t bad[] = {experts,
                           experts + 1,
                           -2,
                           std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max(),
                           (int64_t{1} << 32) + 0};  // would alias expert 0 if cut to int32
    return bad[b - 40];
  }
  return b % experts;
}

float decode_weight(ByteReader& in) {
  const uint8_t b = in.byte();
  const float special[] = {0.0f, -0.0f, 1e-40f /* denormal */, 1.0f, -1.0f, 0.5f, 3.0e38f, 1e-3f};
  if (b < 16) return special[b % 8];
  return static_cast<float>(static_cast<int>(b) - 136) / 32.0f;
}

// Token values from a seed; with `specials`, some are NaN, +-Inf, -0 or denormal (they must
// travel bit-exactly).
float value_at(std::mt19937_64& rng, bool specials) {
  const float v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
  if (!specials || rng() % 8 != 0) return v;
  const float s[] = {std::numeric_limits<float>::quiet_NaN(),
                     std::numeric_limits<float>::infinity(),
                     -std::numeric_limits<float>::infinity(), -0.0f, 1e-42f};
  return s[rng() % 5];
}

// Across hosts only valid calls are fuzzed (outside strict mode): there a failed or mismatched
// call is not yet published to the peers, who wait for their timeout (open finding F4,
// docs/FUZZING.md), which would make each such input take seconds.
void make_valid(const BufferConfig& cfg, Layout layout, int topk, RankCall& rc,
                test::RankInput& ri) {
  rc = RankCall{};
  rc.layout = cfg.enable_latency_layout ? layout : Layout::kThroughput;
  ri.tokens = std::min<int64_t>(ri.tokens, cfg.max_tokens_per_rank);
  ri.x_bf16.resize(cfg.dtype == DType::kBF16 ? static_cast<size_t>(ri.tokens * cfg.hidden) : 0);
  ri.x_f32.resize(cfg.dtype == DType::kFP32 ? static_cast<size_t>(ri.tokens * cfg.hidden) : 0);
  std::vector<int64_t> idx;
  std::vector<float> w;
  for (int64_t t = 0; t < ri.tokens; ++t)
    for (int j = 0; j < topk; ++j) {
      const size_t at = static_cast<size_t>(t * ri.topk + j);
      int64_t e = j < ri.topk ? ri.topk_idx[at] : -1;
      if (e < -1 || e >= cfg.num_experts) e = -1;
      for (int j2 = 0; j2 < j && e >= 0; ++j2)
        if (idx[static_cast<size_t>(t * topk + j2)] == e) e = -1;
      idx.push_back(e);
      w.push_back(j < ri.topk ? ri.topk_weights[at] : 0.5f);
    }
  ri.topk = topk;
  ri.topk_idx = std::move(idx);
  ri.topk_weights = std::move(w);
}

CallPlan decode_call(ByteReader& in, const Scenario& s) {
  const BufferConfig& cfg = s.config;
  const int R = s.ranks;
  const int E = std::max(cfg.num_experts, 1);
  CallPlan c;
  c.algorithm = in.one_in(2) ? Algorithm::kBsp : Algorithm::kUbep;
  c.split_phase = c.algorithm == Algorithm::kUbep && in.one_in(3);
  c.combine = static_cast<CombineMode>(in.byte() % 3);
  const Layout layout = in.one_in(2) ? Layout::kLatency : Layout::kThroughput;
  c.replace_weights = layout == Layout::kLatency && in.one_in(3);
  const int topk = in.in(1, std::max(cfg.max_topk, 1));
  const bool allow_duplicates = in.one_in(8);
  const bool specials = in.one_in(4);
  const uint64_t seed = in.byte();

  test::Problem& p = c.problem;
  p.ranks = R;
  p.experts = cfg.num_experts;
  p.hidden = cfg.hidden;
  p.dtype = cfg.dtype;
  p.ranks_per_host = s.ranks_per_host;
  std::mt19937_64 rng(seed * 7919 + 17);
  for (int r = 0; r < R; ++r) {
    RankCall rc;
    rc.layout = layout;
    // Another layout on one rank: only in strict mode (open finding F3, docs/FUZZING.md).
    if (in.one_in(24) && strict_mode())
      rc.layout = layout == Layout::kLatency ? Layout::kThroughput : Layout::kLatency;
    if (in.one_in(6)) rc.defect = static_cast<Defect>(1 + in.byte() % 5);
    rc.bad_combine_handle = in.one_in(32);
    test::RankInput ri;
    // Up to one token over the capacity (to be rejected).
    ri.tokens = in.in(0, static_cast<int>(cfg.max_tokens_per_rank) + 1);
    ri.topk = topk;
    if (in.one_in(20)) ri.topk = in.in(0, cfg.max_topk + 1);  // another topk, maybe out of range
    const int64_t H = std::max<int64_t>(cfg.hidden, 0);
    for (int64_t i = 0; i < ri.tokens * H; ++i) {
      const float v = value_at(rng, specials);
      if (cfg.dtype == DType::kBF16)
        ri.x_bf16.push_back(float_to_bf16(v));
      else
        ri.x_f32.push_back(v);
    }
    std::vector<float> cw;
    for (int64_t t = 0; t < ri.tokens; ++t) {
      std::vector<int64_t> row;
      for (int j = 0; j < ri.topk; ++j) {
        int64_t e = decode_id(in, E);
        // Without the flag, a repeated id becomes -1, so most inputs stay valid.
        if (!allow_duplicates && e >= 0)
          for (int64_t prev : row) e = prev == e ? -1 : e;
        row.push_back(e);
        ri.topk_idx.push_back(e);
        ri.topk_weights.push_back(decode_weight(in));
        cw.push_back(decode_weight(in));
      }
    }
    if (s.ranks_per_host > 0 && !strict_mode()) make_valid(cfg, layout, topk, rc, ri);
    p.inputs.push_back(std::move(ri));
    c.ranks.push_back(rc);
    c.combine_weights.push_back(std::move(cw));
  }
  return c;
}

}  // namespace

bool strict_mode() {
  static const bool strict = [] {
    const char* v = std::getenv("UBEP_FUZZ_STRICT");
    return v && std::string(v) == "1";
  }();
  return strict;
}

const char* defect_name(Defect d) {
  const char* names[] = {"none",         "null-x",      "null-idx",
                         "null-weights", "wrong-dtype", "wrong-hidden"};
  return names[static_cast<int>(d)];
}

const char* expect_name(Expect e) {
  const char* names[] = {"success", "config-rejected", "dispatch-rejected", "disagreement",
                         "combine-rejected"};
  return names[static_cast<int>(e)];
}

Scenario decode(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  Scenario s;
  s.ranks = in.in(1, 4);
  const int per_host = in.byte() % 4;  // 0 (one host), else forced hosts of 1-2 ranks
  s.ranks_per_host = per_host == 0 || s.ranks == 1 ? 0 : per_host == 3 ? 2 : per_host;
  BufferConfig& cfg = s.config;
  cfg.max_tokens_per_rank = in.in(1, 8);
  cfg.hidden = in.in(1, 40);
  cfg.dtype = in.one_in(2) ? DType::kBF16 : DType::kFP32;
  cfg.num_experts = s.ranks * in.in(1, 4);
  cfg.max_topk = in.in(1, 6);
  cfg.num_workers = in.in(0, 2);
  cfg.research.sync = in.one_in(3) ? SyncMode::kStopAndWait : SyncMode::kFused;
  cfg.enable_latency_layout = !in.one_in(8);
  cfg.placement = static_cast<Placement>(in.byte() % 3);
  const uint8_t epoch = in.byte();
  cfg.initial_epoch = epoch < 128 ? 0 : epoch < 224 ? 0xFFFFFFFFull - (epoch % 5) : in.u64();
  // Rarely a config the Buffer must reject (every rank passes the same one).
  switch (in.byte() % 32) {
    case 0:
      cfg.hidden = 0;
      break;
    case 1:
      cfg.num_experts += 1;
      break;  // not a multiple of the group size (unless 1 rank)
    case 2:
      cfg.max_topk = 0;
      break;
    case 3:
      cfg.max_tokens_per_rank = 0;
      break;
    case 4:
      cfg.max_topk = 65;
      break;
    default:
      break;
  }
  cfg.algorithm = in.one_in(2) ? Algorithm::kBsp : Algorithm::kUbep;
  const int calls = in.in(1, 3);
  for (int i = 0; i < calls && config_valid(s); ++i) s.calls.push_back(decode_call(in, s));
  return s;
}

bool config_valid(const Scenario& s) {
  const BufferConfig& c = s.config;
  return c.max_tokens_per_rank >= 1 && c.hidden >= 1 && c.num_experts >= 1 &&
         c.num_experts % s.ranks == 0 && c.max_topk >= 1 && c.max_topk <= 64;
}

bool dispatch_valid(const Scenario& s, const CallPlan& c, int r) {
  const BufferConfig& cfg = s.config;
  const test::RankInput& in = c.problem.inputs[static_cast<size_t>(r)];
  const RankCall& rc = c.ranks[static_cast<size_t>(r)];
  if (rc.layout == Layout::kLatency && !cfg.enable_latency_layout) return false;
  if (in.tokens > cfg.max_tokens_per_rank) return false;
  if (in.topk < 1 || in.topk > cfg.max_topk) return false;
  switch (rc.defect) {
    case Defect::kNone:
      break;
    case Defect::kNullX:
      if (in.tokens * cfg.hidden > 0) return false;
      break;
    case Defect::kNullIdx:
    case Defect::kNullWeights:
      if (in.tokens * in.topk > 0) return false;
      break;
    case Defect::kWrongDtype:
    case Defect::kWrongHidden:
      return false;
  }
  for (int64_t t = 0; t < in.tokens; ++t)
    for (int j = 0; j < in.topk; ++j) {
      const int64_t e = in.topk_idx[static_cast<size_t>(t * in.topk + j)];
      if (e < -1 || e >= cfg.num_experts) return false;
      for (int j2 = 0; j2 < j && e >= 0; ++j2)
        if (in.topk_idx[static_cast<size_t>(t * in.topk + j2)] == e) return false;
    }
  return true;
}

Expect expect_call(const Scenario& s, const CallPlan& c) {
  bool all_valid = true;
  for (int r = 0; r < s.ranks; ++r) all_valid = all_valid && dispatch_valid(s, c, r);
  if (!all_valid) return Expect::kDispatchRejected;
  for (int r = 1; r < s.ranks; ++r)
    if (c.ranks[static_cast<size_t>(r)].layout != c.ranks[0].layout ||
        c.problem.inputs[static_cast<size_t>(r)].topk != c.problem.inputs[0].topk)
      return Expect::kDisagreement;
  for (const RankCall& rc : c.ranks)
    if (rc.bad_combine_handle) return Expect::kCombineRejected;
  return Expect::kSuccess;
}

std::string Scenario::describe() const {
  std::ostringstream os;
  const BufferConfig& c = config;
  os << "ranks=" << ranks << " per_host=" << ranks_per_host << " T=" << c.max_tokens_per_rank
     << " H=" << c.hidden << " dtype=" << dtype_name(c.dtype) << " E=" << c.num_experts
     << " max_topk=" << c.max_topk << " workers=" << c.num_workers
     << " sync=" << sync_mode_name(c.research.sync) << " latency=" << c.enable_latency_layout
     << " placement=" << placement_name(c.placement) << " epoch=" << c.initial_epoch << "\n";
  for (size_t i = 0; i < calls.size(); ++i) {
    const CallPlan& cp = calls[i];
    os << " call " << i << ": " << algorithm_name(cp.algorithm) << (cp.split_phase ? " split" : "")
       << " combine=" << static_cast<int>(cp.combine) << " replace_w=" << cp.replace_weights
       << " expect=" << expect_name(expect_call(*this, cp)) << "\n";
    for (int r = 0; r < ranks; ++r) {
      const auto& in = cp.problem.inputs[static_cast<size_t>(r)];
      const auto& rc = cp.ranks[static_cast<size_t>(r)];
      os << "  rank " << r << ": " << layout_name(rc.layout) << " tokens=" << in.tokens
         << " topk=" << in.topk << " defect=" << defect_name(rc.defect)
         << " bad_handle=" << rc.bad_combine_handle << " ids=[";
      for (int64_t e : in.topk_idx) os << e << " ";
      os << "]\n";
    }
  }
  return os.str();
}

}  // namespace ubep::fuzz
