// ubep-bench: MPI baseline, bsp, ubep, the bandwidth bound and the latency floor side by side.
//   ubep-bench --ranks 2 --workload decode                 (ranks as threads)
//   mpirun -np 2 ubep-bench --workload decode              (ranks as processes)
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

int main(int argc, char** argv) {
  using namespace ubep;
  tools::BenchCommand cmd;
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
    std::vector<tools::BenchRow> rows;
    for (const std::string& d : opt.dtypes) {  // --dtype bf16,fp8: one full run per entry
      tools::BenchOptions o = opt;
      o.fp8_cast = d == "fp8-cast";
      o.dtype = o.fp8_cast ? DType::kFP8E4M3 : parse_dtype(d);
      auto part = tools::run_bench(g, o);
      tools::print_table(g, o, part);
      rows.insert(rows.end(), part.begin(), part.end());
    }
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
  } catch (const std::exception& e) {  // e.g. bad_alloc: a message, not an abort
    std::fprintf(stderr, "ubep-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
