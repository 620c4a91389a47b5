// Helpers of the GPU tests and the IPC smoke test (no GoogleTest: the GPU machine has none):
// device copies of the reference problem, and bit-exact checks of dispatch and combine results
// against tests/reference.cpp.
#pragma once

#if !defined(UBEP_CUDA_HOST_SIM)
#include <cuda_runtime.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference.hpp"
#include "ubep/error.hpp"

namespace ubep::gpu_test {

inline constexpr int kSkip = 77;  // ctest SKIP_RETURN_CODE

#if defined(UBEP_CUDA_HOST_SIM)
// The CPU simulation (test_cuda_sim.cpp): "device" memory is host memory.
struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t n) : p(std::aligned_alloc(256, (n + 255) / 256 * 256 + 256)) {
    std::memset(p, 0, (n + 255) / 256 * 256 + 256);
  }
  ~DevMem() { std::free(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};
inline void upload(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}
template <typename T>
std::vector<T> download(const void* src, size_t count) {
  std::vector<T> v(count);
  if (count) std::memcpy(v.data(), src, count * sizeof(T));
  return v;
}
#else
inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t n) { ck(cudaMalloc(&p, n ? n : 16), "cudaMalloc"); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};

inline void upload(void* dst, const void* src, size_t n) {
  if (n) ck(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "upload");
}
template <typename T>
std::vector<T> download(const void* src, size_t count) {
  std::vector<T> v(count);
  if (count) ck(cudaMemcpy(v.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return v;
}
#endif

inline TensorView on_device(void* p, DType t, std::initializer_list<int64_t> dims) {
  TensorView v(p, t, dims);
  v.device = {DeviceType::kCuda, 0};
  return v;
}

// One rank's inputs on the device.
struct RankInputs {
  std::unique_ptr<DevMem> x, idx, w;
  DispatchArgs args;
  RankInputs(const test::Problem& p, int r, Layout layout) {
    const test::RankInput& in = p.inputs[static_cast<size_t>(r)];
    const size_t xb = static_cast<size_t>(in.tokens * p.hidden) * dtype_size(p.dtype);
    x = std::make_unique<DevMem>(xb);
    idx = std::make_unique<DevMem>(in.topk_idx.size() * 8);
    w = std::make_unique<DevMem>(in.topk_weights.size() * 4);
    upload(x->p,
           p.dtype == DType::kBF16 ? static_cast<const void*>(in.x_bf16.data()) : in.x_f32.data(),
           xb);
    upload(idx->p, in.topk_idx.data(), in.topk_idx.size() * 8);
    upload(w->p, in.topk_weights.data(), in.topk_weights.size() * 4);
    args.x = on_device(x->p, p.dtype, {in.tokens, p.hidden});
    args.topk_idx = on_device(idx->p, DType::kInt64, {in.tokens, in.topk});
    args.topk_weights = on_device(w->p, DType::kFP32, {in.tokens, in.topk});
    args.layout = layout;
  }
};

inline std::string fail(const std::string& what) { throw std::runtime_error(what); }

inline bool same_row(const test::Problem& p, int s, int64_t t, const char* row) {
  const test::RankInput& in = p.inputs[static_cast<size_t>(s)];
  const size_t rb = static_cast<size_t>(p.hidden) * dtype_size(p.dtype);
  const char* want =
      p.dtype == DType::kBF16
          ? reinterpret_cast<const char*>(in.x_bf16.data()) + static_cast<size_t>(t) * rb
          : reinterpret_cast<const char*>(in.x_f32.data()) + static_cast<size_t>(t) * rb;
  return std::memcmp(want, row, rb) == 0;
}

// Checks rank d's dispatch outputs (device views, after synchronisation) bit for bit, and
// returns the combine input the reference's expert function gives (host, shaped like recv_x).
inline std::vector<char> check_dispatch(const test::Problem& p, int d, const DispatchResult& r,
                                        int64_t num_rows, int El, int64_t RT, int topk) {
  const test::ExpectedDispatch ex = test::expected_dispatch(p, d);
  const size_t rb = static_cast<size_t>(p.hidden) * dtype_size(p.dtype);
  const auto counts = download<int64_t>(r.recv_count.data, static_cast<size_t>(El));
  for (int le = 0; le < El; ++le)
    if (counts[static_cast<size_t>(le)] !=
        static_cast<int64_t>(ex.expert_rows[static_cast<size_t>(le)].size()))
      fail("rank " + std::to_string(d) + " recv_count[" + std::to_string(le) +
           "] = " + std::to_string(counts[static_cast<size_t>(le)]) + ", want " +
           std::to_string(ex.expert_rows[static_cast<size_t>(le)].size()));
  std::vector<char> comb(static_cast<size_t>(r.recv_x.numel()) * dtype_size(p.dtype));
  auto expert_row = [&](int64_t s, int64_t t, int64_t which, char* out) {
    for (int64_t h = 0; h < p.hidden; ++h)
      store_value(out, h, test::expert_fn(p.value(static_cast<int>(s), t, h), which), p.dtype);
  };
  if (r.layout == Layout::kThroughput) {
    if (num_rows != static_cast<int64_t>(ex.src.size()))
      fail("rank " + std::to_string(d) + " received " + std::to_string(num_rows) + " rows, want " +
           std::to_string(ex.src.size()));
    const auto x = download<char>(r.recv_x.data, static_cast<size_t>(num_rows) * rb);
    const auto src = download<int64_t>(r.recv_src.data, static_cast<size_t>(num_rows) * 2);
    const auto idx = download<int32_t>(r.recv_topk_idx.data, static_cast<size_t>(num_rows * topk));
    const auto w = download<float>(r.recv_topk_weights.data, static_cast<size_t>(num_rows * topk));
    for (int64_t i = 0; i < num_rows; ++i) {
      const auto& e = ex.src[static_cast<size_t>(i)];
      const std::string at = "rank " + std::to_string(d) + " row " + std::to_string(i);
      if (src[static_cast<size_t>(2 * i)] != e[0] || src[static_cast<size_t>(2 * i + 1)] != e[1])
        fail(at + ": recv_src differs");
      if (!same_row(p, static_cast<int>(e[0]), e[1], x.data() + static_cast<size_t>(i) * rb))
        fail(at + ": recv_x differs");
      for (int j = 0; j < topk; ++j) {
        const size_t k = static_cast<size_t>(i * topk + j);
        if (idx[k] != ex.local_idx[static_cast<size_t>(i)][static_cast<size_t>(j)] ||
            std::memcmp(&w[k], &ex.weights[static_cast<size_t>(i)][static_cast<size_t>(j)], 4) != 0)
          fail(at + ": recv_topk_idx/weights differ at k " + std::to_string(j));
      }
      expert_row(e[0], e[1], d, comb.data() + static_cast<size_t>(i) * rb);
    }
  } else {
    for (int le = 0; le < El; ++le) {
      const auto& rows = ex.expert_rows[static_cast<size_t>(le)];
      const size_t base = static_cast<size_t>(le * RT);
      const auto x =
          download<char>(static_cast<char*>(r.recv_x.data) + base * rb, rows.size() * rb);
      const auto src =
          download<int64_t>(static_cast<int64_t*>(r.recv_src.data) + 2 * base, rows.size() * 2);
      for (size_t q = 0; q < rows.size(); ++q) {
        const std::string at = "rank " + std::to_string(d) + " expert " + std::to_string(le) +
                               " slot " + std::to_string(q);
        if (src[2 * q] != rows[q][0] || src[2 * q + 1] != rows[q][1])
          fail(at + ": recv_src differs");
        if (!same_row(p, static_cast<int>(rows[q][0]), rows[q][1], x.data() + q * rb))
          fail(at + ": recv_x differs");
        expert_row(rows[q][0], rows[q][1], d * El + le, comb.data() + (base + q) * rb);
      }
    }
  }
  return comb;
}

// Checks rank me's combine output against expected (floats rounded to the dtype), bit for bit.
inline void check_combine(const test::Problem& p, int me, const TensorView& y,
                          const std::vector<float>& want) {
  const int64_t n = p.inputs[static_cast<size_t>(me)].tokens;
  const auto got = download<char>(y.data, static_cast<size_t>(n * p.hidden) * dtype_size(p.dtype));
  for (int64_t i = 0; i < n * p.hidden; ++i) {
    const float g = load_value(got.data(), i, p.dtype), w = want[static_cast<size_t>(i)];
    if (std::memcmp(&g, &w, 4) != 0)
      fail("rank " + std::to_string(me) + " combine element " + std::to_string(i) + ": got " +
           std::to_string(g) + ", want " + std::to_string(w) + " (bits differ)");
  }
}

// Expected combine when every expert is the identity (combine input = recv_x): the fixed-order
// sum of the stored inputs, weighted in the latency layout.
inline std::vector<float> expected_identity(const test::Problem& p, int me, Layout layout) {
  const test::RankInput& in = p.inputs[static_cast<size_t>(me)];
  const int El = p.experts / p.ranks;
  std::vector<float> y(static_cast<size_t>(in.tokens * p.hidden));
  for (int64_t t = 0; t < in.tokens; ++t)
    for (int64_t h = 0; h < p.hidden; ++h) {
      const float v = p.value(me, t, h);
      float acc = 0.0f;
      if (layout == Layout::kThroughput) {
        for (int r = 0; r < p.ranks; ++r) {
          bool sent = false;
          for (int j = 0; j < in.topk; ++j) {
            const int64_t e = in.topk_idx[static_cast<size_t>(t * in.topk + j)];
            sent = sent || (e >= 0 && e / El == r);
          }
          if (sent) acc += v;
        }
      } else {
        for (int j = 0; j < in.topk; ++j) {
          if (in.topk_idx[static_cast<size_t>(t * in.topk + j)] < 0) continue;
          const float prod = in.topk_weights[static_cast<size_t>(t * in.topk + j)] * v;
          acc += prod;
        }
      }
      y[static_cast<size_t>(t * p.hidden + h)] = test::stored(acc, p.dtype);
    }
  return y;
}

}  // namespace ubep::gpu_test
