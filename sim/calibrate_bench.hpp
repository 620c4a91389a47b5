// The rates of the calibrated shapes, from call times: `calibrate`'s own timings of the
// library's calls (calibrate_calls.hpp), or ubep-bench's runs of exactly those two shapes.
//
// Why the second source: on this shared 2-core machine `calibrate` (thread ranks, one process)
// and ubep-bench (process ranks under mpirun) timed the same calibrated shapes 25-37% apart under
// load (EXPERIMENTS.md section 6.5), while `validate` judges the model against ubep-bench runs
// made in the same minutes. Taking the calibrated shapes' rates from ubep-bench runs of those
// shapes, made in the same rounds as the unseen shapes, calibrates the model under the conditions
// it is judged in. It stays a prediction only while no unseen shape's measurement reaches the
// model: rates_from_bench refuses any file whose shape is not one of the two calibrated shapes.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sim/calibrate_calls.hpp"

namespace ubep::sim {

// Tokens per rank of the small call `calibrate` times: rows of 2 MiB per rank (half the library's
// streaming threshold of combine outputs) at 8 rows of 14336 B per token, i.e. 18.
int64_t cache_call_tokens();

// "decode" (2 ranks x 128 tokens, top-8, latency layout), "prefill" (2 x 4096, throughput) or
// "cache" (2 x cache_call_tokens(), latency: the small call), all hidden 7168 bf16 over 256
// experts: the shapes `calibrate` times; "" for any other shape.
std::string calibrated_shape_name(int ranks, int64_t tokens, int hidden, int topk, int experts,
                                  const std::string& dtype, const std::string& layout);

// The calibration file's fields of one shape from its call times: with B = bytes one rank
// receives, stream = B / the faster dispatch, reduce = B / ubep's combine, copy = B / bsp
// combine's row send, staged reduce = B / the rest of bsp's combine; and the times themselves.
std::vector<std::pair<std::string, double>> shape_rate_fields(const std::string& shape,
                                                              double bytes, double tokens,
                                                              double row_bytes, const CallTimes& t);

// The calibrated shapes' call times from ubep-bench --json runs of them (several runs of a shape
// are rounds: each time is the least disturbed run's median, as `validate` reads a measurement;
// bsp's row send is the slowest rank's in the run of the fastest bsp combine). Any file of
// another shape is an InvalidArgument naming it.
struct BenchShapeTimes {
  std::string shape;
  int runs = 0;
  double bytes = 0, tokens = 0;  // B per rank (the bench's bytes_per_rank), tokens per rank
  CallTimes times;
};
std::vector<BenchShapeTimes> shape_times_from_bench(const std::vector<std::string>& files);

// Copies the calibration file at `calibration_path` to `out_path` with the rates of every shape
// in `bench` replaced (the other figures, e.g. the small call's rates, the reuse capacity and the
// oversubscribed makespan, stay `calibrate`'s), and "<shape>_rates_from_bench_runs" = runs.
void write_calibration_with_bench_rates(const std::string& calibration_path,
                                        const std::vector<BenchShapeTimes>& bench,
                                        const std::string& out_path);

}  // namespace ubep::sim
