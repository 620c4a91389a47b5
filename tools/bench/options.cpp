// ubep-bench's flags. Every value is checked here, before any memory is sized from it, so a bad
// flag is a message naming it and exit code 2 -- never a SIGFPE (hidden 0), a length_error
// (negative sizes) or a bad_alloc (absurd token counts) from deep inside the run.
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "bench.hpp"
#include "ubep/error.hpp"

namespace ubep::tools {

const char* const kBenchUsage = R"(usage: ubep-bench [options]
Ranks: threads in this process (--ranks N), or processes when started by mpirun.
  --ranks N            thread ranks (default 2; ignored under mpirun)
  --workload W         decode (128 tokens, latency layout) | prefill (4096 tokens, throughput)
                       | tiny (1 token); all: hidden 7168, top-8 of 256 experts, bf16
  --tokens N           tokens per rank            --hidden N    hidden size
  --topk K             experts per token          --experts E   total experts
  --dtype LIST         comma list of bf16, fp32, fp8 (e4m3 codes + scales made before the
                       timed calls), fp8-cast (bf16 x, ubep casts on send); one run each,
                       rows tagged with their dtype (fp8 combines in bf16)
  --layout throughput|latency
  --routing uniform|hot  expert choice (hot: half the picks go to 8 hot experts)
  --algo LIST          comma list of mpi,bsp,ubep,oneccl (default mpi,bsp,ubep; mpi = the
                       MPI_Alltoallv baseline, an in-process bulk exchange "a2a" on thread
                       ranks; oneccl = the same baseline over oneCCL's alltoallv, in a
                       ubep-bench built with -DUBEP_ONECCL_ROOT)
  --sync LIST          ubep sync modes: fused,stop-and-wait (default fused)
  --placement P        auto (default: per-source for latency, compact for throughput),
                       compact or per-source (where received rows go; docs/SEMANTICS.md)
  --straggler-us LIST  instead of the comparison: rank 0 arrives D us late at every call, for
                       each D in the list (e.g. 0,1000,4000); prints bsp, ubep-compact and
                       ubep-per-source dispatch_send and dispatch on the other ranks
  --workers N          worker threads per rank for ubep's roles and for bsp's and the
                       baseline's pack, unpack and reduce (default: cores / ranks - 1)
  --topology SPEC      preset (cm384, nvl72, h800), HxR (e.g. 2x2: also forces hosts of R
                       ranks, so traffic between them takes the cross-host relay over MPI
                       or the in-process transport) or a JSON file; prints the predicted
                       send time of each scheduling policy for this routing
  --schedule P         ubep send schedule: equal (default), naive, column_major, balanced
  --plan-workers N     workers assumed by the policy report (default 8)
  --iters N --warmup N measured iterations, and untimed ones at the start of every slice
  --rounds N           run the implementations and the bound in N interleaved slices of
                       their iterations (default 5), so load bursts hit all of them alike
  --repeat N           N whole runs, the order of the implementations (and dtypes) rotating;
                       then a summary: the median of the runs' medians with their range, and
                       of each run's ratio to its own bound (default 1)
  --seed N             routing and data seed
  --json FILE          write {"config":..., "results":[...]}
  --dump DIR           write one call's inputs and outputs per rank as .npy + meta.json
  --quiet              no progress line
  --timeout S          seconds before a wait on a peer fails (default 60, > 0)
  --bound-expert E     the fp8 bounds' untimed expert step: match (default: the bench's
                       expert's work, dequantizing every received row, before the combine
                       of its bf16 rows) or copy
Every run also measures, on one host, the bound (every rank copying its rows at once, fastest
of memcpy and non-temporal stores) and the latency floor (a flag round trip between ranks 0, 1).
)";

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Bytes of physical memory, or 0 if unknown.
double physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

}  // namespace

BenchCommand parse_bench_args(int argc, const char* const* argv) {
  BenchCommand c;
  BenchOptions& opt = c.opt;
  // The workload preset first, so explicit flags override it wherever they appear.
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--workload") opt.apply_workload(argv[i + 1]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      UBEP_CHECK_ARG(i + 1 < argc, "missing value after ", a);
      return argv[++i];
    };
    // An integer in [lo, hi]; out-of-range text (e.g. 99999999999 for an int) is named, not
    // wrapped around.
    auto num = [&](long long lo, long long hi) -> long long {
      const std::string v = next();
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      UBEP_CHECK_ARG(!v.empty() && end && *end == '\0', "bad number '", v, "' for ", a);
      UBEP_CHECK_ARG(errno != ERANGE && n >= lo && n <= hi, a, " must be in [", lo, ", ", hi,
                     "], got ", v);
      return n;
    };
    if (a == "--help" || a == "-h") {
      c.help = true;
      return c;
    } else if (a == "--ranks")
      c.ranks = static_cast<int>(num(1, 1024));
    else if (a == "--workload")
      next();
    else if (a == "--tokens")
      opt.tokens = num(0, 1 << 20);
    else if (a == "--hidden")
      opt.hidden = num(1, 1 << 20);
    else if (a == "--topk")
      opt.topk = static_cast<int>(num(1, 64));
    else if (a == "--experts")
      opt.experts = static_cast<int>(num(1, 1 << 20));
    else if (a == "--dtype") {
      opt.dtypes.clear();
      std::string list = next();
      for (size_t at = 0; at <= list.size();) {
        const size_t end = std::min(list.find(',', at), list.size());
        const std::string entry = list.substr(at, end - at);
        if (entry != "fp8-cast") parse_dtype(entry);  // throws naming the entry
        opt.dtypes.push_back(entry);
        at = end + 1;
      }
      opt.dtype = opt.dtypes.front() == "fp8-cast" ? DType::kFP8E4M3 : parse_dtype(opt.dtypes[0]);
    } else if (a == "--layout")
      opt.layout = parse_layout(next());
    else if (a == "--routing") {
      opt.routing = next();
      UBEP_CHECK_ARG(opt.routing == "uniform" || opt.routing == "hot", "unknown --routing '",
                     opt.routing, "' (expected uniform or hot)");
    } else if (a == "--algo") {
      opt.algos = split(next());
      UBEP_CHECK_ARG(!opt.algos.empty(), "--algo needs at least one of mpi,bsp,ubep");
      for (const auto& x : opt.algos)
        UBEP_CHECK_ARG(x == "mpi" || x == "bsp" || x == "ubep" || x == "oneccl",
                       "unknown --algo entry '", x, "' (expected mpi, bsp, ubep or oneccl)");
    } else if (a == "--placement") {
      opt.placement = parse_placement(next());
    } else if (a == "--straggler-us") {
      opt.straggler_us.clear();
      for (const auto& d : split(next())) {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(d.c_str(), &end);
        UBEP_CHECK_ARG(end && *end == '\0' && errno == 0 && std::isfinite(v) && v >= 0 && v <= 1e7,
                       "--straggler-us entry '", d,
                       "' must be a number of microseconds in [0, 1e7]");
        opt.straggler_us.push_back(v);
      }
      UBEP_CHECK_ARG(!opt.straggler_us.empty(), "--straggler-us needs at least one delay");
    } else if (a == "--sync") {
      opt.syncs.clear();
      for (auto& s : split(next())) opt.syncs.push_back(parse_sync_mode(s));
      UBEP_CHECK_ARG(!opt.syncs.empty(), "--sync needs at least one mode");
    } else if (a == "--workers")
      opt.workers = static_cast<int>(num(-1, 256));
    else if (a == "--topology")
      opt.topology = next();
    else if (a == "--schedule")
      opt.schedule = parse_send_schedule(next());
    else if (a == "--plan-workers")
      opt.plan_workers = static_cast<int>(num(1, 4096));
    else if (a == "--iters")
      opt.iters = static_cast<int>(num(1, 10000000));
    else if (a == "--warmup")
      opt.warmup = static_cast<int>(num(0, 10000000));
    else if (a == "--bound-expert") {
      const std::string e = next();
      UBEP_CHECK_ARG(e == "match" || e == "copy", "--bound-expert: expected match or copy, got '",
                     e, "'");
      opt.bound_expert_match = e == "match";
    } else if (a == "--rounds")
      opt.rounds = static_cast<int>(num(1, 10000));
    else if (a == "--repeat")
      opt.repeat = static_cast<int>(num(1, 1000));
    else if (a == "--seed")
      opt.seed = static_cast<uint64_t>(num(0, (1LL << 62)));
    else if (a == "--json")
      opt.json = next();
    else if (a == "--dump")
      opt.dump = next();
    else if (a == "--quiet")
      opt.quiet = true;
    else if (a == "--timeout") {
      const std::string v = next();
      char* end = nullptr;
      const double s = std::strtod(v.c_str(), &end);
      UBEP_CHECK_ARG(!v.empty() && end && *end == '\0', "bad number '", v, "' for --timeout");
      UBEP_CHECK_ARG(std::isfinite(s) && s > 0 && s <= 86400, "--timeout must be in (0, 86400]",
                     " seconds, got ", v);
      c.timeout_s = s;
    } else
      throw InvalidArgument("unknown option '" + a + "' (see --help)");
  }
  UBEP_CHECK_ARG(opt.topk <= opt.experts, "--topk ", opt.topk, " exceeds --experts ", opt.experts);
  // The largest allocations scale with these products (the latency layout's receive buffer is
  // [experts per rank, tokens x ranks, hidden] per rank); refuse what cannot fit before sizing it.
  const double row = static_cast<double>(opt.hidden) * static_cast<double>(dtype_size(opt.dtype));
  const double R = c.ranks;  // under mpirun the real count is known only later; 1 is checked there
  const double per_rank =
      opt.layout == Layout::kLatency
          ? static_cast<double>(opt.experts) / R * static_cast<double>(opt.tokens) * R * row
          : static_cast<double>(opt.tokens) * R * row * 4;
  const double mem = physical_memory();
  UBEP_CHECK_ARG(mem == 0 || per_rank * 2 <= mem, "--tokens ", opt.tokens, " x --hidden ",
                 opt.hidden, " (", layout_name(opt.layout), " layout, ", opt.experts,
                 " experts) needs about ", per_rank * 2 / 1e9, " GB per rank; this machine has ",
                 mem / 1e9, " GB");
  return c;
}

}  // namespace ubep::tools
