#include "sim/engine.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "ubep/error.hpp"

namespace ubep::sim {

int EventQueue::slot_for(Action action) {
  if (!free_actions_.empty()) {
    const int slot = free_actions_.back();
    free_actions_.pop_back();
    actions_[static_cast<size_t>(slot)] = std::move(action);
    return slot;
  }
  actions_.push_back(std::move(action));
  return static_cast<int>(actions_.size()) - 1;
}

void EventQueue::at(double t, Action action) {
  UBEP_CHECK_ARG(t >= now_, "event scheduled in the past: t=", t, " ns < now=", now_, " ns");
  const Event e{t, seq_++, 0, -1 - slot_for(std::move(action))};
  // An event for now (a zero delay: a flow's completion without latency, a worker resuming at
  // once) is the last of this instant so far: every event already queued for now has an
  // earlier sequence number, so a FIFO beside the heap keeps the order without sifting it.
  if (t == now_) {
    ready_.push_back(e);
    return;
  }
  push(e);
}

void EventQueue::after(double delay, Action action) {
  if (delay > 0) {
    Lane* lane = nullptr;
    for (int i = 0; i < lanes_used_ && !lane; ++i)
      if (lanes_[i].delay == delay) lane = &lanes_[i];
    if (!lane && lanes_used_ < kLanes) {
      lane = &lanes_[lanes_used_++];
      lane->delay = delay;
    }
    for (int i = 0; i < lanes_used_ && !lane; ++i)
      if (lanes_[i].head == lanes_[i].events.size()) {  // empty: takes this delay now
        lane = &lanes_[i];
        lane->delay = delay;
      }
    if (lane) {
      if (lane->head == lane->events.size()) {
        lane->events.clear();
        lane->head = 0;
      }
      lane->events.push_back(Event{now_ + delay, seq_++, 0, -1 - slot_for(std::move(action))});
      return;
    }
  }
  at(now_ + delay, std::move(action));
}

void EventQueue::at_flow_check(double t, int flow, uint32_t version) {
  UBEP_CHECK_ARG(t >= now_, "event scheduled in the past: t=", t, " ns < now=", now_, " ns");
  const Event e{t, seq_++, version, flow};
  if (static_cast<size_t>(flow) >= pos_.size()) pos_.resize(static_cast<size_t>(flow) + 1, -1);
  const int at = pos_[static_cast<size_t>(flow)];
  if (at < 0) {
    push(e);
    return;
  }
  // The flow's pending check is superseded (it sped up): its key moves, no second entry. The
  // old entry would only have popped to be skipped, as half of a large run's events did.
  if (Later{}(heap_[static_cast<size_t>(at)], e))
    sift_up(static_cast<size_t>(at), e);
  else
    sift_down(static_cast<size_t>(at), e);
}

void EventQueue::place(size_t i, const Event& e) {
  heap_[i] = e;
  if (e.flow >= 0) pos_[static_cast<size_t>(e.flow)] = static_cast<int>(i);
}

void EventQueue::sift_up(size_t i, const Event& e) {
  while (i > 0) {
    const size_t parent = (i - 1) / 2;
    if (!Later{}(heap_[parent], e)) break;
    place(i, heap_[parent]);
    i = parent;
  }
  place(i, e);
}

void EventQueue::sift_down(size_t i, const Event& e) {
  const size_t n = heap_.size();
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && Later{}(heap_[child], heap_[child + 1])) ++child;
    if (!Later{}(e, heap_[child])) break;
    place(i, heap_[child]);
    i = child;
  }
  place(i, e);
}

void EventQueue::push(const Event& e) {
  heap_.emplace_back();
  sift_up(heap_.size() - 1, e);
}

// Takes the first event out: the hole at the top goes down to a leaf along the earlier children,
// and the last entry fills it from there (fewer comparisons than sifting the last entry down
// from the top: it usually belongs near the bottom).
EventQueue::Event EventQueue::pop() {
  const Event top = heap_.front();
  if (top.flow >= 0) pos_[static_cast<size_t>(top.flow)] = -1;
  const Event last = heap_.back();
  heap_.pop_back();
  const size_t n = heap_.size();
  if (n == 0) return top;
  size_t hole = 0;
  for (;;) {
    size_t child = 2 * hole + 1;
    if (child >= n) break;
    if (child + 1 < n && Later{}(heap_[child], heap_[child + 1])) ++child;
    place(hole, heap_[child]);
    hole = child;
  }
  sift_up(hole, last);
  return top;
}

// The resolve's rate changes, in the order the solver made them (so the same events get the
// same sequence numbers). Applied after the filling, not during it, so that each flow's record
// can be fetched ahead: a changed flow is a random one of thousands, and the wait for its record
// was two thirds of set_rate's time (perf, 256 x 128).
void Network::apply_rates() {
  const size_t n = rate_changes_.size();
  constexpr size_t kAhead = 8;
  // Exact model: one change instant, now (no back-dating). A deferred resolve: the mean time
  // of the instants it answers.
  const double from = change_instants_ > 0 ? change_time_sum_ / change_instants_ : q_.now();
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n)
      __builtin_prefetch(&flows_[static_cast<size_t>(rate_changes_[i + kAhead].id)]);
    set_rate(rate_changes_[i].id, rate_changes_[i].rate, from);
  }
  rate_changes_.clear();
}

// The next event: the first in (time, sequence) order of the heap's, the ready FIFO's and the
// lanes' fronts (a flow check for now goes to the heap and may come before the FIFO's events).
bool EventQueue::next(Event& e) {
  const Event* best = heap_.empty() ? nullptr : &heap_.front();
  int from = -1;  // -1: the heap, kLanes: ready_, else the lane
  if (ready_head_ < ready_.size() && (!best || Later{}(*best, ready_[ready_head_]))) {
    best = &ready_[ready_head_];
    from = kLanes;
  }
  for (int i = 0; i < lanes_used_; ++i) {
    const Lane& lane = lanes_[i];
    if (lane.head < lane.events.size() && (!best || Later{}(*best, lane.events[lane.head]))) {
      best = &lane.events[lane.head];
      from = i;
    }
  }
  if (!best) return false;
  if (from < 0) {
    e = pop();
  } else if (from == kLanes) {
    e = ready_[ready_head_++];
    if (ready_head_ == ready_.size()) {
      ready_.clear();
      ready_head_ = 0;
    }
  } else {
    e = *best;
    ++lanes_[from].head;
  }
  return true;
}

// Whether an event is queued for now (the instant is not over).
bool EventQueue::pending_now() const {
  if (ready_head_ < ready_.size()) return true;
  if (!heap_.empty() && heap_.front().time <= now_) return true;
  for (int i = 0; i < lanes_used_; ++i) {
    const Lane& lane = lanes_[i];
    if (lane.head < lane.events.size() && lane.events[lane.head].time <= now_) return true;
  }
  return false;
}

double EventQueue::run() {
  for (;;) {
    // Rates change only between instants: every start and finish of this instant is in before
    // the network is solved, so one resolve serves them all.
    if (net_ && net_->dirty() && !pending_now()) {
      net_->end_instant();
      continue;
    }
    Event e;
    if (!next(e)) break;
    now_ = e.time;
    ++executed_;
    if (e.flow >= 0) {
      net_->check(e.flow, e.version);
    } else {
      // Out of the slab before it runs: the action may schedule events that reuse the slot.
      const int slot = -1 - e.flow;
      Action action = std::move(actions_[static_cast<size_t>(slot)]);
      free_actions_.push_back(slot);
      action();
    }
  }
  return now_;
}

int Network::add_link(double capacity) {
  UBEP_CHECK_ARG(capacity > 0, "link capacity must be > 0 bytes/ns, got ", capacity);
  links_.push_back(Link{capacity, 0, {}});
  lstate_.emplace_back();
  return static_cast<int>(links_.size()) - 1;
}

double Network::link_bytes(int link) const {
  const Link& l = links_[static_cast<size_t>(link)];
  double bytes = l.bytes;
  for (int id : l.flows) bytes += flows_[static_cast<size_t>(id)].moved;
  return bytes;
}

void Network::settle(Flow& f) {
  const double dt = q_.now() - f.since;
  if (dt > 0 && f.rate > 0) {
    const double moved = std::min(f.remaining, f.rate * dt);
    f.remaining -= moved;
    // Onto the links when the flow finishes: a rate change settles the flow, and writing its
    // links then would touch, per refilled flow, links the solver never reads.
    f.moved += moved;
  }
  f.since = q_.now();
}

// Lazy rescheduling: a rate change that makes the flow finish later keeps the pending (now
// early) event, which re-checks and re-arms itself when it fires; only a flow that speeds up
// needs a new event. Under churn this avoids one heap push per flow per change.
void Network::set_rate(int id, double rate, double from) {
  Flow& f = flows_[static_cast<size_t>(id)];
  const double old_rate = f.rate;
  const double born = f.since;  // a flow with no rate yet was never settled: its start
  settle(f);
  f.rate = rate;
  if (from < q_.now()) backdate(f, old_rate, old_rate > 0 ? from : born);
  const double due = q_.now() + f.remaining / rate;
  if (f.version != 0 && due >= f.due) return;
  f.due = due;
  q_.at_flow_check(due, id, ++f.version);
}

// A deferred resolve (quantum > 0) comes up to a quantum after the changes it answers; applying
// its rates only from then delays every change by half a quantum on average, and a worker's
// chain of items accumulates the delay (up to 5% of the makespan at 100 ns). Instead the new
// rate counts from `from`: a started flow's start (known exactly), for a flow already running
// the mean time of the changes (which one moved it is not known): the bytes the flow would have
// moved since then at the new rate instead of the old one are added (or, for a flow that
// slowed, taken back). Still an approximation (a link may carry more or less than its capacity
// inside the quantum), but one whose errors have both signs: 5-10x smaller than applying the
// rates late (measured: tests/sim/test_quantum.cpp, docs/sim/MODEL.md), which bounds it.
void Network::backdate(Flow& f, double old_rate, double from) {
  double delta = (f.rate - old_rate) * (q_.now() - from);
  delta = std::max(std::min(delta, f.remaining), -f.moved);
  f.remaining -= delta;
  f.moved += delta;
}

void Network::check(int id, uint32_t version) {
  Flow& f = flows_[static_cast<size_t>(id)];
  if (!f.active || f.version != version) return;  // superseded by an earlier event
  settle(f);
  // Relative tolerance: floating-point residue of a flow that is, in fact, done.
  if (f.remaining / f.rate > 1e-6) {
    f.due = q_.now() + f.remaining / f.rate;
    q_.at_flow_check(f.due, id, ++f.version);
    return;
  }
  finish(id);
}

void Network::touch(const Flow& f) {
  dirty_ = true;
  if (q_.now() != last_change_) {
    last_change_ = q_.now();
    ++change_instants_;
    change_time_sum_ += last_change_;
  }
  for (int h = 0; h < f.hops; ++h) {
    LinkState& l = lstate_[static_cast<size_t>(f.path[h])];
    if (l.mark == epoch_ + 1) continue;  // epoch_ + 1: the coming resolve's epoch
    l.mark = epoch_ + 1;
    changed_links_.push_back(f.path[h]);
  }
}

void Network::reserve_homes(int n) {
  UBEP_CHECK_ARG(n >= 0 && flows_.empty(), "reserve_homes(", n, ") after flows started");
  homes_ = n;
  flows_.resize(static_cast<size_t>(n));
  done_.resize(static_cast<size_t>(n));
  fstate_.resize(static_cast<size_t>(n));
}

void Network::start_flow(const std::vector<int>& path, double bytes, double latency_ns, Action done,
                         int home) {
  UBEP_CHECK_ARG(path.size() <= 4, "flow path longer than 4 links: ", path.size());
  UBEP_CHECK_ARG(bytes >= 0 && latency_ns >= 0, "negative flow bytes ", bytes, " or latency ",
                 latency_ns);
  for (int link : path) UBEP_CHECK_ARG(link >= 0 && link < link_count(), "unknown link ", link);
  ++started_;
  if (bytes == 0 || path.empty()) {
    q_.after(latency_ns, std::move(done));
    return;
  }
  int id;
  if (home >= 0 && home < homes_ && !flows_[static_cast<size_t>(home)].active) {
    id = home;
  } else if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<int>(flows_.size());
    flows_.emplace_back();
    done_.emplace_back();
    fstate_.emplace_back();
  }
  Flow& f = flows_[static_cast<size_t>(id)];
  f.hops = static_cast<int>(path.size());
  for (int h = 0; h < f.hops; ++h) {
    f.path[h] = path[static_cast<size_t>(h)];
    auto& on_link = links_[static_cast<size_t>(f.path[h])].flows;
    f.slot[h] = static_cast<int>(on_link.size());
    on_link.push_back(id);
    ++lstate_[static_cast<size_t>(f.path[h])].fresh;        // maxmin.cpp's threshold
    if (on_link.size() == 2) split_links(on_link.front());  // no longer its alone
  }
  split_links(id);
  // +inf: no rate yet, above any threshold (maxmin.cpp); the mark of no epoch.
  fstate_[static_cast<size_t>(id)].key = std::numeric_limits<double>::infinity();
  fstate_[static_cast<size_t>(id)].mark = 0;
  f.remaining = bytes;
  f.moved = 0;
  f.rate = 0;
  f.version = 0;
  f.due = 0;
  f.since = q_.now();
  f.latency = latency_ns;
  f.active = true;
  done_[static_cast<size_t>(id)] = std::move(done);
  ++active_;
  touch(f);
}

void Network::split_links(int id) {
  const Flow& f = flows_[static_cast<size_t>(id)];
  FlowState& st = fstate_[static_cast<size_t>(id)];
  st.cap_link = -1;
  int n = 0;
  for (int h = 0; h < f.hops; ++h) {
    const int link = f.path[h];
    const Link& l = links_[static_cast<size_t>(link)];
    if (l.flows.size() > 1) {
      st.shared[n++] = link;
      continue;
    }
    const double cap = st.cap_link < 0 ? 0 : st.cap;
    if (st.cap_link < 0 || l.capacity < cap || (l.capacity == cap && link < st.cap_link)) {
      st.cap_link = link;
      st.cap = l.capacity;
    }
  }
  for (; n < 4; ++n) st.shared[n] = -1;
}

void Network::finish(int id) {
  Flow& f = flows_[static_cast<size_t>(id)];
  f.active = false;
  --active_;
  for (int h = 0; h < f.hops; ++h) {
    links_[static_cast<size_t>(f.path[h])].bytes += f.moved;
    auto& on_link = links_[static_cast<size_t>(f.path[h])].flows;
    const int moved = on_link.back();
    on_link[static_cast<size_t>(f.slot[h])] = moved;
    on_link.pop_back();
    if (moved != id) {  // the moved flow's slot on this link
      Flow& m = flows_[static_cast<size_t>(moved)];
      for (int k = 0; k < m.hops; ++k)
        if (m.path[k] == f.path[h]) m.slot[k] = f.slot[h];
    }
    if (on_link.size() == 1) split_links(on_link.front());  // now its alone
  }
  finished_min_rate_ = std::min(finished_min_rate_, f.rate);
  uint64_t bits;
  const double now = q_.now();
  std::memcpy(&bits, &now, sizeof bits);
  trace_ = (trace_ ^ bits ^ (static_cast<uint64_t>(f.path[0]) << 52)) * 0x100000001b3ull;
  touch(f);
  Action done = std::move(done_[static_cast<size_t>(id)]);
  if (id >= homes_) free_ids_.push_back(id);
  q_.after(f.latency, std::move(done));
}

}  // namespace ubep::sim
