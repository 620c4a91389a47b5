// Buffer set-up: the config is validated on every rank and the verdicts are agreed in ONE
// collective that every rank enters, whatever its own verdict. A rank that rejected its config
// locally therefore never leaves its peers blocked in a later collective (MPI_Allgather would
// wait forever): the rejecting rank throws its own InvalidArgument naming the value, every peer
// throws an InvalidArgument naming the rank that rejected and why. Then the fields that shape
// the window map and the protocol are compared across the group, naming the first that differs.
#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include "backend/factory/factory.hpp"
#include "bootstrap/group_hooks.hpp"
#include "ep/config_agreement.hpp"
#include "protocol/config_checks.hpp"
#include "ubep/error.hpp"
#include "ubep/scheduler.hpp"

namespace ubep::ep {

namespace {

BufferConfig checked(const Group& g, BufferConfig c) {
  protocol::check_buffer_config(c, g.size(), "Buffer");
  if (c.research.schedule != SendSchedule::kEqualSlices && !c.research.topology.empty()) {
    // Parsed again (deterministically) when the scheduler is built; here only to agree on it.
    const sched::Topology topo = sched::parse_topology(c.research.topology, g.size());
    UBEP_CHECK_ARG(topo.ranks() == g.size(), "topology '", c.research.topology, "' has ",
                   topo.ranks(), " ranks, the group ", g.size());
  }
  backend::check_config(c, g.size());  // what the device's backend can serve
  if (c.num_workers < 0) {
    // Cores per rank on this host, minus the caller (which is a team member itself).
    int local = 0;
    for (int r = 0; r < g.size(); ++r) local += g.same_host(r, g.rank());
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    c.num_workers = std::max(0, cores / std::max(1, local) - 1);
  }
  return c;
}

constexpr const char* kFieldNames[] = {"max_tokens_per_rank", "hidden",     "dtype",
                                       "num_experts",         "max_topk",   "enable_latency_layout",
                                       "initial_epoch",       "sync",       "algorithm",
                                       "placement",           "device type"};
constexpr size_t kFields = sizeof kFieldNames / sizeof kFieldNames[0];
constexpr size_t kReasonBytes = 256;

// What one rank contributes to the agreement: its verdict, then the fields every rank must share.
struct Verdict {
  int64_t ok = 0;
  int64_t fields[kFields] = {};
  char reason[kReasonBytes] = {};  // the rejection's message, truncated, NUL-terminated
};

// The fields every rank must share (kFieldNames).
void shared_fields(const BufferConfig& c, int64_t out[kFields]) {
  const int64_t fields[kFields] = {c.max_tokens_per_rank,
                                   c.hidden,
                                   static_cast<int64_t>(c.dtype),
                                   c.num_experts,
                                   c.max_topk,
                                   c.enable_latency_layout,
                                   static_cast<int64_t>(c.initial_epoch),
                                   static_cast<int64_t>(c.research.sync),
                                   static_cast<int64_t>(c.algorithm),
                                   static_cast<int64_t>(c.placement),
                                   static_cast<int64_t>(c.device.type)};
  std::copy(fields, fields + kFields, out);
}

}  // namespace

uint32_t config_digest(const BufferConfig& c) {
  int64_t fields[kFields];
  shared_fields(c, fields);
  uint32_t h = 2166136261u;  // FNV-1a over the fields' bytes
  for (int64_t f : fields)
    for (int b = 0; b < 8; ++b) h = (h ^ static_cast<uint8_t>(f >> (8 * b))) * 16777619u;
  return h == 0 ? 1 : h;  // 0: a record without a digest
}

BufferConfig agree_on_config(Group& g, const BufferConfig& requested) {
  // A replacement joins live ranks that are in their calls, not in a set-up collective: its
  // config is checked here, then agreed with the live ranks at its first dispatch through the
  // digest in its membership record (config_digest; a different one is refused, named).
  if (bootstrap::hooks_of(g).mirrors_buffers()) return checked(g, requested);
  Verdict mine;
  BufferConfig c;
  std::exception_ptr rejection;
  try {
    c = checked(g, requested);
    mine.ok = 1;
  } catch (const std::exception& e) {
    rejection = std::current_exception();
    std::strncpy(mine.reason, e.what(), kReasonBytes - 1);
  }
  if (mine.ok) shared_fields(c, mine.fields);
  // Every rank gets here, accepted or not (bounded by the group's timeout on every backend).
  std::vector<Verdict> all(static_cast<size_t>(g.size()));
  g.allgather(&mine, all.data(), sizeof mine);
  if (rejection) std::rethrow_exception(rejection);
  for (int r = 0; r < g.size(); ++r) {
    const Verdict& v = all[static_cast<size_t>(r)];
    UBEP_CHECK_ARG(v.ok, "Buffer: rank ", r, " rejected its config (",
                   std::string(v.reason, strnlen(v.reason, kReasonBytes)),
                   "), so no rank can create this Buffer");
  }
  for (int r = 0; r < g.size(); ++r)
    for (size_t f = 0; f < kFields; ++f)
      UBEP_CHECK_ARG(all[static_cast<size_t>(r)].fields[f] == all[0].fields[f],
                     "Buffer: ranks disagree on ", kFieldNames[f], ": rank 0 has ",
                     all[0].fields[f], ", rank ", r, " has ",
                     all[static_cast<size_t>(r)].fields[f]);
  return c;
}

}  // namespace ubep::ep
