#include "backend/cpu/row_kernels.hpp"

#include <algorithm>
#include <cstring>

#include "backend/cpu/reduce_bf16.hpp"
#include "ubep/bf16.hpp"

// Not under clang (the fuzz build): clang 14 has no target_clones on function templates.
#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define UBEP_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#define UBEP_STREAM_STORES 1
#include <immintrin.h>
#else
#define UBEP_MULTIVERSION
#endif

namespace ubep::kernels {

namespace {

UBEP_MULTIVERSION void add_bf16(float* __restrict a, const uint16_t* __restrict v, int64_t n) {
  for (int64_t h = 0; h < n; ++h) a[h] += bf16_to_float(v[h]);
}
UBEP_MULTIVERSION void add_bf16_w(float* __restrict a, const uint16_t* __restrict v, int64_t n,
                                  float w) {
  for (int64_t h = 0; h < n; ++h) a[h] += w * bf16_to_float(v[h]);
}
UBEP_MULTIVERSION void add_f32(float* __restrict a, const float* __restrict v, int64_t n) {
  for (int64_t h = 0; h < n; ++h) a[h] += v[h];
}
UBEP_MULTIVERSION void add_f32_w(float* __restrict a, const float* __restrict v, int64_t n,
                                 float w) {
  for (int64_t h = 0; h < n; ++h) a[h] += w * v[h];
}
UBEP_MULTIVERSION void store_bf16(uint16_t* __restrict o, const float* __restrict a, int64_t n) {
  for (int64_t h = 0; h < n; ++h) o[h] = float_to_bf16(a[h]);
}

constexpr int64_t kChunk = 512;

template <typename Elem>
inline float load_elem(const Elem* p, int64_t i) {
  if constexpr (sizeof(Elem) == 2)
    return bf16_to_float(p[i]);
  else
    return p[i];
}

// Fixed row counts: the per-element sum over the rows is unrolled, so the loop over h vectorises
// with the accumulator in a register (same operations, same order: ((0 + w0*r0) + w1*r1) + ...).
template <typename Elem, int N, bool Weighted>
UBEP_MULTIVERSION void reduce_fixed(Elem* __restrict out, int64_t hidden, const void* const* rows,
                                    const float* weights) {
  const Elem* v[N];
  float w[N];
  for (int r = 0; r < N; ++r) {
    v[r] = static_cast<const Elem*>(rows[r]);
    w[r] = Weighted ? weights[r] : 1.0f;
  }
  for (int64_t h = 0; h < hidden; ++h) {
    float a = 0.0f;
    for (int r = 0; r < N; ++r) {
      if constexpr (Weighted)
        a += w[r] * load_elem(v[r], h);
      else
        a += load_elem(v[r], h);
    }
    if constexpr (sizeof(Elem) == 2)
      out[h] = float_to_bf16(a);
    else
      out[h] = a;
  }
}

template <typename Elem, bool Weighted>
bool reduce_small(Elem* out, int64_t hidden, const void* const* rows, const float* weights, int n) {
  switch (n) {
    case 1:
      reduce_fixed<Elem, 1, Weighted>(out, hidden, rows, weights);
      return true;
    case 2:
      reduce_fixed<Elem, 2, Weighted>(out, hidden, rows, weights);
      return true;
    case 3:
      reduce_fixed<Elem, 3, Weighted>(out, hidden, rows, weights);
      return true;
    case 4:
      reduce_fixed<Elem, 4, Weighted>(out, hidden, rows, weights);
      return true;
    case 8:
      reduce_fixed<Elem, 8, Weighted>(out, hidden, rows, weights);
      return true;
    default:
      return false;
  }
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

#ifdef UBEP_STREAM_STORES
namespace {
__attribute__((target("avx512f"))) void stream_avx512(void* dst, const void* src, size_t n64) {
  auto* d = static_cast<__m512i*>(dst);
  const auto* s = static_cast<const __m512i*>(src);
  for (size_t i = 0; i < n64; ++i) _mm512_stream_si512(d + i, _mm512_loadu_si512(s + i));
}
// 32-byte stores where the CPU has AVX2 but not AVX-512F: 4% faster than 16-byte ones for a
// decode dispatch's 1024 rows of 14 KiB out of cache (712-716 against 739-754 us, one core of
// the Zen 4 VM, alternated).
__attribute__((target("avx2"))) void stream_avx2(void* dst, const void* src, size_t n64) {
  auto* d = static_cast<__m256i*>(dst);
  const auto* s = static_cast<const __m256i*>(src);
  for (size_t i = 0; i < 2 * n64; ++i) _mm256_stream_si256(d + i, _mm256_loadu_si256(s + i));
}
void stream_sse2(void* dst, const void* src, size_t n64) {
  auto* d = static_cast<__m128i*>(dst);
  const auto* s = static_cast<const __m128i*>(src);
  for (size_t i = 0; i < 4 * n64; ++i) _mm_stream_si128(d + i, _mm_loadu_si128(s + i));
}
const bool kHaveAvx512 = __builtin_cpu_supports("avx512f");
const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
}  // namespace
#endif

bool stream_row_to_peer(void* dst, const void* src, size_t bytes) {
#ifdef UBEP_STREAM_STORES
  // The whole lines inside [dst, dst + bytes) stream; a partial line at either end takes plain
  // stores (a non-temporal store of part of a line costs a partial write to memory). So short
  // spans that are not line-aligned stream too: an fp8 row's 224 bytes of scales are 3 whole
  // lines and one half line, where plain stores would each first fetch the line from the core
  // that last read it (its receiver).
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63;
  if (bytes >= head + 64) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t n64 = (bytes - head) / 64, tail = (bytes - head) % 64;
    if (head) std::memcpy(d, s, head);
    if (kHaveAvx512)
      stream_avx512(d + head, s + head, n64);
    else if (kHaveAvx2)
      stream_avx2(d + head, s + head, n64);
    else
      stream_sse2(d + head, s + head, n64);
    if (tail) std::memcpy(d + head + n64 * 64, s + head + n64 * 64, tail);
    return true;
  }
#endif
  std::memcpy(dst, src, bytes);
  return false;
}

void store_fence() {
#ifdef UBEP_STREAM_STORES
  _mm_sfence();
#endif
}

void prefetch_for_write(const void* dst, size_t bytes) {
  const auto* p = static_cast<const char*>(dst);
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63);
  for (uintptr_t line = first; line < reinterpret_cast<uintptr_t>(p) + bytes; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line), 1);
}

void copy_row_to_peer(void* dst, const void* src, size_t bytes) {
  if (stream_row_to_peer(dst, src, bytes)) store_fence();
}

void reduce_rows(void* out, DType dtype, int64_t hidden, const void* const* rows,
                 const float* weights, int n, bool stream, const void* const* next_rows, int next_n,
                 bool prefetch) {
  if (dtype == DType::kBF16 &&
      reduce_bf16_vector(static_cast<uint16_t*>(out), hidden, rows, weights, n, -1, stream,
                         {next_rows, next_n}, prefetch))
    return;
  reduce_rows_portable(out, dtype, hidden, rows, weights, n);
}

void reduce_rows_portable(void* out, DType dtype, int64_t hidden, const void* const* rows,
                          const float* weights, int n) {
  if (dtype == DType::kBF16) {
    auto* o = static_cast<uint16_t*>(out);
    if (weights ? reduce_small<uint16_t, true>(o, hidden, rows, weights, n)
                : reduce_small<uint16_t, false>(o, hidden, rows, weights, n))
      return;
    reduce_chunked(o, hidden, rows, weights, n);
  } else {
    auto* o = static_cast<float*>(out);
    if (weights ? reduce_small<float, true>(o, hidden, rows, weights, n)
                : reduce_small<float, false>(o, hidden, rows, weights, n))
      return;
    reduce_chunked(o, hidden, rows, weights, n);
  }
}

void accumulate_row(float* acc, const void* row, DType dtype, int64_t hidden) {
  if (dtype == DType::kBF16)
    add_bf16(acc, static_cast<const uint16_t*>(row), hidden);
  else
    add_f32(acc, static_cast<const float*>(row), hidden);
}

void accumulate_row_weighted(float* acc, const void* row, DType dtype, int64_t hidden,
                             float weight) {
  if (dtype == DType::kBF16)
    add_bf16_w(acc, static_cast<const uint16_t*>(row), hidden, weight);
  else
    add_f32_w(acc, static_cast<const float*>(row), hidden, weight);
}

void store_row(void* dst, const float* acc, DType dtype, int64_t hidden) {
  if (dtype == DType::kBF16)
    store_bf16(static_cast<uint16_t*>(dst), acc, hidden);
  else
    std::memcpy(dst, acc, static_cast<size_t>(hidden) * sizeof(float));
}

}  // namespace ubep::kernels
