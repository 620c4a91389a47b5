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
//
// Receiver groups (issue 30): the items of one group go to one receiver-bound destination d,
// whose port drains every source's traffic into d over floor_ns; this source's share of it is
// `bytes` (all of its items to d). The port is work-conserving over time, so the source's
// delivered bytes into d are bounded by the envelope min(bytes, bytes * t / floor_ns), not each
// item's rate: a worker that reaches d late finds the credit the others left and sends at its
// sender's rate, while workers hitting d together share the envelope's slope. The sum of every
// source's envelope is the port's bandwidth times t, so no plan is charged more than the port
// can carry in aggregate. (The former per-item cap bytes / floor_ns charged every slice of a
// spread destination as if the source's slices crossed the port one after another: column-major
// at EP256, 8 hot experts at weight 2, predicted 133 us and ran in 93.)
#pragma once

#include <cstdint>
#include <span>

namespace ubep::sched::detail {

struct FluidItem {
  int32_t link = 0;
  double latency_ns = 0;
  double bytes = 0;
  double cap_gbps = 0;  // this item's own rate limit (0 = none)
  int32_t group = -1;   // receiver group (index into the groups span), -1 = none
};

struct FluidGroup {
  double bytes = 0;     // the source's bytes into the destination (> 0)
  double floor_ns = 0;  // time the destination's port needs for every source's bytes (> 0)
};

// stream_begin has streams + 1 entries: stream s runs items[stream_begin[s] .. stream_begin[s+1]).
// out[s] = finish time of stream s: the latest completion of its items (0 for an empty stream).
void fluid_finish(std::span<const FluidItem> items, std::span<const int32_t> stream_begin,
                  std::span<const double> link_gbps, double cap_gbps, std::span<double> out,
                  std::span<const FluidGroup> groups = {});

}  // namespace ubep::sched::detail
