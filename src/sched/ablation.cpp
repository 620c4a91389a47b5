// The UBEP paper's scheduling ablation, on the library's own scheduler: every source rank's
// routing is planned with each policy and the predicted slowest worker is reported.
#include <algorithm>
#include <iomanip>
#include <random>
#include <sstream>

#include "ubep/error.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::sched {

namespace {

void check(const RoutingConfig& c) {
  UBEP_CHECK_ARG(c.ranks >= 1, "routing: ranks must be >= 1, got ", c.ranks);
  UBEP_CHECK_ARG(c.experts >= c.ranks && c.experts % c.ranks == 0, "routing: experts (", c.experts,
                 ") must be a positive multiple of ranks (", c.ranks, ")");
  UBEP_CHECK_ARG(c.topk >= 1 && c.topk <= c.experts, "routing: topk must be in [1, ", c.experts,
                 "], got ", c.topk);
  UBEP_CHECK_ARG(c.hot_experts >= 0 && c.hot_experts <= c.experts,
                 "routing: hot_experts must be in [0, ", c.experts, "], got ", c.hot_experts);
  UBEP_CHECK_ARG(c.hot_weight > 0, "routing: hot_weight must be > 0, got ", c.hot_weight);
  UBEP_CHECK_ARG(c.tokens_per_rank >= 0, "routing: tokens_per_rank must be >= 0, got ",
                 c.tokens_per_rank);
}

// Uniform double in [0, 1) from the generator's raw bits: the same on every standard library
// (std::uniform_real_distribution is implementation-defined).
double unit_real(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

}  // namespace

std::vector<int32_t> hot_expert_ids(const RoutingConfig& config) {
  check(config);
  std::mt19937_64 g(config.seed);
  std::vector<int32_t> ids(static_cast<size_t>(config.experts));
  for (int e = 0; e < config.experts; ++e) ids[static_cast<size_t>(e)] = e;
  // Partial Fisher-Yates with our own bounded draw, for the same reason as unit_real.
  for (int i = 0; i < config.hot_experts; ++i) {
    const auto j = static_cast<size_t>(i) +
                   static_cast<size_t>(g() % static_cast<uint64_t>(config.experts - i));
    std::swap(ids[static_cast<size_t>(i)], ids[j]);
  }
  ids.resize(static_cast<size_t>(config.hot_experts));
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<int32_t> draw_routing(const RoutingConfig& config, int rank) {
  check(config);
  UBEP_CHECK_ARG(rank >= 0 && rank < config.ranks, "routing: rank ", rank, " out of range [0, ",
                 config.ranks, ")");
  std::vector<double> weight(static_cast<size_t>(config.experts), 1.0);
  for (int32_t e : hot_expert_ids(config)) weight[static_cast<size_t>(e)] = config.hot_weight;
  std::seed_seq seq{config.seed, static_cast<uint64_t>(rank) + 1, uint64_t{0x5eed}};
  std::mt19937_64 g(seq);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(config.tokens_per_rank) * static_cast<size_t>(config.topk));
  std::vector<char> taken(static_cast<size_t>(config.experts));
  double all = 0;
  for (double w : weight) all += w;
  for (int t = 0; t < config.tokens_per_rank; ++t) {
    std::fill(taken.begin(), taken.end(), 0);
    double left = all;
    // Sequential weighted sampling without replacement (the Plackett-Luce draw a softmax
    // router's top-k approximates).
    for (int k = 0; k < config.topk; ++k) {
      double x = unit_real(g) * left;
      int pick = -1;
      for (int e = 0; e < config.experts; ++e) {
        if (taken[static_cast<size_t>(e)]) continue;
        pick = e;  // the last untaken expert absorbs rounding at the top of the range
        x -= weight[static_cast<size_t>(e)];
        if (x < 0) break;
      }
      taken[static_cast<size_t>(pick)] = 1;
      left -= weight[static_cast<size_t>(pick)];
      out.push_back(pick);
    }
  }
  return out;
}

std::vector<int64_t> rows_per_expert(std::span<const int32_t> topk_ids, int experts) {
  UBEP_CHECK_ARG(experts >= 1, "rows_per_expert: experts must be >= 1, got ", experts);
  std::vector<int64_t> rows(static_cast<size_t>(experts), 0);
  for (int32_t e : topk_ids) {
    if (e < 0) continue;
    UBEP_CHECK_ARG(e < experts, "rows_per_expert: expert id ", e, " out of range [0, ", experts,
                   ")");
    ++rows[static_cast<size_t>(e)];
  }
  return rows;
}

std::vector<int64_t> rows_per_destination(std::span<const int32_t> topk_ids, int topk, int ranks,
                                          int experts) {
  UBEP_CHECK_ARG(topk >= 1 && topk_ids.size() % static_cast<size_t>(topk) == 0,
                 "rows_per_destination: ", topk_ids.size(), " ids are not a whole number of top-",
                 topk, " rows");
  UBEP_CHECK_ARG(ranks >= 1 && experts >= ranks && experts % ranks == 0,
                 "rows_per_destination: experts (", experts,
                 ") must be a positive multiple of ranks (", ranks, ")");
  const int per_rank = experts / ranks;
  std::vector<int64_t> rows(static_cast<size_t>(ranks), 0);
  std::vector<int> last_token(static_cast<size_t>(ranks), -1);
  for (size_t i = 0; i < topk_ids.size(); ++i) {
    const int32_t e = topk_ids[i];
    if (e < 0) continue;
    UBEP_CHECK_ARG(e < experts, "rows_per_destination: expert id ", e, " out of range [0, ",
                   experts, ")");
    const int token = static_cast<int>(i / static_cast<size_t>(topk));
    const auto r = static_cast<size_t>(e / per_rank);
    if (last_token[r] != token) {  // a token travels to a rank once
      last_token[r] = token;
      ++rows[r];
    }
  }
  return rows;
}

AblationResult scheduling_ablation(const AblationConfig& config) {
  const RoutingConfig& rc = config.routing;
  check(rc);
  UBEP_CHECK_ARG(config.hidden >= 1, "ablation: hidden must be >= 1, got ", config.hidden);
  UBEP_CHECK_ARG(config.elem_bytes >= 1, "ablation: elem_bytes must be >= 1, got ",
                 config.elem_bytes);
  Scheduler sched(parse_topology(config.topology, rc.ranks), {config.workers, Policy::kNaive});
  const int per_rank = rc.experts / rc.ranks;

  // Routing is drawn once per rank and shared by the three policies.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(rc.ranks));
  for (int r = 0; r < rc.ranks; ++r) {
    const auto ids = draw_routing(rc, r);
    rows[static_cast<size_t>(r)] = config.per_expert
                                       ? rows_per_expert(ids, rc.experts)
                                       : rows_per_destination(ids, rc.topk, rc.ranks, rc.experts);
  }

  AblationResult result;
  result.config = config;
  Plan plan;
  std::vector<double> shared(static_cast<size_t>(config.workers));
  for (PolicyFigures* f : {&result.naive, &result.column_major, &result.balanced}) {
    f->policy = f == &result.naive          ? Policy::kNaive
                : f == &result.column_major ? Policy::kColumnMajor
                                            : Policy::kBalanced;
    sched.set_policy(f->policy);
    for (int r = 0; r < rc.ranks; ++r) {
      SendWork work;
      work.src_rank = r;
      work.experts_per_rank = config.per_expert ? per_rank : 0;
      work.rows = rows[static_cast<size_t>(r)];
      work.row_bytes = static_cast<int64_t>(config.hidden) * config.elem_bytes;
      sched.plan(work, plan);
      f->slowest_ns = std::max(f->slowest_ns, plan.slowest_ns);
      f->mean_slowest_ns += plan.slowest_ns / rc.ranks;
      f->mean_imbalance += plan.imbalance / rc.ranks;
      simulate_sharing(plan, sched.topology(), 0, shared);
      f->shared_slowest_ns =
          std::max(f->shared_slowest_ns, *std::max_element(shared.begin(), shared.end()));
    }
  }
  return result;
}

std::string AblationResult::describe() const {
  const RoutingConfig& rc = config.routing;
  std::ostringstream os;
  os << "scheduling ablation: topology " << config.topology << ", " << rc.ranks << " ranks, "
     << rc.experts << " experts, top-" << rc.topk << ", " << rc.hot_experts
     << " hot experts (weight " << rc.hot_weight << "), " << rc.tokens_per_rank
     << " tokens/rank, hidden " << config.hidden << " x " << config.elem_bytes << " B, "
     << config.workers << " workers, " << (config.per_expert ? "per-expert" : "per-destination")
     << " units, seed " << rc.seed << "\n";
  os << std::left << std::setw(14) << "policy" << std::right << std::setw(14) << "slowest_us"
     << std::setw(18) << "mean_slowest_us" << std::setw(16) << "mean_imbalance" << std::setw(20)
     << "shared_slowest_us"
     << "\n";
  os << std::fixed << std::setprecision(2);
  for (const PolicyFigures* f : {&naive, &column_major, &balanced})
    os << std::left << std::setw(14) << policy_name(f->policy) << std::right << std::setw(14)
       << f->slowest_ns / 1e3 << std::setw(18) << f->mean_slowest_ns / 1e3 << std::setw(16)
       << f->mean_imbalance << std::setw(20) << f->shared_slowest_ns / 1e3 << "\n";
  return os.str();
}

}  // namespace ubep::sched
