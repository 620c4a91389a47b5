// `calibrate`'s timings of the library's real calls and of two machine properties the local
// preset needs (EXPERIMENTS.md §6.4). The kernel loops of calibrate.cpp approximate what the
// calls do; on a host where the library's own placement (batched fences, prefetch hints) and
// reduction (streamed outputs) differ from those loops, the calibrated rows miss by 30-50%, so
// the rates of the calibrated shapes come from the calls themselves.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ubep::sim {

// One call shape on 2 ranks (threads of this process, sharing memory as ubep-bench's process
// ranks do through shm), hidden 7168 bf16, 256 experts, uniform routing.
struct CallShape {
  int64_t tokens = 128;
  int topk = 8;
  bool latency = true;  // latency layout (else throughput)
  int iters = 30, warmup = 5;
};

// Median over the timed iterations of the slowest rank's time, as ubep-bench reports a call
// (every op alone: a group barrier before and after it; the identity expert in between,
// untimed).
struct CallTimes {
  double bsp_dispatch_us = 0, bsp_combine_us = 0, ubep_dispatch_us = 0, ubep_combine_us = 0;
  // bsp combine's "row send" stage (the plain-store copy into the owners' staging, and the
  // barrier after it): the rest of bsp's combine is its flag round and the staged reduction.
  double bsp_combine_send_us = 0;
  double dispatch_rows = 0;  // rows one rank receives (mean over ranks)
};
CallTimes time_library_calls(const CallShape& shape);

// Effective capacity of the shared last-level cache for data one core writes and then reads
// back, with every core doing the same (the expert step writes the combine rows, the combine
// reads them, half from the peer's buffer): the largest per-core size whose re-read runs within
// 10% of the in-cache rate. Measured, not read from sysfs: on a VM the L3 may be shared with
// other guests' cores, and on a victim L3 its usable part is not its size.
// curve (optional): the measured (bytes per core, GB/s per core) points.
double reuse_capacity_bytes(std::vector<std::pair<double, double>>* curve = nullptr);

// Makespan of `threads` equal CPU-bound threads on this machine's cores, released together, as
// a multiple of one thread's time alone (`work_us` of spinning each): cores / threads share the
// cores fairly (ratio threads / cores), whole threads that run to completion before the next
// gets a core go in rounds (ceil(threads / cores)).
double oversubscribed_makespan_ratio(int threads, double work_us);

}  // namespace ubep::sim
