// The fp8 e4m3 row codec (ubep/fp8.hpp): per 128-channel block, amax over the finite values,
// the scale, then every value times the inverse scale rounded to e4m3. Written as plain loops
// over a block with branch-free conversions so they vectorize (built for several instruction
// sets); FMA contraction is off project-wide, so every variant gives the scalar functions' bits.
#include <cmath>

#include "ubep/bf16.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"

// Not under clang (the fuzz build): clang 14 has no target_clones on function templates.
#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define UBEP_FP8_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define UBEP_FP8_MULTIVERSION
#endif

namespace ubep {

namespace {

// One block of n <= 128 values: the scale, and the codes.
template <typename Elem>
UBEP_FP8_MULTIVERSION float quantize_block(const Elem* __restrict src, int64_t n, bool pow2,
                                           uint8_t* __restrict codes) {
  float v[kFp8BlockSize];
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (sizeof(Elem) == 2)
      v[i] = bf16_to_float(src[i]);
    else
      v[i] = src[i];
  }
  // amax over finite values only: one Inf must not wipe out the rest of its block (it
  // saturates to +-448 * scale instead); NaN compares false and is skipped too.
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    amax = (a > amax && a <= 3.402823466e38f) ? a : amax;
  }
  const float scale = fp8_block_scale(amax, pow2);
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < n; ++i) codes[i] = float_to_e4m3(v[i] * inv);
  return scale;
}

template <typename Elem>
void quantize_rows(const Elem* src, int64_t rows, int64_t hidden, bool pow2, uint8_t* codes,
                   float* scales) {
  const int64_t blocks = fp8_scales_per_row(hidden);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = r * hidden + b * kFp8BlockSize;
      const int64_t n = b + 1 < blocks ? kFp8BlockSize : hidden - b * kFp8BlockSize;
      scales[r * blocks + b] = quantize_block(src + at, n, pow2, codes + at);
    }
}

}  // namespace

void fp8_quantize_rows(const void* src, DType src_dtype, int64_t rows, int64_t hidden, bool pow2,
                       uint8_t* codes, float* scales) {
  UBEP_CHECK_ARG(src_dtype == DType::kBF16 || src_dtype == DType::kFP32,
                 "fp8_quantize_rows: source dtype must be bf16 or fp32, got ",
                 dtype_name(src_dtype));
  UBEP_CHECK_ARG(rows >= 0 && hidden >= 1, "fp8_quantize_rows: bad shape [", rows, ", ", hidden,
                 "]");
  if (src_dtype == DType::kBF16)
    quantize_rows(static_cast<const uint16_t*>(src), rows, hidden, pow2, codes, scales);
  else
    quantize_rows(static_cast<const float*>(src), rows, hidden, pow2, codes, scales);
}

void fp8_dequantize_rows(const uint8_t* codes, const float* scales, int64_t rows, int64_t hidden,
                         float* out) {
  const int64_t blocks = fp8_scales_per_row(hidden);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < hidden; ++h)
      out[r * hidden + h] =
          e4m3_to_float(codes[r * hidden + h]) * scales[r * blocks + h / kFp8BlockSize];
}

}  // namespace ubep
