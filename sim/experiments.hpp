// The subcommands of ubep-sim. Each prints a table on stdout, progress on stderr (unless
// --quiet), and writes JSON when --json is given. Returns the process exit code.
#pragma once

#include "sim/options.hpp"

namespace ubep::sim {

int cmd_call(const Options& o);
int cmd_latency(const Options& o);
int cmd_sync(const Options& o);
int cmd_sched(const Options& o);
int cmd_sched_sweep(const Options& o);  // sched_sweep.cpp
int cmd_tpot(const Options& o);
int cmd_calibrate(const Options& o);
int cmd_predict(const Options& o);
int cmd_bench(const Options& o);
int cmd_validate(const Options& o);
int cmd_sensitivity(const Options& o);
int cmd_params(const Options& o);

// Shared helpers.
CallConfig call_config(const Options& o, Algo algo, Op op);
void progress(const Options& o, int done, int total, const std::string& what);
// validate: the round of a measured file named "<case>_r<N>.json" (sim/validate.sh), 0 if none.
int round_of_file(const std::string& path);

}  // namespace ubep::sim
