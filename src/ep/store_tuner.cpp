#include "ep/store_tuner.hpp"

#include <algorithm>
#include <bit>

namespace ubep::ep {

namespace {

double median(std::array<double, StoreTuner::kProbes> v) {
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

}  // namespace

bool StoreTuner::stream(size_t peer_bytes) {
  probing_ = nullptr;
  if (peer_bytes == 0 || peer_bytes >= kAlwaysStreamBytes) return true;
  SizeClass& c = classes_[static_cast<size_t>(std::bit_width(peer_bytes))];
  if (c.warmup_left > 0) {
    --c.warmup_left;
    return true;
  }
  if (c.exploit_left > 0) {
    --c.exploit_left;
    return !c.plain_wins;
  }
  probing_ = &c;
  return c.probes % 2 == 0;  // even probes stream, odd ones store plainly
}

void StoreTuner::record(double own_us) {
  if (!probing_) return;
  SizeClass& c = *probing_;
  probing_ = nullptr;
  c.samples[static_cast<size_t>(c.probes % 2)][static_cast<size_t>(c.probes / 2)] = own_us;
  if (++c.probes < 2 * kProbes) return;
  c.plain_wins = median(c.samples[1]) < median(c.samples[0]);
  c.exploit_left = c.next_exploit;
  c.next_exploit = std::min(2 * c.next_exploit, kExploitCalls);
  c.probes = 0;
}

}  // namespace ubep::ep
