// The demo: one decode-sized MoE step on in-process ranks -- route, dispatch, a simple expert
// per local expert, combine -- checked bit for bit against the reference, then the comparison
// table of the MPI-style baseline, bsp, ubep and the copy bound.
#include <cstdio>
#include <cstring>
#include <mutex>

#include "bench/bench.hpp"
#include "reference.hpp"
#include "ubep/buffer.hpp"
#include "ubep/error.hpp"
#include "ubep/group.hpp"

using namespace ubep;

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 4;
  const int experts = 256, topk = 8;
  const int64_t tokens = 128, hidden = 7168;
  const DType dt = DType::kBF16;
  std::printf(
      "ubep demo: one MoE decode step on %d in-process ranks (tokens %lld/rank, hidden %lld, "
      "top-%d of %d experts, bf16)\n",
      ranks, static_cast<long long>(tokens), static_cast<long long>(hidden), topk, experts);
  std::fflush(stdout);
  const test::Problem p = test::make_problem(
      ranks, experts, hidden, dt, std::vector<int64_t>(static_cast<size_t>(ranks), tokens), topk,
      test::Routing::kUniform, 2026);
  std::mutex mu;
  long long mismatches = 0, checked = 0;
  try {
    run_on_threads(ranks, [&](Group& g) {
      BufferConfig cfg;
      cfg.max_tokens_per_rank = tokens;
      cfg.hidden = hidden;
      cfg.dtype = dt;
      cfg.num_experts = experts;
      cfg.max_topk = topk;
      cfg.algorithm = Algorithm::kUbep;
      Buffer buf(g, cfg);
      const int me = g.rank(), El = buf.num_local_experts();
      // 1. route + dispatch (latency layout: rows per local expert).
      DispatchResult r =
          buf.dispatch(p.inputs[static_cast<size_t>(me)].args(dt, hidden, Layout::kLatency));
      // 2. a simple expert per local expert: y = x * (1 + e%5) + 0.25 * (e%3) for global expert e.
      // Rows of expert e from source s: recv_x[e, begin : begin + count], (begin, count) =
      // recv_range[e, s] (per-source placement: each source has its own region, no waiting).
      const int64_t RT = r.recv_x.dim(1), R = g.size();
      const auto* range = r.recv_range.as<const int64_t>();
      std::vector<char> out(r.recv_x.bytes(), 0);
      for (int e = 0; e < El; ++e) {
        for (int64_t src = 0; src < R; ++src) {
          const int64_t* rr = range + 2 * (e * R + src);
          for (int64_t s = rr[0]; s < rr[0] + rr[1]; ++s) {
            for (int64_t h = 0; h < hidden; ++h) {
              const int64_t i = (e * RT + s) * hidden + h;
              const uint16_t v = float_to_bf16(test::expert_fn(load_value(r.recv_x.data, i, dt),
                                                               static_cast<int64_t>(me) * El + e));
              std::memcpy(&out[static_cast<size_t>(i) * 2], &v, 2);
            }
          }
        }
      }
      // 3. combine: weighted sum over the top-k experts, back on the token's owner.
      TensorView y = buf.combine({TensorView(out.data(), dt, {El, RT, hidden}), r.handle});
      // 4. check against the single-process reference, bit for bit.
      const std::vector<float> want = test::expected_combine(p, me, Layout::kLatency);
      long long bad = 0;
      for (int64_t i = 0; i < tokens * hidden; ++i) {
        const float got = load_value(y.data, i, dt);
        if (std::memcmp(&got, &want[static_cast<size_t>(i)], 4) != 0) ++bad;
      }
      std::lock_guard<std::mutex> lock(mu);
      mismatches += bad;
      checked += tokens * hidden;
    });
  } catch (const Error& e) {
    std::fprintf(stderr, "demo failed: %s\n", e.what());
    return 1;
  }
  std::printf("combine output vs reference: %lld of %lld values differ -> %s\n\n", mismatches,
              checked, mismatches == 0 ? "bit-identical" : "MISMATCH");
  if (mismatches != 0) return 1;
  std::printf(
      "comparison on the same ranks (MPI-style bulk all-to-all baseline, bsp, ubep, copy "
      "bound):\n");
  std::fflush(stdout);

  tools::BenchOptions opt;
  opt.apply_workload("decode");
  opt.iters = 30;
  opt.warmup = 3;
  run_on_threads(ranks, [&](Group& g) {
    auto rows = tools::run_bench(g, opt);
    tools::print_table(g, opt, rows);
  });
  return 0;
}
