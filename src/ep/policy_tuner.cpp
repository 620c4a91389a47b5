#include "ep/policy_tuner.hpp"

#include <algorithm>
#include <bit>

namespace ubep::ep {

namespace {

double median(std::array<double, PolicyTuner::kProbes> v) {
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

}  // namespace

bool PolicyTuner::second(size_t size) {
  probing_ = nullptr;
  if (size == 0 || size >= untuned_from_) return false;
  SizeClass& c = classes_[static_cast<size_t>(std::bit_width(size))];
  if (c.warmup_left > 0) {
    --c.warmup_left;
    return false;
  }
  if (c.exploit_left > 0) {
    --c.exploit_left;
    return c.second_wins;
  }
  probing_ = &c;
  return c.probes % 2 == 1;  // even probes take the first policy, odd ones the second
}

void PolicyTuner::record(double us) {
  if (!probing_) return;
  SizeClass& c = *probing_;
  probing_ = nullptr;
  c.samples[static_cast<size_t>(c.probes % 2)][static_cast<size_t>(c.probes / 2)] = us;
  if (++c.probes < 2 * kProbes) return;
  c.second_wins = median(c.samples[1]) < median(c.samples[0]);
  c.exploit_left = c.next_exploit;
  c.next_exploit = std::min(2 * c.next_exploit, kExploitCalls);
  c.probes = 0;
}

}  // namespace ubep::ep
