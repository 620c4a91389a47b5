// ubep-bench: MPI baseline, bsp, ubep and the copy bound side by side.
//   ubep-bench --ranks 2 --workload decode                 (ranks as threads)
//   mpirun -np 2 ubep-bench --workload decode              (ranks as processes)
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "bench.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"
#ifdef UBEP_WITH_MPI
#include "ubep/mpi_group.hpp"
#endif

namespace {

const char* kUsage = R"(usage: ubep-bench [options]
Ranks: threads in this process (--ranks N), or processes when started by mpirun.
  --ranks N            thread ranks (default 2; ignored under mpirun)
  --workload W         decode (128 tokens, latency layout) | prefill (4096 tokens, throughput)
                       | tiny (1 token); all: hidden 7168, top-8 of 256 experts, bf16
  --tokens N           tokens per rank            --hidden N    hidden size
  --topk K             experts per token          --experts E   total experts
  --dtype bf16|fp32    --layout throughput|latency
  --routing uniform|hot  expert choice (hot: half the picks go to 8 hot experts)
  --algo LIST          comma list of mpi,bsp,ubep (default all; mpi = the MPI_Alltoallv
                       baseline, an in-process bulk exchange "a2a" on thread ranks)
  --sync LIST          ubep sync modes: fused,stop-and-wait (default fused)
  --workers N          ubep worker threads per rank (default: cores / ranks - 1)
  --topology SPEC      preset (cm384, nvl72, h800), HxR (e.g. 2x2: also forces hosts of R
                       ranks, so traffic between them takes the cross-host relay over MPI
                       or the in-process transport) or a JSON file; prints the predicted
                       send time of each scheduling policy for this routing
  --schedule P         ubep send schedule: equal (default), naive, column_major, balanced
  --plan-workers N     workers assumed by the policy report (default 8)
  --iters N --warmup N measured and warm-up iterations
  --seed N             routing and data seed
  --json FILE          write {"config":..., "results":[...]}
  --dump DIR           write one call's inputs and outputs per rank as .npy + meta.json
  --quiet              no progress line
  --timeout S          seconds before a wait on a peer fails (default 60)
)";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ubep;
  tools::BenchOptions opt;
  int ranks = 2;
  double timeout_s = 60;
  const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE");
  try {
    // The workload preset first, so explicit flags override it wherever they appear.
    for (int i = 1; i + 1 < argc; ++i)
      if (std::string(argv[i]) == "--workload") opt.apply_workload(argv[i + 1]);
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        UBEP_CHECK_ARG(i + 1 < argc, "missing value after ", a);
        return argv[++i];
      };
      auto num = [&]() -> long long {
        const std::string v = next();
        char* end = nullptr;
        const long long n = std::strtoll(v.c_str(), &end, 10);
        UBEP_CHECK_ARG(end && *end == '\0' && !v.empty(), "bad number '", v, "' for ", a);
        return n;
      };
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (a == "--ranks")
        ranks = static_cast<int>(num());
      else if (a == "--workload")
        next();
      else if (a == "--tokens")
        opt.tokens = num();
      else if (a == "--hidden")
        opt.hidden = num();
      else if (a == "--topk")
        opt.topk = static_cast<int>(num());
      else if (a == "--experts")
        opt.experts = static_cast<int>(num());
      else if (a == "--dtype")
        opt.dtype = parse_dtype(next());
      else if (a == "--layout")
        opt.layout = parse_layout(next());
      else if (a == "--routing")
        opt.routing = next();
      else if (a == "--algo")
        opt.algos = split(next());
      else if (a == "--sync") {
        opt.syncs.clear();
        for (auto& s : split(next())) opt.syncs.push_back(parse_sync_mode(s));
      } else if (a == "--workers")
        opt.workers = static_cast<int>(num());
      else if (a == "--topology")
        opt.topology = next();
      else if (a == "--schedule")
        opt.schedule = parse_send_schedule(next());
      else if (a == "--plan-workers")
        opt.plan_workers = static_cast<int>(num());
      else if (a == "--iters")
        opt.iters = static_cast<int>(num());
      else if (a == "--warmup")
        opt.warmup = static_cast<int>(num());
      else if (a == "--seed")
        opt.seed = static_cast<uint64_t>(num());
      else if (a == "--json")
        opt.json = next();
      else if (a == "--dump")
        opt.dump = next();
      else if (a == "--quiet")
        opt.quiet = true;
      else if (a == "--timeout")
        timeout_s = static_cast<double>(num());
      else
        throw InvalidArgument("unknown option '" + a + "' (see --help)");
    }
    UBEP_CHECK_ARG(opt.tokens >= 0, "--tokens must be >= 0, got ", opt.tokens);
    UBEP_CHECK_ARG(opt.warmup >= 0, "--warmup must be >= 0, got ", opt.warmup);
    UBEP_CHECK_ARG(ranks >= 1, "--ranks must be >= 1, got ", ranks);
  } catch (const Error& e) {
    std::fprintf(stderr, "ubep-bench: %s\n", e.what());
    return 2;
  }
  auto body = [&](Group& g) {
    auto policies = tools::policy_report(g, opt);
    auto rows = tools::run_bench(g, opt);
    tools::print_table(g, opt, rows);
    tools::print_policy_report(g, opt, policies);
    tools::write_json(g, opt, rows);
  };
  try {
    GroupOptions go;
    go.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
    // "HxR": H hosts of R ranks each, forced on this machine.
    if (const auto x = opt.topology.find('x');
        x != std::string::npos && x > 0 &&
        opt.topology.find_first_not_of("0123456789x") == std::string::npos) {
      go.ranks_per_host = std::stoi(opt.topology.substr(x + 1));
      if (!under_mpi) ranks = std::stoi(opt.topology.substr(0, x)) * go.ranks_per_host;
    }
    if (under_mpi) {
#ifdef UBEP_WITH_MPI
      int provided = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
      {
        auto g = make_mpi_group(MPI_COMM_WORLD, go);
        body(*g);
      }
      MPI_Finalize();
#else
      throw Error("started under mpirun, but ubep-bench was built without MPI (UBEP_WITH_MPI=OFF)");
#endif
    } else {
      run_on_threads(ranks, body, go);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "ubep-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
