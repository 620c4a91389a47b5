#include "core/row_kernels.hpp"

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

}  // namespace

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
