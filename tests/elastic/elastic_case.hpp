// Shared by the elastic suites (docs/ELASTIC.md): the reference of a call with masked ranks is
// the reference of the same inputs with the masked ranks' experts dropped from every topk_idx
// and the masked ranks sending nothing (no tokens of their own).
#pragma once

#include <algorithm>
#include <vector>

#include "harness.hpp"
#include "reference.hpp"
#include "ubep/error.hpp"

namespace ubep::test {

inline Problem masked_problem(const Problem& p, const std::vector<int>& masked) {
  Problem out = p;
  const int El = p.experts / p.ranks;
  auto is_masked = [&](int r) {
    return std::find(masked.begin(), masked.end(), r) != masked.end();
  };
  for (int r = 0; r < p.ranks; ++r) {
    RankInput& in = out.inputs[static_cast<size_t>(r)];
    if (is_masked(r)) {
      in.tokens = 0;
      in.x_bf16.clear();
      in.x_f32.clear();
      in.topk_idx.clear();
      in.topk_weights.clear();
      continue;
    }
    for (int64_t& e : in.topk_idx)
      if (e >= 0 && is_masked(static_cast<int>(e / El))) e = -1;
  }
  return out;
}

// One dispatch + combine checked against the reference of the ranks the call ran with
// (buf.masked_ranks() once dispatch returned). A call in flight when the group changes fails
// with PeerFailedError naming the agreement; it is retried (at most `tries` calls in all).
inline void elastic_call(Group& g, const Case& c, const Problem& p, Buffer& buf, bool zero_copy,
                         int tries = 3) {
  for (int attempt = 1;; ++attempt) {
    try {
      run_and_check(g, c, p, &buf, nullptr, zero_copy,
                    [&] { return masked_problem(p, buf.masked_ranks()); });
      return;
    } catch (const PeerFailedError& e) {
      const std::string what = e.what();
      if (attempt >= tries || what.find("agree") == std::string::npos) {
        ADD_FAILURE() << "rank " << g.rank() << ": " << what;
        throw;
      }
    }
  }
}

inline Case elastic_case(int ranks, Layout layout, uint64_t seed) {
  Case c;
  c.experts = 4 * ranks;
  c.hidden = 64;
  c.dtype = DType::kBF16;
  c.capacity = 16;
  c.topk = 3;
  c.layout = layout;
  c.seed = seed;
  return c;
}

inline Problem elastic_problem(const Case& c, int ranks) {
  return make_problem(ranks, c.experts, c.hidden, c.dtype,
                      std::vector<int64_t>(static_cast<size_t>(ranks), c.capacity), c.topk,
                      Routing::kWithDrops, c.seed);
}

}  // namespace ubep::test
