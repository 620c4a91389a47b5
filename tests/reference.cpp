#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace ubep::test {

DispatchArgs RankInput::args(DType dt, int64_t hidden, Layout layout) const {
  DispatchArgs a;
  const void* x = dt == DType::kBF16 ? static_cast<const void*>(x_bf16.data()) : x_f32.data();
  a.x = TensorView(x, dt, {tokens, hidden});
  a.topk_idx = TensorView(topk_idx.data(), DType::kInt64, {tokens, topk});
  a.topk_weights = TensorView(topk_weights.data(), DType::kFP32, {tokens, topk});
  a.layout = layout;
  a.x.device = a.topk_idx.device = a.topk_weights.device = test_device();
  return a;
}

Device test_device() {
  static const Device d = [] {
    const char* env = std::getenv("UBEP_TEST_DEVICE");
    return env && *env ? Device::parse(env) : Device{};
  }();
  return d;
}

float Problem::value(int rank, int64_t t, int64_t h) const {
  const RankInput& in = inputs[static_cast<size_t>(rank)];
  const size_t i = static_cast<size_t>(t * hidden + h);
  return dtype == DType::kBF16 ? bf16_to_float(in.x_bf16[i]) : in.x_f32[i];
}

float stored(float v, DType dt) { return dt == DType::kBF16 ? bf16_to_float(float_to_bf16(v)) : v; }

float expert_fn(float v, int64_t which) {
  return v * static_cast<float>(1 + which % 5) + 0.25f * static_cast<float>(which % 3);
}

Problem make_problem(int ranks, int experts, int64_t hidden, DType dt,
                     const std::vector<int64_t>& tokens, int topk, Routing routing, uint64_t seed) {
  Problem p;
  p.ranks = ranks;
  p.experts = experts;
  p.hidden = hidden;
  p.dtype = dt;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f);
  for (int r = 0; r < ranks; ++r) {
    RankInput in;
    in.tokens = tokens[static_cast<size_t>(r)];
    in.topk = topk;
    const size_t n = static_cast<size_t>(in.tokens * hidden);
    for (size_t i = 0; i < n; ++i) {
      const float v = val(rng);
      if (dt == DType::kBF16)
        in.x_bf16.push_back(float_to_bf16(v));
      else
        in.x_f32.push_back(v);
    }
    for (int64_t t = 0; t < in.tokens; ++t) {
      std::vector<int64_t> chosen;
      while (static_cast<int>(chosen.size()) < std::min(topk, experts)) {
        int64_t e;
        if (routing == Routing::kHot && rng() % 4 != 0)
          e = static_cast<int64_t>(rng() % std::max(1, experts / 8 + 1)) % experts;
        else
          e = static_cast<int64_t>(rng() % static_cast<uint64_t>(experts));
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      while (static_cast<int>(chosen.size()) < topk) chosen.push_back(-1);
      for (int j = 0; j < topk; ++j) {
        int64_t e = chosen[static_cast<size_t>(j)];
        if (routing == Routing::kWithDrops && rng() % 3 == 0) e = -1;
        in.topk_idx.push_back(e);
        in.topk_weights.push_back(e < 0 ? 0.0f : val(rng) * 0.5f);
      }
    }
    p.inputs.push_back(std::move(in));
  }
  return p;
}

ExpectedDispatch expected_dispatch(const Problem& p, int me) {
  ExpectedDispatch out;
  const int El = p.experts / p.ranks;
  out.expert_rows.resize(static_cast<size_t>(El));
  for (int s = 0; s < p.ranks; ++s) {
    const RankInput& in = p.inputs[static_cast<size_t>(s)];
    for (int64_t t = 0; t < in.tokens; ++t) {
      std::vector<int32_t> idx(static_cast<size_t>(in.topk), -1);
      std::vector<float> w(static_cast<size_t>(in.topk), 0.0f);
      bool mine = false;
      for (int j = 0; j < in.topk; ++j) {
        const int64_t e = in.topk_idx[static_cast<size_t>(t * in.topk + j)];
        if (e >= 0 && e / El == me) {
          mine = true;
          idx[static_cast<size_t>(j)] = static_cast<int32_t>(e % El);
          w[static_cast<size_t>(j)] = in.topk_weights[static_cast<size_t>(t * in.topk + j)];
          out.expert_rows[static_cast<size_t>(e % El)].push_back({s, t});
        }
      }
      if (mine) {
        out.src.push_back({s, t});
        out.local_idx.push_back(idx);
        out.weights.push_back(w);
      }
    }
  }
  return out;
}

std::vector<float> expected_combine(const Problem& p, int me, Layout layout, ExpertFn expert) {
  const RankInput& in = p.inputs[static_cast<size_t>(me)];
  const int El = p.experts / p.ranks;
  std::vector<float> y(static_cast<size_t>(in.tokens * p.hidden));
  for (int64_t t = 0; t < in.tokens; ++t) {
    for (int64_t h = 0; h < p.hidden; ++h) {
      const float v = p.value(me, t, h);
      float total = 0.0f;
      bool first = true;
      for (int host = 0; host < p.num_hosts(); ++host) {
        float partial = 0.0f;
        bool any = false;
        if (layout == Layout::kThroughput) {
          for (int r = 0; r < p.ranks; ++r) {
            if (p.host_of(r) != host) continue;
            bool sent = false;
            for (int j = 0; j < in.topk; ++j) {
              const int64_t e = in.topk_idx[static_cast<size_t>(t * in.topk + j)];
              sent = sent || (e >= 0 && e / El == r);
            }
            if (!sent) continue;
            partial += stored(expert(v, r), p.dtype);
            any = true;
          }
        } else {
          for (int j = 0; j < in.topk; ++j) {
            const int64_t e = in.topk_idx[static_cast<size_t>(t * in.topk + j)];
            if (e < 0 || p.host_of(static_cast<int>(e / El)) != host) continue;
            const float w = in.topk_weights[static_cast<size_t>(t * in.topk + j)];
            const float prod = w * stored(expert(v, e), p.dtype);
            partial += prod;
            any = true;
          }
        }
        if (!any) continue;
        total = first ? partial : total + partial;
        first = false;
      }
      y[static_cast<size_t>(t * p.hidden + h)] = stored(total, p.dtype);
    }
  }
  return y;
}

}  // namespace ubep::test
