// Per-call memory rates of the `local` preset (this machine), from the two shapes `calibrate`
// timed. Each kernel's time is split into the memory streams it drives, each with its own cost
// per byte, so a call whose streams are in other proportions than the calibrated shapes' is
// predicted from the same two measurements (EXPERIMENTS.md §6):
//  * dispatch placement (non-temporal stores, at every call size since the library streams
//    every dispatch row): destination bytes written + source bytes read from beyond the cache
//    (a source that fits is read from memory once; a larger one once per row that copies it:
//    the throughput layout streams its tokens once per destination rank, while decode's 1.8 MB
//    of tokens stay cached for all their 8 copies);
//  * combine reduction (in place, or from bsp's staging): input rows read + output rows written
//    (decode writes one row per 8 read, prefill one per 2; top-4 one per 4);
//  * plain copies (bsp's staging): decode's and prefill's rates, log(bytes) between them.
// Below decode's size a call's rows are partly still in cache: that share (resident_share, from
// the measured reuse capacity) of its placement, reductions and plain copies runs at the rates
// of the 2 MiB call `calibrate` (or ubep-bench, sim/validate.sh) times (call.cpp).
// The two per-byte costs of each split are solved from the decode and prefill measurements
// (two equations, two unknowns: exact on the calibrated shapes, nothing fitted to others).
#pragma once

#include <utility>
#include <vector>

namespace ubep::sim {

// t = first * x + second * y, solved from two measurements (t1 at (f1, s1), t2 at (f2, s2)).
// valid = false when the system is singular or gives a non-positive cost (then the caller keeps
// the nearest measured rate).
struct TwoStreamCost {
  double first_ns_per_byte = 0, second_ns_per_byte = 0;
  bool valid = false;
};
TwoStreamCost solve_two_stream(double f1, double s1, double t1_ns, double f2, double s2,
                               double t2_ns);

// Source bytes a placement reads from beyond L2: the distinct bytes if they fit in L2 (read
// once, then hit), else every row copy reads its row again.
double source_read_bytes(double distinct_source_bytes, double copied_bytes, double l2_bytes);

// The share of a call's re-read bytes that it reads from cache, for a cache that holds
// `capacity` bytes per core of the rows just written (the measured reuse capacity): all of a call
// that fits, and capacity / bytes of a larger one (the cache keeps that much of what was written
// and replaces lines without regard to the order they will be read in; strict LRU would keep
// none of a streamed re-read larger than itself, Zen's L3 is not strict LRU). Returned relative
// to the two calls whose rates were measured: 1 at `small_bytes` (the 2 MiB call, whose rates are
// the in-cache ones), 0 at `large_bytes` (the smallest calibrated shape above it, whose measured
// rates already hold its own share), in between (s(bytes) - s(large)) / (s(small) - s(large)),
// clamped to [0, 1]. When both fit, or neither, it is the position in log(bytes) between them
// (the measured rates alone then say how the rate moves). A call's time per byte is then this
// share x the small call's + the rest x its own out-of-cache one (blend_rate). Before
// 2026-12-04 residency was a step at the capacity: a 3.5 MiB call (32 tokens) under a 3 MiB
// capacity ran entirely at decode's out-of-cache rates (its combines +56%, +79%).
double resident_share(double capacity, double small_bytes, double large_bytes, double bytes);

// The rate of a call whose bytes come a share `cached` from cache at `cache_GBps` and the rest at
// `own_GBps` (time per byte blended; either rate <= 0: the other).
double blend_rate(double cached, double cache_GBps, double own_GBps);

// The reuse capacity from a measured re-read curve ((bytes per core, GB/s per core), ascending
// sizes): the largest size before the first one that runs more than 10% below the in-cache
// rate, 0 when even the smallest misses. The model has two regimes only (rows from cache at the
// small call's rates, or from memory), so a size counts as resident only when nearly all of its
// rows hit; a partly resident size would get the full in-cache rate. The in-cache rate is the
// median of the three smallest sizes (1-2 MiB: past a 512 KiB-1 MiB L2, well inside a shared
// L3), not the best point of the curve: on a shallow curve (2026-12-03, Zen 3 guest: 14-17 GB/s
// from 1 to 8 MiB, 10-12 beyond) one high point under load (17.4 at 6 MiB) put every size
// below it "out of cache" and the capacity at 0 in 4 of 5 rounds.
double resident_capacity(const std::vector<std::pair<double, double>>& curve);
// That in-cache rate: the median of the curve's three smallest sizes (0 for an empty curve).
double resident_rate(const std::vector<std::pair<double, double>>& curve);

// More ranks than cores: how many times its time alone on a core a rank's call takes. Whole
// rounds, ceil(ranks / cores), when the measured makespan of cores + 1 equal threads (in
// `measured`, (threads, ratio) pairs) is nearer to whole rounds than to fair sharing (a rank's
// work is shorter than the scheduler's slice, so it runs to its end once it has a core, and the
// ranks left wait for a core); else, and when not measured, fair sharing, ranks / cores.
double oversubscribed_ratio(const std::vector<std::pair<int, double>>& measured, int ranks,
                            int cores);

// Piecewise-linear in log(x) through (x, value) points (any order), constant beyond the ends.
double log_interpolate(std::vector<std::pair<double, double>> points, double x);

// Rate in GB/s (bytes per ns) at which a kernel moves `first` bytes when its time is
// first * x + second * y (the second stream rides along: source reads, output writes).
double two_stream_rate(const TwoStreamCost& cost, double first_bytes, double second_bytes);

}  // namespace ubep::sim
