// Helpers of the GPU tests and the IPC smoke test (no GoogleTest: the GPU machine has none):
// device copies of the reference problem, and bit-exact checks of dispatch and combine results
// against tests/reference.cpp.
//
// Two host-memory builds: UBEP_CUDA_HOST_SIM (test_cuda_sim: the kernels driven directly, views
// still say cuda:0) and UBEP_GPU_TESTS_ON_SIM (the GPU tests' cases on a Buffer on the CUDA
// simulation device, cuda-sim:0, so their logic runs without a GPU).
#pragma once

#if defined(UBEP_CUDA_HOST_SIM) || defined(UBEP_GPU_TESTS_ON_SIM)
#define UBEP_GPU_TEST_HOST_MEMORY 1
#else
#include <cuda_runtime.h>
#endif

#include <array>
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

// The device the tests' tensors and Buffers are on.
#if defined(UBEP_GPU_TESTS_ON_SIM)
inline constexpr Device kTestDevice{DeviceType::kCudaSim, 0};
#else
inline constexpr Device kTestDevice{DeviceType::kCuda, 0};
#endif

#if defined(UBEP_GPU_TEST_HOST_MEMORY)
// The CPU simulation: "device" memory is host memory.
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
  v.device = kTestDevice;
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

// How many rows a throughput-layout result's views have.
enum class ResultRows {
  kCapacity,  // always ranks * max_tokens (the kernels' own views, test_cuda_sim)
  kAsBuffer,  // ubep::Buffer's contract: compact placement by the received count, per-source
              // by capacity (ubep/buffer.hpp, DispatchResult::recv_range)
};

// Checks rank d's dispatch outputs (device views, after synchronisation) bit for bit in the
// result's placement: recv_count, every source's (begin, count) in recv_range against the
// reference (per-source: begin = source * max_tokens; compact: the rows of the lower sources),
// the shape of the views (`shape`), and every row inside the ranges. Returns the combine input
// the reference's expert function gives (host, shaped like recv_x, rows in the placement) and,
// in *packed, the same rows in compact() order (by local expert, then source, then token).
inline std::vector<char> check_dispatch(const test::Problem& p, int d, const DispatchResult& r,
                                        int64_t num_rows, int El, int64_t RT, int topk,
                                        std::vector<char>* packed = nullptr,
                                        ResultRows shape = ResultRows::kCapacity) {
  const test::ExpectedDispatch ex = test::expected_dispatch(p, d);
  const int R = p.ranks;
  const int64_t T = RT / R;
  const bool per_source = r.placement == Placement::kPerSource;
  const bool latency = r.layout == Layout::kLatency;
  const size_t rb = static_cast<size_t>(p.hidden) * dtype_size(p.dtype);
  const std::string me = "rank " + std::to_string(d) + " (" + placement_name(r.placement) + ")";
  const auto counts = download<int64_t>(r.recv_count.data, static_cast<size_t>(El));
  for (int le = 0; le < El; ++le)
    if (counts[static_cast<size_t>(le)] !=
        static_cast<int64_t>(ex.expert_rows[static_cast<size_t>(le)].size()))
      fail(me + " recv_count[" + std::to_string(le) +
           "] = " + std::to_string(counts[static_cast<size_t>(le)]) + ", want " +
           std::to_string(ex.expert_rows[static_cast<size_t>(le)].size()));
  const int groups = latency ? El : 1;
  if (r.recv_range.numel() != static_cast<int64_t>(groups) * R * 2 ||
      r.recv_range.dtype != DType::kInt64)
    fail(me + " recv_range is " + r.recv_range.describe());
  const auto range = download<int64_t>(r.recv_range.data, static_cast<size_t>(groups * R * 2));
  std::vector<char> comb(static_cast<size_t>(r.recv_x.numel()) * dtype_size(p.dtype));
  std::vector<char> dense;
  auto expert_row = [&](int64_t s, int64_t t, int64_t which, char* out) {
    for (int64_t h = 0; h < p.hidden; ++h)
      store_value(out, h, test::expert_fn(p.value(static_cast<int>(s), t, h), which), p.dtype);
  };
  if (!latency && num_rows != static_cast<int64_t>(ex.src.size()))
    fail(me + " received " + std::to_string(num_rows) + " rows, want " +
         std::to_string(ex.src.size()));
  const bool by_count = shape == ResultRows::kAsBuffer && !per_source;
  const int64_t want_rows = by_count ? num_rows : RT;
  if (!latency)
    for (const TensorView* v : {&r.recv_x, &r.recv_topk_idx, &r.recv_topk_weights, &r.recv_src})
      if (v->dim(0) != want_rows)
        fail(me + " throughput result view " + v->describe() + " has " + std::to_string(v->dim(0)) +
             " rows, want " + std::to_string(want_rows) +
             (by_count ? " (the received rows)" : " (capacity)"));
  const auto x =
      download<char>(r.recv_x.data, static_cast<size_t>(r.recv_x.numel()) * dtype_size(p.dtype));
  const auto src = download<int64_t>(r.recv_src.data, static_cast<size_t>(r.recv_src.numel()));
  std::vector<int32_t> idx;
  std::vector<float> w;
  if (!latency) {
    idx = download<int32_t>(r.recv_topk_idx.data, static_cast<size_t>(r.recv_topk_idx.numel()));
    w = download<float>(r.recv_topk_weights.data, static_cast<size_t>(r.recv_topk_weights.numel()));
  }
  for (int le = 0; le < groups; ++le) {
    // The reference's rows of this expert (latency) or of all (throughput): by source, token.
    std::vector<std::array<int64_t, 2>> want =
        latency ? ex.expert_rows[static_cast<size_t>(le)] : ex.src;
    size_t next = 0;  // index in `want` (compact order within this group)
    int64_t lower = 0;
    for (int s = 0; s < R; ++s) {
      int64_t n = 0;
      for (const auto& row : want) n += row[0] == s;
      const int64_t begin = per_source ? s * T : lower;
      lower += n;
      const int64_t* got = &range[static_cast<size_t>(2 * (le * (latency ? R : 0) + s))];
      const std::string at =
          me + (latency ? " expert " + std::to_string(le) : "") + " source " + std::to_string(s);
      if (got[0] != begin || got[1] != n)
        fail(at + ": recv_range (" + std::to_string(got[0]) + ", " + std::to_string(got[1]) +
             "), want (" + std::to_string(begin) + ", " + std::to_string(n) + ")");
      for (int64_t q = 0; q < n; ++q, ++next) {
        const auto& e = want[next];
        const size_t pos = static_cast<size_t>((latency ? le * RT : 0) + begin + q);
        const std::string row_at = at + " row " + std::to_string(q);
        if (src[2 * pos] != e[0] || src[2 * pos + 1] != e[1]) fail(row_at + ": recv_src differs");
        if (!same_row(p, static_cast<int>(e[0]), e[1], x.data() + pos * rb))
          fail(row_at + ": recv_x differs");
        if (!latency)
          for (int j = 0; j < topk; ++j) {
            const size_t k = pos * static_cast<size_t>(topk) + static_cast<size_t>(j);
            if (idx[k] != ex.local_idx[next][static_cast<size_t>(j)] ||
                std::memcmp(&w[k], &ex.weights[next][static_cast<size_t>(j)], 4) != 0)
              fail(row_at + ": recv_topk_idx/weights differ at k " + std::to_string(j));
          }
        expert_row(e[0], e[1], latency ? d * El + le : d, comb.data() + pos * rb);
        dense.insert(dense.end(), comb.data() + pos * rb, comb.data() + (pos + 1) * rb);
      }
    }
  }
  if (packed) *packed = std::move(dense);
  return comb;
}

// Checks compact()'s output of rank d (device) against the reference's rows in compact order:
// by local expert (latency), then source, then token. kCapacity: the first rows are valid;
// kAsBuffer: exactly the valid rows ([valid rows, hidden], Buffer::compact's contract).
inline void check_compacted(const test::Problem& p, int d, Layout layout, const TensorView& c,
                            ResultRows shape = ResultRows::kCapacity) {
  const test::ExpectedDispatch ex = test::expected_dispatch(p, d);
  std::vector<std::array<int64_t, 2>> want = ex.src;
  if (layout == Layout::kLatency) {
    want.clear();
    for (const auto& rows : ex.expert_rows) want.insert(want.end(), rows.begin(), rows.end());
  }
  const size_t rb = static_cast<size_t>(p.hidden) * dtype_size(p.dtype);
  const auto rows = static_cast<int64_t>(want.size());
  const bool rows_ok = shape == ResultRows::kAsBuffer ? c.dim(0) == rows : c.dim(0) >= rows;
  if (c.ndim != 2 || !rows_ok || c.dim(1) != p.hidden)
    fail("rank " + std::to_string(d) + " compact() is " + c.describe() + ", want " +
         std::to_string(rows) + " valid rows of " + std::to_string(p.hidden));
  const auto x = download<char>(c.data, want.size() * rb);
  for (size_t i = 0; i < want.size(); ++i)
    if (!same_row(p, static_cast<int>(want[i][0]), want[i][1], x.data() + i * rb))
      fail("rank " + std::to_string(d) + " compact() row " + std::to_string(i) + " differs");
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
