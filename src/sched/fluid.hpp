// Fluid model of concurrent transfers sharing a sender's links (internal).
//
// Streams (workers) issue their items back to back, all starting at t = 0: an item's bytes go
// out through link `link`, and the item completes `latency_ns` after its last byte left (the
// worker does not wait for it: stores are posted, so latencies overlap with later issues). At
// any moment the streams issuing through link l share its capacity max-min fairly, each at most
// its cap (the stream cap, or its item's own cap when lower): with equal caps that is an equal
// split min(cap, capacity[l] / k); a stream held below its share by a lower cap leaves the
// rest to the others (water-filling). The engine advances from event to event (the next issue
// end), so it is exact for this model.
#pragma once

#include <cstdint>
#include <span>

namespace ubep::sched::detail {

struct FluidItem {
  int32_t link = 0;
  double latency_ns = 0;
  double bytes = 0;
  double cap_gbps = 0;  // this item's own rate limit (0 = none), e.g. its receiver's share
};

// stream_begin has streams + 1 entries: stream s runs items[stream_begin[s] .. stream_begin[s+1]).
// out[s] = finish time of stream s: the latest completion of its items (0 for an empty stream).
void fluid_finish(std::span<const FluidItem> items, std::span<const int32_t> stream_begin,
                  std::span<const double> link_gbps, double cap_gbps, std::span<double> out);

}  // namespace ubep::sched::detail
