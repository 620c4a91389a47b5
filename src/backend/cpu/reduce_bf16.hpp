// The fixed-order bf16 reduction, hand-vectorised for AVX-512F and AVX2 (reduce_bf16.cpp):
// out = round_bf16(((0 + w0*r0) + w1*r1) + ...), bit for bit the portable kernel's result.
#pragma once

#include <cstdint>

namespace ubep::kernels {

inline constexpr int kMaxVectorRows = 256;

// The best instruction set this CPU has: 3 = AVX-512 with AVX512_BF16 (and BW, DQ), 2 =
// AVX-512F, 1 = AVX2, 0 = none (or not x86-64).
int reduce_bf16_level();

// The rows a caller reduces next (a hint, no effect on results): the kernel starts fetching
// their first lines while it finishes the current rows, so the next call does not start cold.
struct NextRows {
  const void* const* rows = nullptr;
  int n = 0;
};

// Reduces with the vector kernel of `level` (-1: the best; capped at what the CPU has) and
// returns true, or returns false (nothing written) when no vector kernel applies: level 0, or
// more than kMaxVectorRows rows. weights == nullptr: unweighted. stream: write `out` with
// non-temporal stores where it is 64-byte aligned (the caller fences: store_fence()).
// prefetch = false: no software prefetch into `next`, and none ahead in the rows either except
// at level 1 (AVX2), where the within-row prefetch measured faster even for sequential rows.
bool reduce_bf16_vector(uint16_t* out, int64_t hidden, const void* const* rows,
                        const float* weights, int n, int level = -1, bool stream = false,
                        NextRows next = {}, bool prefetch = true);

}  // namespace ubep::kernels
