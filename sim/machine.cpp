#include "sim/machine.hpp"

#include <algorithm>

#include "ubep/error.hpp"

namespace ubep::sim {

Machine::Machine(const Preset& preset, Network& net, int workers_per_rank)
    : preset_(preset), workers_(workers_per_rank) {
  const auto& topo = preset.topology;
  const int R = topo.ranks();
  UBEP_CHECK_ARG(workers_ >= 1, "workers per rank must be >= 1, got ", workers_);
  UBEP_CHECK_ARG(static_cast<int>(preset.port_of_level.size()) == topo.num_levels(),
                 "port_of_level has ", preset.port_of_level.size(), " entries for ",
                 topo.num_levels(), " levels");
  ports_ = 1 + *std::max_element(preset.port_of_level.begin(), preset.port_of_level.end());
  // A port's bandwidth is the largest of its levels' (levels of one port share one link).
  std::vector<double> port_bw(static_cast<size_t>(ports_), 0.0);
  for (int l = 1; l < topo.num_levels(); ++l) {
    auto& bw = port_bw[static_cast<size_t>(preset.port_of_level[static_cast<size_t>(l)])];
    bw = std::max(bw, topo.level(l).bandwidth_gbps);
  }
  const double worker_bw = preset.cost.worker_GBps;
  for (int r = 0; r < R; ++r) {
    for (int w = 0; w < workers_; ++w) worker_link_.push_back(net.add_link(worker_bw));
    local_link_.push_back(net.add_link(topo.level(0).bandwidth_gbps));
    for (int p = 0; p < ports_; ++p) {
      const double bw = port_bw[static_cast<size_t>(p)] > 0 ? port_bw[static_cast<size_t>(p)] : 1.0;
      tx_.push_back(net.add_link(bw));
      rx_.push_back(net.add_link(bw));
    }
  }
  for (int l = 0; l < topo.num_levels(); ++l)
    max_latency_ = std::max(max_latency_, topo.level(l).latency_ns);
  scratch_.reserve(4);
}

const std::vector<int>& Machine::path(int src, int worker, int dst) {
  scratch_.clear();
  if (worker >= 0) scratch_.push_back(worker_link_[static_cast<size_t>(src * workers_ + worker)]);
  const int level = preset_.topology.level_between(src, dst);
  if (level == 0) {
    scratch_.push_back(local_link_[static_cast<size_t>(src)]);
  } else {
    const int port = preset_.port_of_level[static_cast<size_t>(level)];
    scratch_.push_back(tx_[static_cast<size_t>(src * ports_ + port)]);
    scratch_.push_back(rx_[static_cast<size_t>(dst * ports_ + port)]);
  }
  return scratch_;
}

}  // namespace ubep::sim
