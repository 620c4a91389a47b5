// The calibration sim/validate.sh predicts with, from `calibrate`'s files of its rounds (one
// calibrate pass at the start of each round; this machine is shared, so a figure can be
// disturbed in one round and not in another).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ubep::sim {

// A calibration file's members in file order (all numbers; a null is NaN).
using CalibrationFields = std::vector<std::pair<std::string, double>>;

CalibrationFields read_calibration_fields(const std::string& path);
void write_calibration_fields(const CalibrationFields& fields, const std::string& path);

// Each figure from its least disturbed round: the highest rate (*GBps), the shortest time (*_us,
// handoff_ns, oversubscribed_ratio_*); other figures (sizes, counts) the first round's. The reuse
// capacity is that of the round whose re-read curve ran fastest in cache (reuse_in_cache_GBps):
// the curve is then steep (55 GB/s in cache, 16 from memory on the Zen 4 host) and its knee sits
// at 3 MiB round after round, while a curve measured in the slower state (23-34 GB/s at 1 MiB,
// 15-19 from memory) is nearly flat and its knee, 10% under a noisy start, fell anywhere from 1
// to 6 MiB (2026-12-04, session k's runs 3-7); the largest of the rounds took those. Without
// reuse_in_cache_GBps in every round (files before session l): the largest capacity. Every round
// must have the same members (an InvalidArgument naming the file and the member).
CalibrationFields best_of_rounds(const std::vector<CalibrationFields>& rounds,
                                 const std::vector<std::string>& names);

// Round `round`'s calibration: `best` with the small call's figures (cache_*) of that round, the
// 2 MiB call timed in the same minutes as the round's small unseen calls (validate.cpp,
// --round-calibrations).
CalibrationFields round_calibration(const CalibrationFields& best, const CalibrationFields& round);

}  // namespace ubep::sim
