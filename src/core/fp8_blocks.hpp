// Block kernels of the fp8 codec (ubep/fp8.hpp): the portable ones in fp8.cpp and AVX-512F ones
// in fp8_avx512.cpp, which give the same bits (tests/test_fp8.cpp compares them on every code,
// every bf16 pattern and random rows). Internal: callers use fp8_quantize_rows/_dequantize_rows.
#pragma once

#include <cstdint>

namespace ubep::fp8_blocks {

// Whether the vector kernels run on this CPU (AVX-512F, checked once at run time).
bool have_vector();

// One full block of kFp8BlockSize values (bf16 bits when bf16, else fp32): returns the scale and
// writes the codes. `vector` picks the AVX-512F kernel; only valid when have_vector().
float quantize_block(const void* src, bool bf16, bool pow2, uint8_t* codes, bool vector);
// out[i] = e4m3_to_float(codes[i]) * scale for one full block.
void dequantize_block(const uint8_t* codes, float scale, float* out, bool vector);

// Rows, with the kernels of `vector` (see have_vector); the public functions pass have_vector().
void quantize_rows(const void* src, bool bf16, int64_t rows, int64_t hidden, bool pow2,
                   uint8_t* codes, float* scales, bool vector);
void dequantize_rows(const uint8_t* codes, const float* scales, int64_t rows, int64_t hidden,
                     float* out, bool vector);

// The AVX-512F kernels (fp8_avx512.cpp).
float quantize_block_avx512(const void* src, bool bf16, bool pow2, uint8_t* codes);
void dequantize_block_avx512(const uint8_t* codes, float scale, float* out);

}  // namespace ubep::fp8_blocks
