#include "ep/reducer.hpp"

namespace ubep::ep {

TokenReducer::TokenReducer(const Group& g, const BufferConfig& cfg, backend::DataPath& dp,
                           const Window& win, const Waiter& waiter, HostRelay* relay)
    : grp_(g),
      dp_(dp),
      waiter_(waiter),
      relay_(relay),
      rank_(g.rank()),
      ranks_(g.size()),
      H_(cfg.hidden),
      cdtype_(combine_dtype(cfg)),
      row_bytes_(win.row_bytes()),
      y_(static_cast<size_t>(cfg.max_tokens_per_rank) * win.row_bytes()),
      part_(static_cast<size_t>(cfg.hidden)),
      acc_(static_cast<size_t>(dp.members()) * static_cast<size_t>(cfg.hidden)) {}

void TokenReducer::begin(const DispatchCall& call) {
  // Only the fused reduction (one host) prefetches at all.
  timing_ = !relay_ && ranks_ <= kMaxFusedRows && call.layout() == Layout::kThroughput;
  prefetch_sequential_ =
      timing_ &&
      prefetch_tuner_.second(static_cast<size_t>(call.routing().num_tokens) * row_bytes_);
}

void TokenReducer::reduced(double own_us) {
  if (timing_) prefetch_tuner_.record(own_us);
  timing_ = false;
}

const float* TokenReducer::remote_partial(int h, int64_t t) {
  if (!relay_->partial(h, t)) return nullptr;
  waiter_.wait_for([&] { return relay_->combine_partial_arrived(h); }, true,
                   [&] { return detail::concat("combine partials from host ", h); });
  return relay_->partial(h, t);
}

}  // namespace ubep::ep
