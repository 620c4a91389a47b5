// ubep-sim entry point: dispatches to the subcommands of experiments.hpp.
#include <cstdio>
#include <string>

#include "sim/experiments.hpp"
#include "ubep/error.hpp"

int main(int argc, char** argv) {
  using namespace ubep::sim;
  try {
    const Options o = parse_options(argc, argv);
    const std::string& c = o.command;
    if (c.empty()) {
      print_help();
      return 2;
    }
    if (c == "call") return cmd_call(o);
    if (c == "latency") return cmd_latency(o);
    if (c == "sync") return cmd_sync(o);
    if (c == "sched") return cmd_sched(o);
    if (c == "sched-sweep") return cmd_sched_sweep(o);
    if (c == "tpot") return cmd_tpot(o);
    if (c == "calibrate") return cmd_calibrate(o);
    if (c == "predict") return cmd_predict(o);
    if (c == "bench") return cmd_bench(o);
    if (c == "validate") return cmd_validate(o);
    if (c == "sensitivity") return cmd_sensitivity(o);
    if (c == "params") return cmd_params(o);
    std::fprintf(stderr, "ubep-sim: unknown command '%s' (see --help)\n", c.c_str());
    return 2;
  } catch (const ubep::Error& e) {
    std::fprintf(stderr, "ubep-sim: %s\n", e.what());
    return 2;
  }
}
