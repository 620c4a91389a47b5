// ubep-moe-bench: the expert layer, serial vs tile-level overlapped, on thread or process ranks.
//
//   ubep-moe-bench --ranks 2 [options]                    ranks as threads
//   mpirun --allow-run-as-root -np 2 ubep-moe-bench ...   ranks as processes
//
// Per (router mode, tile height, communication workers) it times, on the slowest rank, the
// operator (expert compute + combine: ExpertLayer::run) and the MoE layer (dispatch + operator),
// median over iterations, serial and overlapped in alternating order; the overlap ratio
// (share of the serial combine hidden by overlapping); and where time goes. Every overlapped
// result is compared bitwise with the serial one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ubep/bf16.hpp"
#include "ubep/buffer.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"
#include "ubep/moe.hpp"
#ifdef UBEP_WITH_MPI
#include "ubep/mpi_group.hpp"
#endif

extern "C" void openblas_set_num_threads(int);

namespace {

using namespace ubep;
using namespace ubep::moe;
using Clock = std::chrono::steady_clock;

struct Options {
  int ranks = 2;
  int64_t hidden = 2048, inter = 4096, tokens = 512;
  int experts = 16, topk = 2;
  DType dtype = DType::kBF16;
  FfnKind ffn = FfnKind::kGated;
  std::vector<RouterMode> routers{RouterMode::kBalanced, RouterMode::kModerateSkew,
                                  RouterMode::kStressSkew};
  std::vector<int64_t> tiles{64};
  std::vector<int> comm_workers{1};
  int compute_workers = 1;
  int iters = 5, warmup = 1;
  bool remote_first = true;
  double timeout_s = 600;
  double link_gbps = 0;  // > 0: emulate a link of this bandwidth for remote segments
};

template <typename T, typename F>
std::vector<T> parse_list(const std::string& s, F f) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(f(item));
  return out;
}

void usage() {
  std::puts(
      "usage: ubep-moe-bench [--ranks N] [--hidden H] [--inter I] [--experts E] [--topk K]\n"
      "         [--tokens T] [--dtype bf16|fp32] [--ffn gated|single] [--router "
      "balanced,moderate,stress]\n"
      "         [--tile 32,64,...] [--comm-workers 1,2,...] [--compute-workers C] [--iters N]\n"
      "         [--warmup N] [--local-first] [--timeout S] [--link-gbps G]\n"
      "--link-gbps G: remote segments also pay G GB/s of emulated link time (a sleep).\n"
      "Under mpirun the ranks are the MPI processes (--ranks is ignored).");
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Per-rank measurements of one run, gathered to every rank.
struct Sample {
  double layer_us, op_us, compute_phase_us, ship_phase_us, reduce_us, compute_us, gather_us,
      copy_us, comm_idle_us, reduce_wait_us, rows, remote_rows, tiles, segments;
};

struct Summary {
  double layer, op, compute_phase, after_compute;  // slowest rank, median over iterations
  double exposed;  // median over iterations of (slowest op) - (slowest compute phase)
  double compute, gather, copy, idle, reduce_wait;  // mean over ranks, median over iterations
  double rows_max, rows_min, remote_rows, tiles, segments;
};

Summary summarize(const std::vector<std::vector<Sample>>& it) {  // [iter][rank]
  std::vector<double> layer, op, cp, after, comp, gat, cop, idle, rw, exposed;
  Summary s{};
  for (const auto& ranks : it) {
    double l = 0, o = 0, c = 0, a = 0, sc = 0, sg = 0, sy = 0, si = 0, sr = 0;
    s.rows_max = 0;
    s.rows_min = 1e300;
    s.remote_rows = s.tiles = s.segments = 0;
    for (const auto& x : ranks) {
      l = std::max(l, x.layer_us);
      o = std::max(o, x.op_us);
      c = std::max(c, x.compute_phase_us);
      a = std::max(a, x.op_us - x.compute_phase_us);
      sc += x.compute_us;
      sg += x.gather_us;
      sy += x.copy_us;
      si += x.comm_idle_us;
      sr += x.reduce_wait_us;
      s.rows_max = std::max(s.rows_max, x.rows);
      s.rows_min = std::min(s.rows_min, x.rows);
      s.remote_rows += x.remote_rows;
      s.tiles += x.tiles;
      s.segments += x.segments;
    }
    const double n = static_cast<double>(ranks.size());
    layer.push_back(l);
    op.push_back(o);
    exposed.push_back(o - c);
    cp.push_back(c);
    after.push_back(a);
    comp.push_back(sc / n);
    gat.push_back(sg / n);
    cop.push_back(sy / n);
    idle.push_back(si / n);
    rw.push_back(sr / n);
  }
  s.layer = median(layer);
  s.op = median(op);
  s.compute_phase = median(cp);
  s.after_compute = median(after);
  s.exposed = median(exposed);
  s.compute = median(comp);
  s.gather = median(gat);
  s.copy = median(cop);
  s.idle = median(idle);
  s.reduce_wait = median(rw);
  return s;
}

int bench(Group& g, const Options& o) {
  const int R = g.size(), me = g.rank();
  const bool root = me == 0;
  const int El = o.experts / R;
  UBEP_CHECK_ARG(o.experts % R == 0, "--experts ", o.experts, " must be a multiple of the ranks ",
                 R);
  int64_t max_tile = 1;
  for (auto t : o.tiles) max_tile = std::max(max_tile, t);

  BufferConfig bc;
  bc.max_tokens_per_rank = o.tokens;
  bc.hidden = o.hidden;
  bc.dtype = o.dtype;
  bc.num_experts = o.experts;
  bc.max_topk = o.topk;
  bc.algorithm = Algorithm::kUbep;
  bc.enable_latency_layout = false;
  Buffer buffer(g, bc);
  const auto w0 = Clock::now();
  ExpertFfn ffn(o.ffn, El, me * El, o.hidden, o.inter, o.compute_workers, max_tile, 2024);
  const double init_s = std::chrono::duration<double>(Clock::now() - w0).count();

  // Inputs: x deterministic per rank.
  std::vector<char> x(static_cast<size_t>(o.tokens * o.hidden) * dtype_size(o.dtype));
  for (int64_t i = 0; i < o.tokens * o.hidden; ++i) {
    const float v =
        static_cast<float>((i * 2654435761u + static_cast<uint64_t>(me) * 977) % 2001) / 1000.0f -
        1.0f;
    if (o.dtype == DType::kBF16) {
      const uint16_t b = float_to_bf16(v);
      std::memcpy(x.data() + i * 2, &b, 2);
    } else {
      std::memcpy(x.data() + i * 4, &v, 4);
    }
  }
  if (root) {
    std::printf(
        "# ubep-moe-bench: group %s, hidden %lld, intermediate %lld, ffn %s, experts %d (%d per "
        "rank), top-%d, "
        "%lld tokens/rank, %s, compute workers %d, %s, iters %d (+%d warm-up)\n",
        g.kind(), static_cast<long long>(o.hidden), static_cast<long long>(o.inter),
        ffn_kind_name(o.ffn), o.experts, El, o.topk, static_cast<long long>(o.tokens),
        dtype_name(o.dtype), o.compute_workers,
        o.remote_first ? "remote-first" : "local-first (ablation)", o.iters, o.warmup);
    if (o.link_gbps > 0)
      std::printf("# emulated link: remote segments sleep for bytes / %.3f GB/s\n", o.link_gbps);
    std::printf(
        "# expert weights %.0f MiB per rank (built in %.1f s), hardware threads %u, "
        "OPENBLAS_NUM_THREADS=1\n",
        static_cast<double>(ffn.weight_bytes()) / (1 << 20), init_s,
        std::thread::hardware_concurrency());
    std::printf(
        "# times in ms: slowest rank, median; breakdown columns: mean over ranks of per-role "
        "sums\n");
    std::printf(
        "# exposed comm = op time - compute phase (slowest ranks); overlap ratio = 1 - exposed ovl "
        "/ exposed ser\n");
    std::printf(
        "| router | tile | comm w | layer serial | layer overlap | op serial | op overlap | op "
        "speedup (paired) | "
        "exposed comm ser/ovl | overlap ratio | compute phase ser/ovl | compute ser/ovl | gather | "
        "copy | comm idle | reduce wait | rows/rank max/min | "
        "remote rows | segments/tiles | GFLOP/s |\n");
    std::printf(
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
  }

  int mismatches = 0;
  for (RouterMode mode : o.routers) {
    RouterOutput rt = route(mode, o.experts, o.topk, o.tokens, 1000 + static_cast<uint64_t>(me));
    DispatchArgs a;
    a.x = TensorView(x.data(), o.dtype, {o.tokens, o.hidden});
    a.topk_idx = TensorView(rt.topk_idx.data(), DType::kInt64, {o.tokens, o.topk});
    a.topk_weights = TensorView(rt.topk_weights.data(), DType::kFP32, {o.tokens, o.topk});
    a.layout = Layout::kThroughput;
    for (int64_t tile : o.tiles)
      for (int cw : o.comm_workers) {
        ExpertLayerConfig lc;
        lc.max_tokens_per_rank = o.tokens;
        lc.hidden = o.hidden;
        lc.dtype = o.dtype;
        lc.num_experts = o.experts;
        lc.max_topk = o.topk;
        lc.compute_workers = o.compute_workers;
        lc.comm_workers = cw;
        lc.tile_rows = tile;
        lc.remote_first = o.remote_first;
        ExpertLayer layer(g, lc);
        const TileFn fn = ffn.tile_fn();
        if (o.link_gbps > 0) {
          // Emulated link (DMA engine / NIC / NVLink): the shipper sleeps for the transfer time,
          // which occupies the communication worker but not a core, as a real DMA transfer would.
          const double row_bytes =
              static_cast<double>(o.hidden * static_cast<int64_t>(dtype_size(o.dtype)));
          const double gbps = o.link_gbps;
          layer.set_ship_delay_hook([row_bytes, gbps](int, int64_t rows) {
            std::this_thread::sleep_for(std::chrono::duration<double>(static_cast<double>(rows) *
                                                                      row_bytes / (gbps * 1e9)));
          });
        }
        std::vector<std::vector<Sample>> its[2];
        for (int it = 0; it < o.warmup + o.iters; ++it) {
          std::vector<char> ys[2];
          for (int j = 0; j < 2; ++j) {
            // Alternate which schedule goes first, so neither always runs on a warm cache.
            const Schedule s = ((it + j) % 2 == 0) ? Schedule::kSerial : Schedule::kOverlapped;
            const int si = s == Schedule::kSerial ? 0 : 1;
            g.barrier();
            const auto t0 = Clock::now();
            DispatchResult d = buffer.dispatch(a);
            const auto t1 = Clock::now();
            TensorView y = layer.run(d, a.topk_idx, a.topk_weights, fn, s);
            const auto t2 = Clock::now();
            const LayerStats& st = layer.last_stats();
            ys[si].assign(static_cast<const char*>(y.data),
                          static_cast<const char*>(y.data) + y.bytes());
            Sample smp{std::chrono::duration<double, std::micro>(t2 - t0).count(),
                       std::chrono::duration<double, std::micro>(t2 - t1).count(),
                       st.compute_phase_us,
                       st.ship_phase_us,
                       st.reduce_us,
                       st.compute_us,
                       st.gather_us,
                       st.copy_us,
                       st.comm_idle_us,
                       st.reduce_wait_us,
                       static_cast<double>(st.rows),
                       static_cast<double>(st.remote_rows),
                       static_cast<double>(st.tiles),
                       static_cast<double>(st.segments)};
            std::vector<Sample> all(static_cast<size_t>(R));
            g.allgather(&smp, all.data(), sizeof(Sample));
            if (it >= o.warmup) its[si].push_back(all);
          }
          // Both schedules ran on the same input: y must agree bit for bit.
          if (ys[0] != ys[1]) ++mismatches;
        }
        const Summary S = summarize(its[0]), O = summarize(its[1]);
        // Communication exposed on the critical path: from the moment the slowest rank finished
        // computing until the slowest rank has its y (ship + reduce + their waits). The overlap
        // ratio is the share of the serial schedule's exposed communication that overlapping
        // hid; it is measured per iteration on each schedule's own compute phase, so it does not
        // depend on how fast the (noisy, shared) cores computed.
        const double comm = S.exposed;
        const double ratio = comm > 0 ? 1.0 - O.exposed / comm : 0.0;
        // Paired speedup: serial and overlapped ran back to back in every iteration.
        std::vector<double> pair;
        for (size_t i = 0; i < its[0].size() && i < its[1].size(); ++i) {
          double so = 0, oo = 0;
          for (const auto& x : its[0][i]) so = std::max(so, x.op_us);
          for (const auto& x : its[1][i]) oo = std::max(oo, x.op_us);
          pair.push_back(so / oo);
        }
        const double paired = median(pair);
        const double gflops =
            ffn.flops(static_cast<int64_t>(O.rows_max)) / (O.compute > 0 ? O.compute : 1) / 1e3;
        if (root) {
          std::printf(
              "| %s | %lld | %d | %.1f | %.1f | %.1f | %.1f | %.3f | %.2f/%.2f | %.2f | %.1f/%.1f "
              "| %.1f/%.1f | %.2f | %.2f | %.2f | "
              "%.2f | %.0f/%.0f | %.0f | %.0f/%.0f | %.1f |\n",
              router_mode_name(mode), static_cast<long long>(tile), cw, S.layer / 1e3,
              O.layer / 1e3, S.op / 1e3, O.op / 1e3, paired, comm / 1e3, O.exposed / 1e3, ratio,
              S.compute_phase / 1e3, O.compute_phase / 1e3, S.compute / 1e3, O.compute / 1e3,
              O.gather / 1e3, O.copy / 1e3, O.idle / 1e3, O.reduce_wait / 1e3, O.rows_max,
              O.rows_min, O.remote_rows, O.segments, O.tiles, gflops);
          std::fflush(stdout);
        }
      }
  }
  std::vector<int> mm(static_cast<size_t>(R));
  g.allgather(&mismatches, mm.data(), sizeof(int));
  int total = 0;
  for (int v : mm) total += v;
  if (root)
    std::printf("# overlapped vs serial: %s\n",
                total == 0 ? "bit-identical in every iteration" : "MISMATCH");
  return total == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  // The executor's compute workers provide the parallelism; a multi-threaded BLAS inside every
  // tile would oversubscribe the cores.
  openblas_set_num_threads(1);
  Options o;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        UBEP_CHECK_ARG(i + 1 < argc, "option ", a, " needs a value");
        return argv[++i];
      };
      if (a == "--ranks")
        o.ranks = std::stoi(next());
      else if (a == "--hidden")
        o.hidden = std::stoll(next());
      else if (a == "--inter")
        o.inter = std::stoll(next());
      else if (a == "--tokens")
        o.tokens = std::stoll(next());
      else if (a == "--experts")
        o.experts = std::stoi(next());
      else if (a == "--topk")
        o.topk = std::stoi(next());
      else if (a == "--dtype")
        o.dtype = parse_dtype(next());
      else if (a == "--ffn")
        o.ffn = parse_ffn_kind(next());
      else if (a == "--router")
        o.routers = parse_list<RouterMode>(next(), parse_router_mode);
      else if (a == "--tile")
        o.tiles = parse_list<int64_t>(next(), [](const std::string& s) { return std::stoll(s); });
      else if (a == "--comm-workers")
        o.comm_workers = parse_list<int>(next(), [](const std::string& s) { return std::stoi(s); });
      else if (a == "--compute-workers")
        o.compute_workers = std::stoi(next());
      else if (a == "--iters")
        o.iters = std::stoi(next());
      else if (a == "--warmup")
        o.warmup = std::stoi(next());
      else if (a == "--local-first")
        o.remote_first = false;
      else if (a == "--timeout")
        o.timeout_s = std::stod(next());
      else if (a == "--link-gbps")
        o.link_gbps = std::stod(next());
      else if (a == "--help" || a == "-h") {
        usage();
        return 0;
      } else {
        throw InvalidArgument("unknown option '" + a + "'");
      }
    }
    UBEP_CHECK_ARG(o.iters >= 1, "--iters must be >= 1, got ", o.iters);
    UBEP_CHECK_ARG(o.warmup >= 0, "--warmup must be >= 0, got ", o.warmup);
    UBEP_CHECK_ARG(o.ranks >= 1, "--ranks must be >= 1, got ", o.ranks);
    UBEP_CHECK_ARG(o.tokens >= 1, "--tokens must be >= 1, got ", o.tokens);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ubep-moe-bench: %s\n", e.what());
    usage();
    return 2;
  }
  const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE");
  int rc = 0;
  try {
    GroupOptions go;
    go.timeout = std::chrono::milliseconds(static_cast<long long>(o.timeout_s * 1000));
    if (under_mpi) {
#ifdef UBEP_WITH_MPI
      int provided = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
      {
        MpiGroupOptions mo;
        mo.timeout = go.timeout;
        auto g = make_mpi_group(MPI_COMM_WORLD, mo);
        rc = bench(*g, o);
      }
      MPI_Finalize();
#else
      throw Error("started under mpirun, but built without MPI (UBEP_WITH_MPI=OFF)");
#endif
    } else {
      std::vector<int> rcs(static_cast<size_t>(o.ranks));
      run_on_threads(
          o.ranks, [&](Group& g) { rcs[static_cast<size_t>(g.rank())] = bench(g, o); }, go);
      rc = *std::max_element(rcs.begin(), rcs.end());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ubep-moe-bench: %s\n", e.what());
    return 1;
  }
  return rc;
}
