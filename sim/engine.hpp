// Discrete-event core of ubep-sim: a time-ordered event queue and a fluid network whose links
// are shared by the flows crossing them.
//
// Time is in nanoseconds (double). Events with equal times run in the order they were
// scheduled (a sequence number breaks ties), so a simulation is deterministic.
//
// Bandwidth sharing: every flow crosses a short path of links (worker engine, sender port,
// receiver port...). A flow's rate is the smallest fair share along its path,
// min over links l of capacity(l) / active_flows(l) ("bottleneck fair share"). This is the
// first step of max-min progressive filling: exact when all flows of a link have the same
// bottleneck (the common case: every flow of a hot receiver is limited by that receiver), and
// conservative otherwise (capacity a flow cannot use is not redistributed). The full max-min
// solution costs O(flows x links) per event; the 256-rank case has ~10^4 concurrent flows and
// ~10^6 events, so we trade that last bit of fidelity for speed (issue 5: < 5 s per call).
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace ubep::sim {

using Action = std::function<void()>;

class Network;

class EventQueue {
 public:
  double now() const { return now_; }
  // Runs `action` at absolute time `at` (>= now()).
  void at(double at, Action action);
  void after(double delay, Action action) { at(now_ + delay, std::move(action)); }
  // Runs events until none is left. Returns the time of the last one.
  double run();
  uint64_t executed() const { return executed_; }
  // A flow's finish check, without allocating a closure (the hot event of large runs).
  void at_flow_check(double at, Network* net, int flow, uint64_t version);

 private:
  struct Event {
    double time;
    uint64_t seq;
    Action action;  // empty for a flow check
    Network* net = nullptr;
    int flow = 0;
    uint64_t version = 0;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  double now_ = 0;
  uint64_t seq_ = 0;
  uint64_t executed_ = 0;
};

// Links and flows over an EventQueue. A flow starts draining its bytes at once; when the last
// byte has drained, `done` runs after the flow's extra latency (propagation + switching).
class Network {
 public:
  explicit Network(EventQueue& q) : q_(q) {}

  // capacity in bytes per nanosecond (= GB/s).
  int add_link(double capacity_bytes_per_ns);
  int link_count() const { return static_cast<int>(links_.size()); }
  double link_capacity(int link) const { return links_[static_cast<size_t>(link)].capacity; }
  // Bytes that crossed `link` so far (for utilisation and tests).
  double link_bytes(int link) const { return links_[static_cast<size_t>(link)].bytes; }

  // Starts a flow of `bytes` over `path` (link ids, no duplicates). `done` runs at
  // drain time + latency_ns. A zero-byte flow just waits latency_ns.
  void start_flow(const std::vector<int>& path, double bytes, double latency_ns, Action done);
  uint64_t flows_started() const { return started_; }
  int active_flows() const { return active_; }

 private:
  struct Link {
    double capacity;
    double bytes = 0;
    std::vector<int> flows;  // active flow ids (unordered)
  };
  struct Flow {
    int path[4];
    int hops = 0;
    double remaining = 0;  // bytes
    double rate = 0;       // bytes / ns
    double since = 0;      // time `remaining` was last brought up to date
    double latency = 0;
    uint64_t version = 0;  // bumps when an earlier finish event replaces the pending one
    double due = 0;        // time of the pending finish event
    bool active = false;
    Action done;
  };
  double fair_rate(const Flow& f) const;
  void settle(Flow& f);     // bring `remaining` up to now at the old rate
  void reschedule(int id);  // recompute rate and finish event
  friend class EventQueue;
  void check(int id, uint64_t version);  // a flow's pending finish event fired
  void finish(int id, uint64_t version);
  void touch_links(const Flow& f, int except);

  EventQueue& q_;
  std::vector<Link> links_;
  std::vector<Flow> flows_;
  std::vector<int> free_ids_;
  uint64_t started_ = 0;
  int active_ = 0;
};

}  // namespace ubep::sim
