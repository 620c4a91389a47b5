#include "fluid.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ubep/error.hpp"

namespace ubep::sched::detail {

namespace {

// The inputs' shapes and ranges (every stream's item range is checked as it is started).
void check_fluid_args(std::span<const FluidItem> items, std::span<const int32_t> stream_begin,
                      std::span<const double> link_gbps, double cap_gbps, std::span<double> out,
                      std::span<const FluidGroup> groups) {
  UBEP_CHECK_ARG(!stream_begin.empty(), "fluid_finish: stream_begin must have streams + 1 entries");
  const size_t streams = stream_begin.size() - 1;
  UBEP_CHECK_ARG(out.size() == streams, "fluid_finish: out has ", out.size(), " entries for ",
                 streams, " streams");
  UBEP_CHECK_ARG(cap_gbps >= 0, "flow cap must be >= 0 GB/s (0 = uncapped), got ", cap_gbps);
  for (size_t l = 0; l < link_gbps.size(); ++l)
    UBEP_CHECK_ARG(link_gbps[l] > 0, "link ", l, " bandwidth must be > 0 GB/s, got ", link_gbps[l]);
  for (const FluidItem& it : items) {
    UBEP_CHECK_ARG(it.link >= 0 && static_cast<size_t>(it.link) < link_gbps.size(),
                   "fluid item names link ", it.link, " of ", link_gbps.size());
    UBEP_CHECK_ARG(it.latency_ns >= 0 && it.bytes >= 0, "fluid item with latency ", it.latency_ns,
                   " ns and ", it.bytes, " bytes: both must be >= 0");
    UBEP_CHECK_ARG(it.cap_gbps >= 0, "fluid item cap must be >= 0 GB/s (0 = none), got ",
                   it.cap_gbps);
    UBEP_CHECK_ARG(it.group >= -1 && it.group < static_cast<int64_t>(groups.size()),
                   "fluid item names receiver group ", it.group, " of ", groups.size());
  }
  for (const FluidGroup& g : groups)
    UBEP_CHECK_ARG(g.bytes > 0 && g.floor_ns > 0, "fluid receiver group with ", g.bytes,
                   " bytes over ", g.floor_ns, " ns: both must be > 0");
}

// One stream's progress through its items.
struct Stream {
  int32_t next;  // next item to issue
  int32_t end;
  int32_t link;  // link of the item being issued
  double latency_ns;
  double bytes_left;
  double cap;      // min(stream cap, the item's cap)
  double cap_now;  // cap, or the item's share of its saturated receiver group's slope
  int32_t group;   // receiver group of the item being issued, -1 = none
  bool active;
};

// Starts the stream's next item with bytes at time t; items without bytes complete at once
// (t + latency, into finish). Marks the stream idle when it has nothing left to issue.
void start_next(Stream& x, std::span<const FluidItem> items, double cap, double t, double& finish) {
  while (x.next < x.end) {
    const FluidItem& it = items[static_cast<size_t>(x.next++)];
    if (it.bytes <= 0) {
      finish = std::max(finish, t + it.latency_ns);
      continue;
    }
    x.link = it.link;
    x.latency_ns = it.latency_ns;
    x.bytes_left = it.bytes;
    x.cap = it.cap_gbps > 0 ? std::min(cap, it.cap_gbps) : cap;
    x.cap_now = x.cap;
    x.group = it.group;
    x.active = true;
    return;
  }
  x.active = false;
}

// Shares every link max-min fairly among the streams issuing on it (water-filling: in ascending
// order of their caps, each takes min(its cap, what is left / streams left)) into rate, and
// returns the time to the next issue end among all streams, that stream in first. order is
// scratch.
double next_issue_end(std::span<const Stream> st, std::span<const double> link_gbps,
                      std::span<size_t> order, std::span<double> rate, size_t& first) {
  size_t n = 0;
  for (size_t s = 0; s < st.size(); ++s)
    if (st[s].active) order[n++] = s;
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), [&](size_t a, size_t b) {
    if (st[a].link != st[b].link) return st[a].link < st[b].link;
    return st[a].cap_now < st[b].cap_now;
  });
  for (size_t b = 0, e; b < n; b = e) {
    const int32_t link = st[order[b]].link;
    e = b;
    while (e < n && st[order[e]].link == link) ++e;
    double left = link_gbps[static_cast<size_t>(link)];
    for (size_t i = b; i < e; ++i) {
      rate[order[i]] = std::min(st[order[i]].cap_now, left / static_cast<double>(e - i));
      left -= rate[order[i]];
    }
  }
  double dt = std::numeric_limits<double>::infinity();
  first = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t s = order[i];
    if (st[s].bytes_left / rate[s] < dt) {
      dt = st[s].bytes_left / rate[s];
      first = s;
    }
  }
  return dt;
}

// One receiver group's progress: bytes delivered so far, and its streams' rate sum this step.
struct GroupState {
  double sent = 0;
  double rate = 0;
  int active = 0;
  bool saturated = false;
};

// Marks each group saturated when its delivered bytes reached the envelope bytes * t / floor
// before floor (relative tolerance, as for issue ends), and caps the streams of a saturated group
// at an equal share of its slope: together they then follow the envelope.
void apply_groups(std::span<Stream> st, std::span<const FluidGroup> groups,
                  std::span<GroupState> gs, double t) {
  for (auto& g : gs) g.active = 0;
  for (const Stream& x : st)
    if (x.active && x.group >= 0) ++gs[static_cast<size_t>(x.group)].active;
  for (size_t g = 0; g < groups.size(); ++g) {
    const FluidGroup& fg = groups[g];
    const double env = fg.bytes * std::min(1.0, t / fg.floor_ns);
    gs[g].saturated = gs[g].active > 0 && t < fg.floor_ns && gs[g].sent >= env - 1e-9 * fg.bytes;
  }
  for (Stream& x : st) {
    x.cap_now = x.cap;
    if (!x.active || x.group < 0) continue;
    const auto g = static_cast<size_t>(x.group);
    if (gs[g].saturated)
      x.cap_now = std::min(x.cap, groups[g].bytes / groups[g].floor_ns / gs[g].active);
  }
}

// Time until an unsaturated group, sending faster than its envelope's slope, reaches it.
double next_saturation(std::span<const Stream> st, std::span<const double> rate,
                       std::span<const FluidGroup> groups, std::span<GroupState> gs, double t) {
  for (auto& g : gs) g.rate = 0;
  for (size_t s = 0; s < st.size(); ++s)
    if (st[s].active && st[s].group >= 0) gs[static_cast<size_t>(st[s].group)].rate += rate[s];
  double dt = std::numeric_limits<double>::infinity();
  for (size_t g = 0; g < groups.size(); ++g) {
    const double slope = groups[g].bytes / groups[g].floor_ns;
    if (gs[g].saturated || t >= groups[g].floor_ns || gs[g].rate <= slope * (1 + 1e-12)) continue;
    const double gap = std::max(0.0, slope * t - gs[g].sent);
    dt = std::min(dt, gap / (gs[g].rate - slope));
  }
  return dt;
}

}  // namespace

void fluid_finish(std::span<const FluidItem> items, std::span<const int32_t> stream_begin,
                  std::span<const double> link_gbps, double cap_gbps, std::span<double> out,
                  std::span<const FluidGroup> groups) {
  check_fluid_args(items, stream_begin, link_gbps, cap_gbps, out, groups);
  const size_t streams = stream_begin.size() - 1;
  const double cap = cap_gbps > 0 ? cap_gbps : std::numeric_limits<double>::infinity();
  std::vector<Stream> st(streams);
  std::vector<size_t> order(streams);
  std::vector<double> rate(streams, 0);
  std::vector<GroupState> gs(groups.size());

  double t = 0;
  for (size_t s = 0; s < streams; ++s) {
    st[s].next = stream_begin[s];
    st[s].end = stream_begin[s + 1];
    UBEP_CHECK_ARG(st[s].next <= st[s].end && static_cast<size_t>(st[s].end) <= items.size(),
                   "fluid_finish: stream ", s, " has a bad item range");
    out[s] = 0;
    start_next(st[s], items, cap, 0, out[s]);
  }
  for (;;) {
    if (std::none_of(st.begin(), st.end(), [](const Stream& x) { return x.active; })) break;
    if (!groups.empty()) apply_groups(st, groups, gs, t);
    size_t first = 0;
    double dt = next_issue_end(st, link_gbps, order, rate, first);
    bool issue_end = true;
    if (!groups.empty()) {
      const double sat = next_saturation(st, rate, groups, gs, t);
      if (sat < dt) {
        dt = sat;
        issue_end = false;
      }
    }
    t += dt;
    for (size_t s = 0; s < streams; ++s) {
      Stream& x = st[s];
      if (!x.active) continue;
      x.bytes_left -= rate[s] * dt;
      if (x.group >= 0) gs[static_cast<size_t>(x.group)].sent += rate[s] * dt;
      // Issue ends are compared with a relative tolerance so that streams finishing together
      // (the common case with equal items) finish in the same event instead of leaving dust.
      if ((issue_end && s == first) || x.bytes_left <= 1e-9 * std::max(1.0, rate[s] * dt)) {
        out[s] = std::max(out[s], t + x.latency_ns);
        start_next(x, items, cap, t, out[s]);
      }
    }
  }
}

}  // namespace ubep::sched::detail
