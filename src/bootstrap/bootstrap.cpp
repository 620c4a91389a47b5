#include <unistd.h>

#include <cstring>
#include <map>
#include <string>

#include "ubep/bootstrap.hpp"

namespace ubep {

std::vector<int> Bootstrap::host_map() {
  constexpr size_t kLen = 256;
  char mine[kLen] = {};
  gethostname(mine, kLen - 1);
  std::vector<char> all(static_cast<size_t>(size()) * kLen);
  allgather(mine, all.data(), kLen);
  std::map<std::string, int> ids;
  std::vector<int> hosts(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    const std::string name(&all[static_cast<size_t>(r) * kLen],
                           strnlen(&all[static_cast<size_t>(r) * kLen], kLen));
    auto it = ids.try_emplace(name, static_cast<int>(ids.size())).first;
    hosts[static_cast<size_t>(r)] = it->second;
  }
  return hosts;
}

}  // namespace ubep
