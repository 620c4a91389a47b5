// Research knobs of the ubep algorithm: the ablations the papers measure (how a message says it
// is complete, how a rank splits its send work). The defaults are what users want; these exist
// for experiments (docs/EXPERIMENTS.md, docs/SCHEDULING.md) and for the simulator.
#pragma once

#include <cstdint>
#include <string>

namespace ubep {

// How the ubep algorithm tells a reader that a message is complete (the sync ablation).
enum class SyncMode : uint8_t {
  kFused,        // token-flag fusion: epoch tag inside the message, written last (default)
  kStopAndWait,  // data, then a fence, then a separate flag per message
};
const char* sync_mode_name(SyncMode m);
SyncMode parse_sync_mode(const std::string& name);  // "fused" | "stop-and-wait"

// How the ubep algorithm splits a rank's send work among its workers (the scheduling ablation;
// see docs/SCHEDULING.md). Equal slices plan nothing; the others call the hop-aware scheduler
// (ubep/scheduler.hpp) on the call's routing, with far destinations first.
enum class SendSchedule : uint8_t { kEqualSlices, kNaive, kColumnMajor, kBalanced };
const char* send_schedule_name(SendSchedule s);
SendSchedule parse_send_schedule(const std::string& name);  // equal|naive|column_major|balanced

// A Buffer's research knobs (BufferConfig::research): how a message's flag is ordered after its
// data, and how the send work is planned. Every rank must use the same sync mode.
struct ResearchOptions {
  SyncMode sync = SyncMode::kFused;
  SendSchedule schedule = SendSchedule::kEqualSlices;
  // Topology the scheduler plans with: a preset or file for ubep::sched::parse_topology, or ""
  // to discover it (hosts from the group, sockets/NUMA from hwloc).
  std::string topology;
};

}  // namespace ubep
