#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "ep/routing.hpp"
#include "protocol/call_checks.hpp"
using namespace ubep;
int main(int argc, char** argv) {
  const int T = 4096, K = 8, E = 256, R = 2;
  std::vector<int64_t> idx(T * K);
  std::vector<float> w(T * K, 0.1f);
  std::vector<uint16_t> x(size_t(T) * 16);
  std::mt19937 g(1);
  for (int t = 0; t < T; ++t) {
    std::vector<int> p(E);
    for (int i = 0; i < E; ++i) p[i] = i;
    std::shuffle(p.begin(), p.end(), g);
    for (int j = 0; j < K; ++j) idx[t * K + j] = p[j];
  }
  BufferConfig cfg;
  cfg.num_experts = E;
  cfg.hidden = 16;
  cfg.max_tokens_per_rank = T;
  cfg.max_topk = K;
  cfg.dtype = DType::kBF16;
  DispatchArgs a;
  a.x = TensorView{x.data(), DType::kBF16, {T, 16}};
  a.topk_idx = TensorView{idx.data(), DType::kInt64, {T, K}};
  a.topk_weights = TensorView{w.data(), DType::kFP32, {T, K}};
  ep::Routing r(R, E, T, K);
  std::vector<uint8_t> masked(R, 0);
  std::vector<char> junk(64 << 20, 1);
  for (int cold = 0; cold < 2; ++cold) {
    double best = 1e9, sum = 0;
    int n = 30;
    for (int i = 0; i < n; ++i) {
      if (cold) {
        for (size_t k = 0; k < junk.size(); k += 64) junk[k]++;
      }
      auto t0 = std::chrono::steady_clock::now();
      r.build(a, cfg, masked.data());
      double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, us);
      sum += us;
    }
    std::printf("%s: best %.1f us mean %.1f us\n", cold ? "cold" : "hot", best, sum / n);
  }
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 30; ++i) ep::validate_dispatch(a, cfg);
    std::printf(
        "validate (hot): %.1f us\n",
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
            30);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 30; ++i) protocol::check_expert_ids(a, cfg);
    std::printf(
        "check_expert_ids (hot): %.1f us\n",
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
            30);
  }
}
