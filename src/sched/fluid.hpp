// Fluid model of concurrent transfers sharing a sender's links (internal).
//
// Streams (workers) issue their items back to back, all starting at t = 0: an item's bytes go
// out through link `link`, and the item completes `latency_ns` after its last byte left (the
// worker does not wait for it: stores are posted, so latencies overlap with later issues). At
// any moment the k streams issuing through link l each get min(cap, capacity[l] / k): with
// equal demands, max-min fairness is an equal split, and a cap only lowers it. The engine
// advances from event to event (the next issue end), so it is exact for this model.
#pragma once

#include <cstdint>
#include <span>

namespace ubep::sched::detail {

struct FluidItem {
  int32_t link = 0;
  double latency_ns = 0;
  double bytes = 0;
};

// stream_begin has streams + 1 entries: stream s runs items[stream_begin[s] .. stream_begin[s+1]).
// out[s] = finish time of stream s: the latest completion of its items (0 for an empty stream).
void fluid_finish(std::span<const FluidItem> items, std::span<const int32_t> stream_begin,
                  std::span<const double> link_gbps, double cap_gbps, std::span<double> out);

}  // namespace ubep::sched::detail
