// Synthetic router and the bundled BLAS expert FFN.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/enum_names.hpp"
#include "ubep/error.hpp"
#include "ubep/moe.hpp"

namespace ubep::moe {

namespace {
constexpr detail::EnumName<RouterMode> kRouterModes[] = {{RouterMode::kBalanced, "balanced"},
                                                         {RouterMode::kModerateSkew, "moderate"},
                                                         {RouterMode::kStressSkew, "stress"}};
constexpr detail::EnumName<FfnKind> kFfnKinds[] = {{FfnKind::kGated, "gated"},
                                                   {FfnKind::kSingle, "single"}};
}  // namespace

const char* router_mode_name(RouterMode m) { return detail::enum_name(kRouterModes, m); }
RouterMode parse_router_mode(const std::string& n) {
  return detail::parse_enum(kRouterModes, n, "router mode");
}
const char* ffn_kind_name(FfnKind k) { return detail::enum_name(kFfnKinds, k); }
FfnKind parse_ffn_kind(const std::string& n) {
  return detail::parse_enum(kFfnKinds, n, "ffn kind");
}

RouterOutput route(RouterMode mode, int num_experts, int topk, int64_t tokens, uint64_t seed) {
  UBEP_CHECK_ARG(num_experts >= 1, "route: num_experts must be >= 1, got ", num_experts);
  UBEP_CHECK_ARG(topk >= 1 && topk <= num_experts, "route: topk ", topk,
                 " must be in [1, num_experts=", num_experts, "]");
  UBEP_CHECK_ARG(tokens >= 0, "route: tokens must be >= 0, got ", tokens);
  // Popularity of expert e: 1/(e+1)^s. Expert 0 is the hottest, so skew also loads the low
  // ranks more than the high ones (rank r owns [r*E/R, (r+1)*E/R)), as a hot shard would.
  const double s = mode == RouterMode::kBalanced       ? 0.0
                   : mode == RouterMode::kModerateSkew ? 0.8
                                                       : 2.0;
  std::vector<double> pop(static_cast<size_t>(num_experts));
  for (int e = 0; e < num_experts; ++e) pop[static_cast<size_t>(e)] = std::pow(1.0 + e, -s);

  RouterOutput out;
  out.topk_idx.resize(static_cast<size_t>(tokens * topk));
  out.topk_weights.resize(static_cast<size_t>(tokens * topk));
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 12345);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> left(pop.size());
  for (int64_t t = 0; t < tokens; ++t) {
    left = pop;
    double total = 0;
    for (double p : left) total += p;
    float wsum = 0;
    for (int j = 0; j < topk; ++j) {
      // Sampling without replacement: draw by the remaining popularity mass.
      double r = u(rng) * total;
      int pick = num_experts - 1;
      for (int e = 0; e < num_experts; ++e) {
        if (left[static_cast<size_t>(e)] == 0) continue;
        r -= left[static_cast<size_t>(e)];
        if (r < 0) {
          pick = e;
          break;
        }
      }
      while (left[static_cast<size_t>(pick)] == 0) --pick;  // rounding at the end of the range
      total -= left[static_cast<size_t>(pick)];
      left[static_cast<size_t>(pick)] = 0;
      const float w = static_cast<float>(0.1 + u(rng));
      out.topk_idx[static_cast<size_t>(t * topk + j)] = pick;
      out.topk_weights[static_cast<size_t>(t * topk + j)] = w;
      wsum += w;
    }
    for (int j = 0; j < topk; ++j) out.topk_weights[static_cast<size_t>(t * topk + j)] /= wsum;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

struct ExpertFfn::Impl {
  FfnKind kind;
  int local_experts;
  int64_t hidden, inter;
  int max_workers;
  int64_t max_rows;
  // Gated: w1[e] = [hidden, 2*inter] (gate columns, then up columns), w2[e] = [inter, hidden].
  // Single: w1[e] = [hidden, hidden].
  std::vector<std::vector<float>> w1, w2;
  // Per-worker [max_rows, 2*inter] activations, so workers never share scratch.
  mutable std::vector<std::vector<float>> scratch;
};

namespace {
// Uniform in [-scale, scale), a pure function of (seed, expert, index): counter-based, so weight
// generation is cheap and independent of how many ranks build which experts.
void fill_weights(std::vector<float>& w, uint64_t seed, uint64_t expert, uint64_t which,
                  float scale) {
  uint64_t base = seed * 0xD1B54A32D192ED03ull ^ (expert << 20) ^ (which << 56);
  for (size_t i = 0; i < w.size(); ++i) {
    uint64_t z = base + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    w[i] = scale * (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}
}  // namespace

ExpertFfn::ExpertFfn(FfnKind kind, int local_experts, int first_global_expert, int64_t hidden,
                     int64_t intermediate, int max_workers, int64_t max_tile_rows, uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  UBEP_CHECK_ARG(local_experts >= 1, "ExpertFfn: local_experts must be >= 1, got ", local_experts);
  UBEP_CHECK_ARG(hidden >= 1, "ExpertFfn: hidden must be >= 1, got ", hidden);
  UBEP_CHECK_ARG(kind == FfnKind::kSingle || intermediate >= 1,
                 "ExpertFfn: intermediate must be >= 1, got ", intermediate);
  UBEP_CHECK_ARG(max_workers >= 1, "ExpertFfn: max_workers must be >= 1, got ", max_workers);
  UBEP_CHECK_ARG(max_tile_rows >= 1, "ExpertFfn: max_tile_rows must be >= 1, got ", max_tile_rows);
  Impl& m = *impl_;
  m.kind = kind;
  m.local_experts = local_experts;
  m.hidden = hidden;
  m.inter = kind == FfnKind::kGated ? intermediate : 0;
  m.max_workers = max_workers;
  m.max_rows = max_tile_rows;
  m.w1.resize(static_cast<size_t>(local_experts));
  m.w2.resize(static_cast<size_t>(local_experts));
  // Variance-preserving scales (uniform [-a, a] has variance a^2/3 = 1/fan_in).
  const float s_in = std::sqrt(3.0f / static_cast<float>(hidden));
  for (int e = 0; e < local_experts; ++e) {
    const auto ge = static_cast<uint64_t>(first_global_expert + e);
    if (kind == FfnKind::kGated) {
      m.w1[static_cast<size_t>(e)].resize(static_cast<size_t>(hidden * 2 * m.inter));
      m.w2[static_cast<size_t>(e)].resize(static_cast<size_t>(m.inter * hidden));
      fill_weights(m.w1[static_cast<size_t>(e)], seed, ge, 1, s_in);
      fill_weights(m.w2[static_cast<size_t>(e)], seed, ge, 2,
                   std::sqrt(3.0f / static_cast<float>(m.inter)));
    } else {
      m.w1[static_cast<size_t>(e)].resize(static_cast<size_t>(hidden * hidden));
      fill_weights(m.w1[static_cast<size_t>(e)], seed, ge, 1, s_in);
    }
  }
  if (kind == FfnKind::kGated) {
    m.scratch.resize(static_cast<size_t>(max_workers));
    for (auto& s : m.scratch) s.resize(static_cast<size_t>(max_tile_rows * 2 * m.inter));
  }
}

ExpertFfn::~ExpertFfn() = default;

void ExpertFfn::operator()(const TileTask& t) const {
  const Impl& m = *impl_;
  UBEP_CHECK_ARG(t.local_expert >= 0 && t.local_expert < m.local_experts,
                 "ExpertFfn: local expert ", t.local_expert, " outside [0, ", m.local_experts, ")");
  UBEP_CHECK_ARG(t.rows >= 0 && t.rows <= m.max_rows, "ExpertFfn: tile of ", t.rows,
                 " rows exceeds max_tile_rows ", m.max_rows);
  UBEP_CHECK_ARG(t.worker >= 0 && t.worker < m.max_workers, "ExpertFfn: worker ", t.worker,
                 " outside [0, ", m.max_workers, ")");
  if (t.rows == 0) return;
  const auto e = static_cast<size_t>(t.local_expert);
  const auto M = static_cast<blasint>(t.rows);
  const auto H = static_cast<blasint>(m.hidden);
  if (m.kind == FfnKind::kSingle) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, H, H, 1.0f, t.in,
                static_cast<blasint>(t.in_ld), m.w1[e].data(), H, 0.0f, t.out,
                static_cast<blasint>(t.out_ld));
    return;
  }
  const auto I = static_cast<blasint>(m.inter);
  float* act = m.scratch[static_cast<size_t>(t.worker)].data();
  // [rows, 2I] = x · [Wg | Wu]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, 2 * I, H, 1.0f, t.in,
              static_cast<blasint>(t.in_ld), m.w1[e].data(), 2 * I, 0.0f, act, 2 * I);
  // SiLU(gate) ⊙ up, written over the gate half.
  for (int64_t r = 0; r < t.rows; ++r) {
    float* g = act + r * 2 * I;
    const float* u = g + I;
    for (int64_t i = 0; i < I; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
  // [rows, H] = act[:, :I] · Wd
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, H, I, 1.0f, act, 2 * I, m.w2[e].data(),
              H, 0.0f, t.out, static_cast<blasint>(t.out_ld));
}

double ExpertFfn::flops(int64_t rows) const {
  const Impl& m = *impl_;
  const double r = static_cast<double>(rows), h = static_cast<double>(m.hidden);
  if (m.kind == FfnKind::kSingle) return 2.0 * r * h * h;
  const double i = static_cast<double>(m.inter);
  return 2.0 * r * h * 2.0 * i + 2.0 * r * i * h;
}

size_t ExpertFfn::weight_bytes() const {
  size_t b = 0;
  for (auto& w : impl_->w1) b += w.size() * 4;
  for (auto& w : impl_->w2) b += w.size() * 4;
  return b;
}

}  // namespace ubep::moe
