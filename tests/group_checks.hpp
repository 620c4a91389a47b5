// Checks of a Group's own collectives and the masking case, shared by the tests of TCP groups
// across hosts (issue 32: test_tcp_doors, tests/vhosts/tcp_host_loss, tests/vhosts/host_cycles,
// tests/vhosts/rejoin_while_cut).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep::test {

// The case the host-masking tests run (latency layout, bf16, 4 experts per rank, top-4, 16
// tokens per rank) and its 4 problems, made with seeds seed..seed+3 and the hosts' layout
// (ranks_per_host), so the reference relays across hosts as the library does. The same on
// every rank of g: every rank must pass the same ranks_per_host and seed.
struct MaskedHostProblems {
  Case c;
  std::vector<Problem> problems;
};
inline MaskedHostProblems masked_host_problems(const Group& g, int ranks_per_host, uint64_t seed) {
  MaskedHostProblems out;
  Case& c = out.c;
  c.experts = 4 * g.size();
  c.hidden = 64;
  c.capacity = 16;
  c.topk = 4;
  c.layout = Layout::kLatency;
  c.dtype = DType::kBF16;
  for (uint64_t i = 0; i < 4; ++i) {
    const std::vector<int64_t> tokens(static_cast<size_t>(g.size()), 16);
    out.problems.push_back(make_problem(g.size(), c.experts, c.hidden, c.dtype, tokens, c.topk,
                                        Routing::kUniform, seed + i));
    out.problems.back().ranks_per_host = ranks_per_host;
  }
  return out;
}

// A barrier, one allgather per size in `sizes` whose every byte is checked against a formula of
// (rank, salt, size, byte) -- so a contribution of another call, another size or another rank
// cannot pass -- then a barrier. Empty when right, else what was wrong (an error thrown by a
// call included). Collective: every rank of g passes the same sizes and salt.
inline std::string allgathers_right(Group& g, const std::vector<size_t>& sizes, int salt) {
  try {
    g.barrier();
    for (size_t k = 0; k < sizes.size(); ++k) {
      const size_t n = sizes[k];
      const auto byte = [&](int r, size_t i) {
        return static_cast<char>((r * 131 + salt * 13 + static_cast<int>(k) * 17 +
                                  static_cast<int>(n % 7) + static_cast<int>(i % 241)) &
                                 0xff);
      };
      std::vector<char> in(n), out(n * static_cast<size_t>(g.size()));
      for (size_t i = 0; i < n; ++i) in[i] = byte(g.rank(), i);
      g.allgather(in.data(), out.data(), n);
      for (int r = 0; r < g.size(); ++r)
        for (size_t i = 0; i < n; ++i)
          if (out[static_cast<size_t>(r) * n + i] != byte(r, i))
            return detail::concat("allgather ", k, " of ", n, " bytes: rank ", r, "'s byte ", i,
                                  " is wrong");
    }
    g.barrier();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace ubep::test
