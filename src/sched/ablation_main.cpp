// ubep-sched-ablation: prints the scheduling ablation (docs/SCHEDULING.md) for given settings.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ubep/error.hpp"
#include "ubep/scheduler.hpp"

namespace {
void usage() {
  std::printf(
      "usage: ubep-sched-ablation [options]\n"
      "  --topology SPEC     cm384 | nvl72 | h800 | HxR | file.json (default cm384)\n"
      "  --ranks N           ranks (default 64)\n"
      "  --experts N         experts in total (default 256)\n"
      "  --topk N            experts per token (default 8)\n"
      "  --hot N             hot experts (default 8)\n"
      "  --hot-weight X      draw weight of a hot expert vs 1 for a cold one (default 4)\n"
      "  --tokens N          tokens per rank (default 128)\n"
      "  --hidden N          hidden size (default 7168)\n"
      "  --elem-bytes N      bytes per element (default 2, bf16)\n"
      "  --workers N         workers per rank (default 48)\n"
      "  --per-destination   one unit per destination rank instead of per expert\n"
      "  --seed N            routing seed (default 1)\n");
}
}  // namespace

int main(int argc, char** argv) {
  ubep::sched::AblationConfig c;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        UBEP_CHECK_ARG(i + 1 < argc, "option ", a, " needs a value");
        return argv[++i];
      };
      auto integer = [&]() {
        const std::string v = next();
        char* end = nullptr;
        const long x = std::strtol(v.c_str(), &end, 10);
        UBEP_CHECK_ARG(!v.empty() && *end == '\0', "option ", a, ": '", v, "' is not an integer");
        return static_cast<int>(x);
      };
      if (a == "--help" || a == "-h") {
        usage();
        return 0;
      } else if (a == "--topology")
        c.topology = next();
      else if (a == "--ranks")
        c.routing.ranks = integer();
      else if (a == "--experts")
        c.routing.experts = integer();
      else if (a == "--topk")
        c.routing.topk = integer();
      else if (a == "--hot")
        c.routing.hot_experts = integer();
      else if (a == "--hot-weight") {
        const std::string v = next();
        char* end = nullptr;
        c.routing.hot_weight = std::strtod(v.c_str(), &end);
        UBEP_CHECK_ARG(!v.empty() && *end == '\0', "option --hot-weight: '", v,
                       "' is not a number");
      } else if (a == "--tokens")
        c.routing.tokens_per_rank = integer();
      else if (a == "--hidden")
        c.hidden = integer();
      else if (a == "--elem-bytes")
        c.elem_bytes = integer();
      else if (a == "--workers")
        c.workers = integer();
      else if (a == "--per-destination")
        c.per_expert = false;
      else if (a == "--seed")
        c.routing.seed = static_cast<uint64_t>(integer());
      else
        UBEP_CHECK_ARG(false, "unknown option '", a, "' (see --help)");
    }
    std::fputs(ubep::sched::scheduling_ablation(c).describe().c_str(), stdout);
  } catch (const ubep::Error& e) {
    std::fprintf(stderr, "ubep-sched-ablation: %s\n", e.what());
    return 2;
  }
  return 0;
}
