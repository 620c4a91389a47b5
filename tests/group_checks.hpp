// Checks of a Group's own collectives, shared by the tests of TCP groups across hosts (issue 32:
// test_tcp_doors, tests/vhosts/tcp_host_loss, tests/vhosts/rejoin_while_cut).
#pragma once

#include <string>
#include <vector>

#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep::test {

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
