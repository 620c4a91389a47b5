// Discrete-event core of ubep-sim: a time-ordered event queue and a fluid network whose links
// are shared by the flows crossing them.
//
// Time is in nanoseconds (double). Events with equal times run in the order they were
// scheduled (a sequence number breaks ties), so a simulation is deterministic.
//
// Bandwidth sharing: every flow crosses a short path of links (worker engine, sender port,
// receiver port...). Rates are the exact max-min fair allocation (progressive filling: raise
// every flow's rate together; a link that fills freezes its flows; capacity a flow held back
// elsewhere cannot use goes to the others). The solution is recomputed once per instant at which
// flows start or finish (Network::resolve, before the clock advances), and only where it can
// change (see engine.cpp: flows slower than the change's threshold keep their rates, and only
// the component of faster flows that touches a changed link is refilled).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace ubep::sim {

using Action = std::function<void()>;

class Network;

class EventQueue {
 public:
  double now() const { return now_; }
  // Runs `action` at absolute time `at` (>= now()).
  void at(double at, Action action);
  // Runs `action` at now() + delay. Events with the same delay come in time order: they go to
  // a lane (a FIFO) of that delay instead of the heap, when one is free.
  void after(double delay, Action action);
  // Runs events until none is left. Returns the time of the last one.
  double run();
  uint64_t executed() const { return executed_; }
  // A flow's finish check on the attached network, without a closure (the hot event of large
  // runs).
  void at_flow_check(double at, int flow, uint32_t version);
  // The network whose rates run() brings up to date before the clock advances (one per queue).
  void attach(Network* net) { net_ = net; }

 private:
  // The heap holds 24-byte keys, not closures: sifting moves them, and a 32-byte std::function
  // in every entry made sifting a fifth of a large run's time. A flow check carries its flow
  // and version in the key; any other event names its closure's slot in actions_.
  struct Event {
    double time;
    uint64_t seq;
    uint32_t version;  // flow check: the flow's version; else unused
    int flow;          // >= 0: a flow check of net_; < 0: closure slot -1 - flow
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };
  void push(const Event& e);
  Event pop();
  int slot_for(Action action);
  // Takes the next event out (false: none left).
  bool next(Event& e);
  bool pending_now() const;
  void place(size_t i, const Event& e);  // heap_[i] = e, and the flow's position
  void sift_up(size_t i, const Event& e);
  void sift_down(size_t i, const Event& e);
  // A binary min-heap that knows where each flow's check is (pos_[flow], -1: none): a flow has
  // at most one pending check, moved in place when it is rescheduled earlier.
  std::vector<Event> heap_;
  std::vector<int> pos_;
  // Closures for now_ (zero delay), in sequence order: ready_[ready_head_..] are pending.
  std::vector<Event> ready_;
  size_t ready_head_ = 0;
  // Lanes: the closures scheduled with one fixed delay (an item's issue time, a pair's latency).
  // now() never decreases and rounding is monotonic, so now() + delay does not either: a lane
  // is in (time, sequence) order as it fills, and its front competes with the heap's and the
  // ready FIFO's by the same order, so the events run exactly as from one heap, but the
  // heap holds only flow checks and odd delays (2 of the ~3.6 heap events per ubep item were
  // lane events; pops were 10% of a 256-die call, perf). A lane that runs empty is reused.
  struct Lane {
    double delay = 0;
    size_t head = 0;
    std::vector<Event> events;
  };
  static constexpr int kLanes = 4;
  Lane lanes_[kLanes];
  int lanes_used_ = 0;
  std::vector<Action> actions_;
  std::vector<int> free_actions_;
  Network* net_ = nullptr;
  double now_ = 0;
  uint64_t seq_ = 0;
  uint64_t executed_ = 0;
};

// Links and flows over an EventQueue. A flow starts draining its bytes at once; when the last
// byte has drained, `done` runs after the flow's extra latency (propagation + switching).
class Network {
 public:
  explicit Network(EventQueue& q) : q_(q) { q_.attach(this); }
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // capacity in bytes per nanosecond (= GB/s).
  int add_link(double capacity_bytes_per_ns);
  int link_count() const { return static_cast<int>(links_.size()); }
  double link_capacity(int link) const { return links_[static_cast<size_t>(link)].capacity; }
  // Bytes that crossed `link` so far (for utilisation and tests).
  double link_bytes(int link) const;

  // Starts a flow of `bytes` over `path` (link ids, no duplicates, at most 4). `done` runs at
  // drain time + latency_ns. A zero-byte flow just waits latency_ns.
  // `home` (optional): the id the flow takes if it is free, below the count given to
  // reserve_homes (e.g. the sending worker's slot: its flows follow each other). See homes_.
  void start_flow(const std::vector<int>& path, double bytes, double latency_ns, Action done,
                  int home = -1);
  // Ids [0, n) are taken only as homes; call before the first flow starts.
  void reserve_homes(int n);
  uint64_t flows_started() const { return started_; }
  int active_flows() const { return active_; }
  // Flows whose rate was recomputed, over all resolves (the cost of the incremental solver).
  uint64_t flows_refilled() const { return refilled_; }
  uint64_t resolves() const { return resolves_; }
  // A hash of every flow's finish, in order (its time's bits and first link): two runs with the
  // same trace finished the same flows at the same times, to the bit. How a solver change that
  // claims to be exact is checked (ubep-sim bench prints it).
  uint64_t trace() const { return trace_; }

  // Recomputes the max-min rates after the starts and finishes of this instant (EventQueue::run
  // calls it before the clock moves on).
  bool dirty() const { return dirty_ && !deferred_; }
  void resolve();
  // Called when an instant with changes ends: resolves now, or with a quantum > 0 at most once
  // per `quantum` ns (the changes in between wait for the next resolve: a started flow sends
  // nothing and a finished flow's capacity stays unused until then). An approximation whose
  // error tests/sim/test_maxmin.cpp bounds; 0 (the default) is the exact model. The deferred
  // resolve back-dates its rates (a started flow's to its start, the others' to the mean time
  // of the changes it answers: Network::backdate), which removes most of the delay's bias.
  void end_instant();
  void set_resolve_quantum(double ns) { quantum_ = ns; }

 private:
  struct Link {
    double capacity;
    double bytes = 0;        // of the flows that finished (link_bytes adds the active ones')
    std::vector<int> flows;  // active flow ids (unordered)
  };
  // What the solver reads and writes per link and per flow, apart from Link and Flow: a resolve
  // reaches thousands of flows in link order, i.e. at random, and reading them from 128-byte
  // Flows and 64-byte Links made it a walk through L3 (perf: most of its time on two loads).
  struct LinkState {
    double residual = 0;  // capacity left to the unfrozen flows of the component
    int unfrozen = 0;     // unfrozen component flows crossing the link
    int fresh = 0;        // flows started on it since the last resolve (no rate yet)
    uint64_t mark = 0;    // resolve epoch that reached it
  };
  // A flow's links split in two: `shared` (crossed by other flows too; -1 ends the list), which
  // the solver walks, and the links it crosses alone (a worker's own copy engine), which are
  // only caps on its rate: of those only the one that fills first matters, `cap_link`, least
  // (capacity, id), the key its link had in the solver's heap.
  struct FlowState {
    double key = 0;     // the rate; +inf: started in this instant, no rate yet
    double cap = 0;     // capacity of cap_link
    uint32_t mark = 0;  // 2 * epoch: in the resolve's component; 2 * epoch + 1: frozen
    int cap_link = -1;  // -1: none
    int shared[4] = {-1, -1, -1, -1};
  };
  struct Flow {
    int path[4];
    int hops = 0;
    bool active = false;
    double rate = 0;       // bytes / ns (0 until its first resolve)
    int slot[4];           // index of this flow in links_[path[h]].flows
    double remaining = 0;  // bytes
    double moved = 0;      // bytes drained so far (onto its links' bytes when it finishes)
    double since = 0;      // time `remaining` was last brought up to date
    double latency = 0;
    uint32_t version = 0;  // bumps when an earlier finish event replaces the pending one
    double due = 0;        // time of the pending finish event
  };
  void settle(Flow& f);                             // bring `remaining` up to now at the old rate
  void set_rate(int id, double rate, double from);  // a changed rate onto the Flow, its check
  void backdate(Flow& f, double old_rate, double from);
  void apply_rates();
  struct RateChange {
    int id;
    double rate;
  };
  std::vector<RateChange> rate_changes_;  // of this resolve, in the solver's order
  friend class EventQueue;
  void check(int id, uint32_t version);  // a flow's pending finish event fired
  void finish(int id);
  void touch(const Flow& f);  // its links changed in this instant
  void split_links(int id);   // FlowState's shared / cap_link from the links' flow counts
  double threshold() const;
  double water_level(const Link& l, int fresh, double bound) const;
  void collect_component(double threshold);
  void fill_component();
  void freeze(int id, double level);
  struct Share {
    double level;  // residual / unfrozen: where the link fills
    int link;
    int flow = -1;  // a flow's cap_link: the flow (the link is not walked)
  };
  bool cap_first();
  static Share pop(std::vector<Share>& heap);
  void sift_front();

  EventQueue& q_;
  std::vector<Link> links_;
  std::vector<Flow> flows_;
  std::vector<LinkState> lstate_;  // [link]
  std::vector<FlowState> fstate_;  // [flow]
  // Each flow's completion, apart from Flow: the solver walks flows_ for every refilled flow, and
  // a 32-byte closure there would only dilute the cache lines it reads.
  std::vector<Action> done_;
  std::vector<int> free_ids_;  // ids >= homes_ only
  // Flow ids are labels (nothing is ordered by them), but they place the solver's per-flow
  // state: with a home per sending worker, the flows a sender's port carries sit in
  // neighbouring FlowStates instead of wherever a freed id was (the walk and the filling were
  // mostly waiting on those random reads, perf).
  int homes_ = 0;
  uint64_t started_ = 0, refilled_ = 0, resolves_ = 0, trace_ = 0xcbf29ce484222325ull;
  int active_ = 0;
  // The instant's changes: links whose flow set changed, the slowest finished flow's rate, the
  // flows started.
  bool dirty_ = false;
  bool deferred_ = false;  // a resolve is scheduled at last_resolve_ + quantum_
  double quantum_ = 0, last_resolve_ = -std::numeric_limits<double>::infinity();
  // The instants with changes since the last resolve (count, sum of times, the last one): the
  // deferred resolve's rates apply from their mean.
  int change_instants_ = 0;
  double change_time_sum_ = 0, last_change_ = -1;
  std::vector<int> changed_links_;
  double finished_min_rate_ = std::numeric_limits<double>::infinity();
  uint64_t epoch_ = 0;
  uint32_t flow_epoch_ = 0;  // FlowState::mark's epoch (restarts, with every mark, on overflow)
  std::vector<int> comp_flows_, comp_links_;  // scratch of resolve
  std::vector<Share> heap_, caps_;  // scratch of resolve, kept to avoid one allocation per resolve
  Share caps_min_{};                // the first of caps_ in heap order
  bool caps_live_ = false;          // caps_ is a heap of the single-flow links still unfrozen
};

}  // namespace ubep::sim
