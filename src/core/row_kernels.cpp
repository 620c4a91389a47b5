#include "core/row_kernels.hpp"

#include <algorithm>
#include <cstring>

#include "core/bf16.hpp"

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define UBEP_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define UBEP_MULTIVERSION
#endif

namespace ubep::kernels {

namespace {

UBEP_MULTIVERSION void add_bf16(float* __restrict a, const uint16_t* __restrict v, int64_t n) {
  for (int64_t h = 0; h < n; ++h) a[h] += bf16_to_float(v[h]);
}
UBEP_MULTIVERSION void add_bf16_w(float* __restrict a, const uint16_t* __restrict v, int64_t n, float w) {
  for (int64_t h = 0; h < n; ++h) a[h] += w * bf16_to_float(v[h]);
}
UBEP_MULTIVERSION void add_f32(float* __restrict a, const float* __restrict v, int64_t n) {
  for (int64_t h = 0; h < n; ++h) a[h] += v[h];
}
UBEP_MULTIVERSION void add_f32_w(float* __restrict a, const float* __restrict v, int64_t n, float w) {
  for (int64_t h = 0; h < n; ++h) a[h] += w * v[h];
}
UBEP_MULTIVERSION void store_bf16(uint16_t* __restrict o, const float* __restrict a, int64_t n) {
  for (int64_t h = 0; h < n; ++h) o[h] = float_to_bf16(a[h]);
}

constexpr int64_t kChunk = 512;

template <typename Elem>
inline float load_elem(const Elem* p, int64_t i) {
  if constexpr (sizeof(Elem) == 2) return bf16_to_float(p[i]);
  else return p[i];
}

template <typename Elem>
UBEP_MULTIVERSION void reduce_chunked(Elem* __restrict out, int64_t hidden, const void* const* rows,
                                      const float* weights, int n) {
  alignas(64) float acc[kChunk];
  for (int64_t base = 0; base < hidden; base += kChunk) {
    const int64_t m = std::min(kChunk, hidden - base);
    for (int64_t h = 0; h < m; ++h) acc[h] = 0.0f;
    for (int r = 0; r < n; ++r) {
      const Elem* __restrict v = static_cast<const Elem*>(rows[r]) + base;
      if (weights) {
        const float w = weights[r];
        for (int64_t h = 0; h < m; ++h) acc[h] += w * load_elem(v, h);
      } else {
        for (int64_t h = 0; h < m; ++h) acc[h] += load_elem(v, h);
      }
    }
    if constexpr (sizeof(Elem) == 2) {
      for (int64_t h = 0; h < m; ++h) out[base + h] = float_to_bf16(acc[h]);
    } else {
      for (int64_t h = 0; h < m; ++h) out[base + h] = acc[h];
    }
  }
}

}  // namespace

void reduce_rows(void* out, DType dtype, int64_t hidden, const void* const* rows, const float* weights, int n) {
  if (dtype == DType::kBF16) reduce_chunked(static_cast<uint16_t*>(out), hidden, rows, weights, n);
  else reduce_chunked(static_cast<float*>(out), hidden, rows, weights, n);
}

void accumulate_row(float* acc, const void* row, DType dtype, int64_t hidden) {
  if (dtype == DType::kBF16) add_bf16(acc, static_cast<const uint16_t*>(row), hidden);
  else add_f32(acc, static_cast<const float*>(row), hidden);
}

void accumulate_row_weighted(float* acc, const void* row, DType dtype, int64_t hidden, float weight) {
  if (dtype == DType::kBF16) add_bf16_w(acc, static_cast<const uint16_t*>(row), hidden, weight);
  else add_f32_w(acc, static_cast<const float*>(row), hidden, weight);
}

void store_row(void* dst, const float* acc, DType dtype, int64_t hidden) {
  if (dtype == DType::kBF16) store_bf16(static_cast<uint16_t*>(dst), acc, hidden);
  else std::memcpy(dst, acc, static_cast<size_t>(hidden) * sizeof(float));
}

}  // namespace ubep::kernels
