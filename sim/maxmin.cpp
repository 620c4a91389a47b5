// The max-min solver of Network: progressive filling over the part of the network an instant's
// starts and finishes can change.
//
// Why the restriction is exact. Progressive filling raises every flow's rate together; a link
// whose capacity runs out freezes the flows crossing it at the current level. So a flow's rate is
// the level at which its first link filled, and every link a flow f crosses fills at a level
// >= rate(f). Remove f: every link that filled below rate(f) carries no f and saw the same flows
// frozen at the same levels below it, so it fills at the same level: every flow slower than f
// keeps its rate, and every other flow stays at >= rate(f). Adding f is the same argument read
// backwards: with the rates after the change, a flow slower than f's new rate r' had that rate
// before, and a flow at or above r' was at or above it before. That also pins r' down: f is the
// fastest flow of a full link l* (its bottleneck), so the flows there below r' kept their rates
// and the others are at r', i.e. r' is l*'s water level W(l*), the x with
//   sum over the other flows g of l of min(rate(g), x) + x = capacity(l)
// (old rates); and on every other link of f the same sum at x = r' is <= capacity, so
// r' <= W(l). Hence r' = min over f's links of W(l). Several starts in one instant: a flow
// started earlier in it counts as unbounded (x, not min(rate, x)), which only lowers W, and W
// is only compared with the running threshold, at or below which the earlier changes left
// every rate as it was or raised it to the threshold or more. Applied change by change, the
// instant's threshold
//   theta = min(rates of the flows that finished, W of each link of a flow that started)
// splits the flows: those below theta keep their rates; the rest (the "upper" flows) are the
// max-min solution of the same problem with the lower flows' rates taken off every capacity,
// which is progressive filling started from zero on the upper flows alone (no link fills below
// theta for them). That problem splits into connected components (flows linked by the links
// they share); a component that touches no changed link has the same flows and capacities as
// before, hence the same solution. So only the component reached from the changed links through
// upper flows is refilled. Rounding: theta is lowered by a relative 1e-9, which only admits more
// flows (still exact: the argument holds for any threshold at or below theta).
#include <algorithm>
#include <limits>

#include "sim/engine.hpp"

namespace ubep::sim {

namespace {

// Min-heap order; ties by link id so that runs are deterministic. A function object, not a
// function: the heap algorithms inline it (through a function pointer they did not, and the
// comparisons were a third of the solver's time).
struct Later {
  template <class Share>
  bool operator()(const Share& a, const Share& b) const {
    return a.level != b.level ? a.level > b.level : a.link > b.link;
  }
};

}  // namespace

constexpr double kFresh = std::numeric_limits<double>::infinity();  // key of a started flow

// min(bound, W(l)) for a link that carries `fresh` started flows (unbounded) and the rest at
// their rates (the header's water level).
double Network::water_level(const Link& l, int fresh, double bound) const {
  double at_bound = fresh * bound;
  for (int id : l.flows) {
    const double k = fstate_[static_cast<size_t>(id)].key;
    if (k != kFresh) at_bound += std::min(k, bound);
  }
  if (at_bound <= l.capacity) return bound;  // W(l) >= bound
  // W(l) < bound: raise x from capacity / flows, the rates below x standing, the others at x;
  // x only rises, and stops within one step per distinct rate.
  const int n = static_cast<int>(l.flows.size());
  double x = l.capacity / n;
  for (int step = 0; step <= n; ++step) {
    double below = 0;
    int k = 0;
    for (int id : l.flows) {
      const double r = fstate_[static_cast<size_t>(id)].key;  // kFresh is never below x
      if (r < x) {
        below += r;
        ++k;
      }
    }
    const double next = (l.capacity - below) / (n - k);
    if (!(next > x)) break;
    x = next;
  }
  return std::min(x, bound);
}

double Network::threshold() const {
  double theta = finished_min_rate_;
  // A link's started flows are counted as they start (every one gets its rate in this resolve
  // and cannot finish before it), not by a pass over every changed link's flows (with the
  // resolve quantum, hundreds of links per resolve: 9% of a 768-die call, perf).
  for (int link : changed_links_) {
    const int fresh = lstate_[static_cast<size_t>(link)].fresh;
    if (fresh > 0) theta = water_level(links_[static_cast<size_t>(link)], fresh, theta);
  }
  return theta * (1 - 1e-9);
}

// Breadth-first from the changed links through upper flows. Whether a flow is upper depends on
// the flow alone, so every upper flow on a reached link is in the component: the walk can sum
// each link's residual capacity and count its component flows on the way, with no second pass.
// A link a flow crosses alone is not walked (unless it changed): it is a cap on that flow's
// rate, under the key the link itself had, (capacity, id). The walk keeps only the least of
// those keys; cap_first queues the caps of the flows still unfrozen if the level reaches it.
void Network::collect_component(double theta) {
  ++epoch_;                          // the changed links already carry this epoch (touch)
  if (++flow_epoch_ > 0x7ffffffe) {  // 2 * epoch + 1 must fit FlowState::mark
    for (FlowState& st : fstate_) st.mark = 0;
    flow_epoch_ = 1;
  }
  const uint32_t in_comp = 2 * flow_epoch_;
  comp_links_ = changed_links_;
  comp_flows_.clear();
  caps_.clear();
  caps_min_ = Share{std::numeric_limits<double>::infinity(), -1};
  for (size_t i = 0; i < comp_links_.size(); ++i) {
    const int link = comp_links_[i];
    const Link& l = links_[static_cast<size_t>(link)];
    // In locals, written once: through the LinkState, every flow's update waited on the last
    // one's store (perf: the loop's hottest instructions).
    double residual = l.capacity;
    int unfrozen = 0;
    for (int id : l.flows) {
      FlowState& st = fstate_[static_cast<size_t>(id)];
      if (st.key < theta) {
        residual -= st.key;  // a lower flow: its rate stands
        continue;
      }
      ++unfrozen;
      if (st.mark >= in_comp) continue;
      st.mark = in_comp;
      comp_flows_.push_back(id);
      if (st.cap_link >= 0 && Later{}(caps_min_, Share{st.cap, st.cap_link}))
        caps_min_ = Share{st.cap, st.cap_link, id};
      for (int h = 0; h < 4 && st.shared[h] >= 0; ++h) {
        LinkState& next = lstate_[static_cast<size_t>(st.shared[h])];
        if (next.mark == epoch_) continue;
        next.mark = epoch_;
        comp_links_.push_back(st.shared[h]);
      }
    }
    LinkState& ls = lstate_[static_cast<size_t>(link)];
    ls.residual = residual;
    ls.unfrozen = unfrozen;
  }
}

// Whether the link that fills first is a single-flow link (then it is caps_.front()) rather than
// heap_.front().
bool Network::cap_first() {
  if (!caps_live_ && caps_min_.link >= 0 && (heap_.empty() || !Later{}(caps_min_, heap_.front()))) {
    // The first time a single-flow link could come first: queue only those whose flow is still
    // unfrozen. A frozen flow's link pops with nothing to do, and most of them (a worker's own
    // engine, under a port that bound first) would be popped at the end only to be skipped.
    caps_.erase(std::remove_if(caps_.begin(), caps_.end(),
                               [&](const Share& c) {
                                 return lstate_[static_cast<size_t>(c.link)].unfrozen == 0;
                               }),
                caps_.end());
    const uint32_t unfrozen_mark = 2 * flow_epoch_;
    for (int id : comp_flows_) {
      const FlowState& st = fstate_[static_cast<size_t>(id)];
      if (st.cap_link >= 0 && st.mark == unfrozen_mark)
        caps_.push_back(Share{st.cap, st.cap_link, id});
    }
    std::make_heap(caps_.begin(), caps_.end(), Later{});
    caps_live_ = true;
  }
  return caps_live_ && !caps_.empty() && (heap_.empty() || Later{}(heap_.front(), caps_.front()));
}

Network::Share Network::pop(std::vector<Share>& heap) {
  std::pop_heap(heap.begin(), heap.end(), Later{});
  const Share top = heap.back();
  heap.pop_back();
  return top;
}

// heap_.front()'s level rose: moves it down to its place (one sift, where popping and pushing it
// again took two; the heap holds the same keys either way, so the same link comes first).
void Network::sift_front() {
  std::vector<Share>& heap = heap_;
  const size_t n = heap.size();
  const Share moving = heap.front();
  size_t at = 0;
  for (;;) {
    size_t child = 2 * at + 1;
    if (child >= n) break;
    if (child + 1 < n && Later{}(heap[child], heap[child + 1])) ++child;
    if (!Later{}(moving, heap[child])) break;
    heap[at] = heap[child];
    at = child;
  }
  heap[at] = moving;
}

// Freezes flow `id` at `level`: its shared links lose it, and it gets its rate.
void Network::freeze(int id, double level) {
  FlowState& st = fstate_[static_cast<size_t>(id)];
  ++st.mark;  // 2 * epoch + 1
  for (int h = 0; h < 4 && st.shared[h] >= 0; ++h) {
    LinkState& other = lstate_[static_cast<size_t>(st.shared[h])];
    other.residual -= level;
    --other.unfrozen;
  }
  // The key is the rate (or +inf, no rate yet): most refilled flows keep their rate exactly
  // (two thirds at cm384 256 x 128), and this way they never read their Flow.
  if (level == st.key) return;
  st.key = level;
  rate_changes_.push_back(RateChange{id, level});
}

void Network::fill_component() {
  std::vector<Share>& heap = heap_;
  heap.clear();
  for (int id : comp_links_) {
    const LinkState& l = lstate_[static_cast<size_t>(id)];
    if (links_[static_cast<size_t>(id)].flows.size() == 1) continue;  // its flow's cap_link
    if (l.unfrozen == 1)
      caps_.push_back(Share{l.residual, id});
    else if (l.unfrozen > 1)
      heap.push_back(Share{l.residual / l.unfrozen, id});
  }
  std::make_heap(heap.begin(), heap.end(), Later{});
  // A link with one component flow (a worker's own copy engine) keeps its level until that flow
  // freezes, so it needs no re-keying: a second heap, merged with the first, pops the same keys
  // in the same order, and the main heap stays as small as the number of shared links. That
  // heap is built only when the rising level first reaches the smallest of them (cap_first),
  // from the links whose flow is still unfrozen then: usually a port binds first everywhere
  // and the single-flow links are never ordered at all.
  caps_live_ = false;
  for (const Share& c : caps_)
    if (Later{}(caps_min_, c)) caps_min_ = c;
  // Lazy heap: freezing a flow at level s raises every other link's fill level (residual - s
  // over unfrozen - 1 is >= residual / unfrozen when s <= residual / unfrozen), so a heap key
  // is a lower bound of its link's level. A first key that is stale is re-keyed in place to the
  // link's current level; one that is current is the smallest level of all (every other key
  // is <= its own level and >= this one). This keeps one heap push per link and re-key, not
  // one per frozen flow and link. The loop ends when the last component flow is frozen: the
  // keys still queued then are links whose flows are all frozen (typically every worker's own
  // engine link, which a port bound first), and popping them would change nothing.
  const uint32_t unfrozen_mark = 2 * flow_epoch_;
  size_t unfrozen_flows = comp_flows_.size();
  while (unfrozen_flows > 0 &&
         (!heap.empty() || !caps_.empty() || (!caps_live_ && caps_min_.link >= 0))) {
    Share top;
    const bool from_caps = cap_first();
    if (from_caps) {
      top = pop(caps_);
      if (top.flow >= 0) {  // a flow's own link: fills at its capacity unless the flow froze
        if (fstate_[static_cast<size_t>(top.flow)].mark != unfrozen_mark) continue;
        --unfrozen_flows;
        freeze(top.flow, std::max(top.level, top.level * 1e-12));
        continue;
      }
    } else {
      if (heap.empty()) break;  // not reached: every unfrozen flow has a link still queued
      top = heap.front();
    }
    const Link& link = links_[static_cast<size_t>(top.link)];
    LinkState& l = lstate_[static_cast<size_t>(top.link)];
    if (l.unfrozen == 0) {
      if (!from_caps) pop(heap);
      continue;
    }
    const double now_level = l.residual / l.unfrozen;
    if (now_level > top.level) {  // stale: re-keyed
      if (from_caps) {
        heap.push_back(Share{now_level, top.link});
        std::push_heap(heap.begin(), heap.end(), Later{});
      } else {  // in place
        heap.front().level = now_level;
        sift_front();
      }
      continue;
    }
    if (!from_caps) pop(heap);
    // Rounding can leave a full link a hair below zero; no flow gets a zero rate.
    const double level = std::max(now_level, link.capacity * 1e-12);
    for (int fid : link.flows) {
      if (fstate_[static_cast<size_t>(fid)].mark != unfrozen_mark) continue;
      --unfrozen_flows;
      freeze(fid, level);
    }
  }
}

void Network::end_instant() {
  if (quantum_ <= 0 || q_.now() >= last_resolve_ + quantum_) {
    resolve();
    return;
  }
  deferred_ = true;
  q_.at(last_resolve_ + quantum_, [this] { resolve(); });
}

void Network::resolve() {
  last_resolve_ = q_.now();
  deferred_ = false;
  collect_component(threshold());
  fill_component();
  apply_rates();
  refilled_ += comp_flows_.size();
  ++resolves_;
  for (int link : changed_links_) lstate_[static_cast<size_t>(link)].fresh = 0;
  changed_links_.clear();
  change_instants_ = 0;
  change_time_sum_ = 0;
  last_change_ = -1;
  finished_min_rate_ = std::numeric_limits<double>::infinity();
  dirty_ = false;
}

}  // namespace ubep::sim
