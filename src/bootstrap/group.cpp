#include <algorithm>

#include "bootstrap/death_watch.hpp"
#include "bootstrap/group_hooks.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

namespace ubep {

Group::Group(int rank, int size, GroupOptions options)
    : rank_(rank), size_(size), options_(options), host_of_(static_cast<size_t>(size), 0) {
  UBEP_CHECK_ARG(size >= 1, "group size must be >= 1, got ", size);
  UBEP_CHECK_ARG(rank >= 0 && rank < size, "rank ", rank, " out of range [0, ", size, ")");
}

void Group::barrier() {
  ++barriers_;
  barrier_impl();
}

bootstrap::GroupHooks& bootstrap::hooks_of(const Group& group) {
  static GroupHooks none;  // stateless: one host, nothing watched, never rejoining
  return group.hooks_ ? *group.hooks_ : none;
}

std::string Group::death_of(int rank) {
  bootstrap::DeathWatch* watch = bootstrap::hooks_of(*this).death_watch();
  return watch && watch->dead(rank) ? watch->how(rank) : std::string();
}

void Group::set_hosts(std::vector<int> host_of) {
  host_of_ = std::move(host_of);
  num_hosts_ = 1 + *std::max_element(host_of_.begin(), host_of_.end());
}

}  // namespace ubep
