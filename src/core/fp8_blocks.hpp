// Block kernels of the fp8 codec (ubep/fp8.hpp): the portable ones in fp8.cpp, AVX-512F ones in
// fp8_avx512.cpp and AVX2 ones in fp8_avx2.cpp, which give the same bits (tests/test_fp8.cpp
// compares them on every code, every bf16 pattern and random rows). Internal: callers use
// fp8_quantize_rows/_dequantize_rows.
#pragma once

#include <cstdint>

namespace ubep::fp8_blocks {

// Kernel levels: 0 portable, 1 AVX2, 2 AVX-512F.
inline constexpr int kPortable = 0, kAvx2 = 1, kAvx512 = 2;
// The best level this CPU runs (checked once at run time).
int best_level();

// One full block of kFp8BlockSize values (bf16 bits when bf16, else fp32): returns the scale and
// writes the codes, with the kernel of `level` (<= best_level()).
float quantize_block(const void* src, bool bf16, bool pow2, uint8_t* codes, int level);
// out[i] = e4m3_to_float(codes[i]) * scale for one full block.
void dequantize_block(const uint8_t* codes, float scale, float* out, int level);

// Rows, with the kernels of `level`; the public functions pass best_level().
void quantize_rows(const void* src, bool bf16, int64_t rows, int64_t hidden, bool pow2,
                   uint8_t* codes, float* scales, int level);
void dequantize_rows(const uint8_t* codes, const float* scales, int64_t rows, int64_t hidden,
                     float* out, int level);

// The vector kernels (fp8_avx512.cpp, fp8_avx2.cpp).
float quantize_block_avx512(const void* src, bool bf16, bool pow2, uint8_t* codes);
void dequantize_block_avx512(const uint8_t* codes, float scale, float* out);
float quantize_block_avx2(const void* src, bool bf16, bool pow2, uint8_t* codes);
void dequantize_block_avx2(const uint8_t* codes, float scale, float* out);
// quantize_block_avx2's two halves: the block's amax over finite values, and its codes under
// 1 / scale (quantize_rows runs them over several blocks at a time).
float block_amax_avx2(const void* src, bool bf16);
void encode_block_avx2(const void* src, bool bf16, float inv_scale, uint8_t* codes);
// bf16 blocks: the largest and smallest magnitude's bit pattern in one pass, and the codes of a
// block whose every value, scaled, lies in e4m3's normal range (2^-6 to 464), on that branch alone.
void block_range_bf16_avx2(const uint16_t* src, uint16_t* max, uint16_t* min);
void encode_block_bf16_normal_avx2(const uint16_t* src, float inv_scale, uint8_t* codes);

}  // namespace ubep::fp8_blocks
