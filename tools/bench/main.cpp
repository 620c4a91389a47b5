// ubep-bench: MPI baseline, bsp, ubep, the bandwidth bound and the latency floor side by side.
//   ubep-bench --ranks 2 --workload decode                 (ranks as threads)
//   mpirun -np 2 ubep-bench --workload decode              (ranks as processes)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "bench.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"
#ifdef UBEP_WITH_MPI
#include "ubep/mpi_group.hpp"
#endif
#ifdef UBEP_HAVE_ONECCL
#include "bench/oneccl_exchange.hpp"
#endif

int main(int argc, char** argv) {
  using namespace ubep;
  tools::BenchCommand cmd;
#ifdef UBEP_HAVE_ONECCL
  tools::register_exchange("oneccl", tools::make_oneccl_exchange);
#endif
  try {
    cmd = tools::parse_bench_args(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "ubep-bench: %s\n", e.what());
    return 2;
  }
  if (cmd.help) {
    std::fputs(tools::kBenchUsage, stdout);
    return 0;
  }
  tools::BenchOptions& opt = cmd.opt;
  int ranks = cmd.ranks;
  const double timeout_s = cmd.timeout_s;
  const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE");
  auto body = [&](Group& g) {
    if (!opt.straggler_us.empty()) {
      auto rows = tools::run_straggler(g, opt);
      tools::print_straggler_table(g, opt, rows);
      tools::write_json(g, opt, rows);
      return;
    }
    auto policies = tools::policy_report(g, opt);
    // --repeat N: N whole runs; run n rotates the implementations and the dtypes by n, so none
    // always runs first (in the rounds of run_bench) or in the same minute as another.
    std::vector<std::vector<tools::BenchRow>> runs;
    for (int n = 0; n < opt.repeat; ++n) {
      auto rotated = [n](std::vector<std::string> v) {
        if (!v.empty()) std::rotate(v.begin(), v.begin() + n % static_cast<int>(v.size()), v.end());
        return v;
      };
      std::vector<tools::BenchRow> rows;
      for (const std::string& d : rotated(opt.dtypes)) {  // --dtype bf16,fp8: a run per entry
        tools::BenchOptions o = opt;
        o.algos = rotated(opt.algos);
        o.fp8_cast = d == "fp8-cast";
        o.dtype = o.fp8_cast ? DType::kFP8E4M3 : parse_dtype(d);
        auto part = tools::run_bench(g, o);
        if (opt.repeat > 1 && g.rank() == 0) std::printf("-- run %d of %d --\n", n + 1, opt.repeat);
        tools::print_table(g, o, part);
        for (auto& r : part) r.run = n;
        rows.insert(rows.end(), part.begin(), part.end());
      }
      runs.push_back(std::move(rows));
    }
    tools::print_policy_report(g, opt, policies);
    if (opt.repeat == 1) {
      tools::write_json(g, opt, runs[0]);
      return;
    }
    const auto summary = tools::summarize_runs(runs);
    tools::print_summary(g, opt, runs, summary);
    std::vector<tools::BenchRow> all;
    for (const auto& run : runs) all.insert(all.end(), run.begin(), run.end());
    tools::write_json(g, opt, summary, all);
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
  } catch (const std::exception& e) {  // e.g. bad_alloc: a message, not an abort
    std::fprintf(stderr, "ubep-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
