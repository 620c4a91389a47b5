// The fp8 e4m3 row codec (ubep/fp8.hpp): per 128-channel block, amax over the finite values,
// the scale, then every value times the inverse scale rounded to e4m3. The portable kernels are
// plain loops over the scalar functions of fp8.hpp; full blocks go through the AVX-512F or AVX2
// kernels (fp8_avx512.cpp, fp8_avx2.cpp) where the CPU has them, which compute the same bits. FMA
// contraction is off project-wide, so every product is rounded once, as the scalar functions round
// it.
#include <cmath>

#include "core/fp8_blocks.hpp"
#include "ubep/bf16.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"

namespace ubep {
namespace fp8_blocks {
namespace {

// One block of n <= 128 values: the scale, and the codes.
template <typename Elem>
float quantize_block_portable(const Elem* __restrict src, int64_t n, bool pow2,
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

float quantize_any(const void* src, bool bf16, int64_t n, bool pow2, uint8_t* codes) {
  return bf16 ? quantize_block_portable(static_cast<const uint16_t*>(src), n, pow2, codes)
              : quantize_block_portable(static_cast<const float*>(src), n, pow2, codes);
}

}  // namespace

int best_level() {
#if defined(__x86_64__)
  static const int level = __builtin_cpu_supports("avx512f") ? kAvx512
                           : __builtin_cpu_supports("avx2")  ? kAvx2
                                                             : kPortable;
  return level;
#else
  return kPortable;
#endif
}

float quantize_block(const void* src, bool bf16, bool pow2, uint8_t* codes, int level) {
  if (level == kAvx512) return quantize_block_avx512(src, bf16, pow2, codes);
  if (level == kAvx2) return quantize_block_avx2(src, bf16, pow2, codes);
  return quantize_any(src, bf16, kFp8BlockSize, pow2, codes);
}

void dequantize_block(const uint8_t* codes, float scale, float* out, int level) {
  if (level == kAvx512) return dequantize_block_avx512(codes, scale, out);
  if (level == kAvx2) return dequantize_block_avx2(codes, scale, out);
  for (int64_t i = 0; i < kFp8BlockSize; ++i) out[i] = e4m3_to_float(codes[i]) * scale;
}

namespace {

// Blocks the AVX2 path takes at a time (quantize_full_blocks).
constexpr int64_t kChunk = 8;

// m <= kChunk full bf16 blocks with the AVX2 kernels. A block's range pass gives its largest and
// smallest magnitude; when every value is finite the largest is the amax (the same bits as the
// finite-only amax), and when the smallest, scaled, is at least 2^-6 every value is in e4m3's
// normal range (a product with the same factor is monotonic in the other, and the largest
// scaled value is 448 within rounding): such a block takes the normal-branch encoder, the rest
// the general one. Activations rarely hold zeros or values 2^15 below their block's amax.
// 128 rows of 7168 on one core of the Zen 3 VM (ubep-kernel-timing, 6 alternations, fastest):
// 347 us with the general encoder alone, 253 us so (docs/PERFORMANCE.md, issue 31).
void quantize_bf16_chunk(const char* src, int64_t m, bool pow2, uint8_t* codes, float* scales) {
  float inv[kChunk];
  bool normal[kChunk];
  for (int64_t i = 0; i < m; ++i) {
    const auto* block = reinterpret_cast<const uint16_t*>(src) + i * kFp8BlockSize;
    // The source 2 KiB on (the next chunk of 8 blocks, or the next row's: rows are contiguous),
    // fetched while this chunk is worked on. A cast dispatch finds its x out of cache, and the
    // hardware's prefetch alone left the kernel waiting on its loads: 128 rows of 7168 out of
    // cache 450 -> 304 us (medians of 8 alternations, one core of the Zen 3 VM, then pair ratio
    // 0.81 over 8 more, in cache 0.97; 4 and 8 KiB on, and the codes' lines fetched for writing
    // too, were slower). An address past the source's end is only a hint (a prefetch never faults),
    // computed as an integer.
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(block) + 2048;
    for (uintptr_t line = 0; line < 256; line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(ahead + line));
    uint16_t largest, smallest;
    block_range_bf16_avx2(block, &largest, &smallest);
    const bool finite = largest < 0x7f80;
    scales[i] =
        fp8_block_scale(finite ? bf16_to_float(largest) : block_amax_avx2(block, true), pow2);
    inv[i] = 1.0f / scales[i];
    normal[i] = finite && bf16_to_float(smallest) * inv[i] >= 0.015625f &&
                bf16_to_float(largest) * inv[i] <= 464.0f;
  }
  for (int64_t i = 0; i < m; ++i) {
    const auto* block = reinterpret_cast<const uint16_t*>(src) + i * kFp8BlockSize;
    if (normal[i])
      encode_block_bf16_normal_avx2(block, inv[i], codes + i * kFp8BlockSize);
    else
      encode_block_avx2(block, true, inv[i], codes + i * kFp8BlockSize);
  }
}

// n full blocks in a row. The AVX2 kernel takes up to kChunk blocks in two passes, every amax
// and scale first: one block's amax, scale and inverse are a chain of dependent steps (a max
// tree, two divides) that kept the core waiting when each block ran alone (127 ns a block in
// cache); across independent blocks the chains overlap. Same operations, same bits.
void quantize_full_blocks(const char* src, size_t elem, bool bf16, int64_t n, bool pow2,
                          uint8_t* codes, float* scales, int level) {
  const size_t block_bytes = kFp8BlockSize * elem;
  if (level != kAvx2) {
    for (int64_t b = 0; b < n; ++b)
      scales[b] =
          quantize_block(src + b * block_bytes, bf16, pow2, codes + b * kFp8BlockSize, level);
    return;
  }
  for (int64_t b0 = 0; b0 < n; b0 += kChunk) {
    const int64_t m = n - b0 < kChunk ? n - b0 : kChunk;
    float inv[kChunk];
    if (bf16) {
      quantize_bf16_chunk(src + b0 * block_bytes, m, pow2, codes + b0 * kFp8BlockSize, scales + b0);
      continue;
    }
    for (int64_t i = 0; i < m; ++i)
      scales[b0 + i] = fp8_block_scale(block_amax_avx2(src + (b0 + i) * block_bytes, bf16), pow2);
    for (int64_t i = 0; i < m; ++i) inv[i] = 1.0f / scales[b0 + i];
    for (int64_t i = 0; i < m; ++i)
      encode_block_avx2(src + (b0 + i) * block_bytes, bf16, inv[i],
                        codes + (b0 + i) * kFp8BlockSize);
  }
}

}  // namespace

void quantize_rows(const void* src, bool bf16, int64_t rows, int64_t hidden, bool pow2,
                   uint8_t* codes, float* scales, int level) {
  const int64_t blocks = fp8_scales_per_row(hidden), full = hidden / kFp8BlockSize;
  const size_t elem = bf16 ? 2 : 4;
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = static_cast<const char*>(src) + static_cast<size_t>(r * hidden) * elem;
    quantize_full_blocks(row, elem, bf16, full, pow2, codes + r * hidden, scales + r * blocks,
                         level);
    if (full < blocks) {  // the partial last block: the portable kernel
      const int64_t at = full * kFp8BlockSize;
      scales[r * blocks + full] = quantize_any(row + static_cast<size_t>(at) * elem, bf16,
                                               hidden - at, pow2, codes + r * hidden + at);
    }
  }
}

void dequantize_rows(const uint8_t* codes, const float* scales, int64_t rows, int64_t hidden,
                     float* out, int level) {
  const int64_t blocks = fp8_scales_per_row(hidden);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = r * hidden + b * kFp8BlockSize;
      const int64_t n = b + 1 < blocks ? kFp8BlockSize : hidden - b * kFp8BlockSize;
      const float scale = scales[r * blocks + b];
      if (n == kFp8BlockSize) {
        dequantize_block(codes + at, scale, out + at, level);
      } else {
        for (int64_t i = 0; i < n; ++i) out[at + i] = e4m3_to_float(codes[at + i]) * scale;
      }
    }
}

#if !defined(__x86_64__)
float quantize_block_avx512(const void*, bool, bool, uint8_t*) {
  throw Error("fp8: the AVX-512F kernel is not built on this architecture");
}
void dequantize_block_avx512(const uint8_t*, float, float*) {
  throw Error("fp8: the AVX-512F kernel is not built on this architecture");
}
float quantize_block_avx2(const void*, bool, bool, uint8_t*) {
  throw Error("fp8: the AVX2 kernel is not built on this architecture");
}
float block_amax_avx2(const void*, bool) {
  throw Error("fp8: the AVX2 kernel is not built on this architecture");
}
void encode_block_avx2(const void*, bool, float, uint8_t*) {
  throw Error("fp8: the AVX2 kernel is not built on this architecture");
}
void dequantize_block_avx2(const uint8_t*, float, float*) {
  throw Error("fp8: the AVX2 kernel is not built on this architecture");
}
void block_range_bf16_avx2(const uint16_t*, uint16_t*, uint16_t*) {
  throw Error("fp8: the AVX2 kernel is not built on this architecture");
}
void encode_block_bf16_normal_avx2(const uint16_t*, float, uint8_t*) {
  throw Error("fp8: the AVX2 kernel is not built on this architecture");
}
#endif

}  // namespace fp8_blocks

void fp8_quantize_rows(const void* src, DType src_dtype, int64_t rows, int64_t hidden, bool pow2,
                       uint8_t* codes, float* scales) {
  UBEP_CHECK_ARG(src_dtype == DType::kBF16 || src_dtype == DType::kFP32,
                 "fp8_quantize_rows: source dtype must be bf16 or fp32, got ",
                 dtype_name(src_dtype));
  UBEP_CHECK_ARG(rows >= 0 && hidden >= 1, "fp8_quantize_rows: bad shape [", rows, ", ", hidden,
                 "]");
  fp8_blocks::quantize_rows(src, src_dtype == DType::kBF16, rows, hidden, pow2, codes, scales,
                            fp8_blocks::best_level());
}

void fp8_dequantize_rows(const uint8_t* codes, const float* scales, int64_t rows, int64_t hidden,
                         float* out) {
  fp8_blocks::dequantize_rows(codes, scales, rows, hidden, out, fp8_blocks::best_level());
}

}  // namespace ubep
