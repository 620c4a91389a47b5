// The combine bound's loops (bounds.cpp): OR a token's rows into its output row. OR is the
// cheapest combining operation there is, so no reduction can be faster at the same traffic; the
// variants give the bound every access pattern the library's reduction uses (reduce_bf16.cpp),
// so that none of its tricks is a lead the bound lacks.
#pragma once

#include <cstddef>

namespace ubep::tools {

struct OrReduce {
  bool prefetch = false;   // software prefetch into L2 ahead in every row (2 KiB ahead)
  bool two_lines = false;  // two lines of every row per step, as the library steps
  bool stream = false;     // non-temporal stores of the output (64-byte aligned out)
  // As the library prefetches: about 4 KiB ahead over all rows, and on into the next token's
  // rows (next, next_n) as this one's end nears, interleaved with the loads.
  bool next = false;
};

// out = rows[0] | ... | rows[n-1] over `bytes`; n <= 64. next/next_n: the rows of the token
// reduced after this one (used by OrReduce::next; nullptr, 0: none).
void or_reduce(char* out, const char* const* rows, int n, size_t bytes, const OrReduce& how,
               const char* const* next, int next_n);

// Whether the vector loops run here: the AVX-512F ones, or else the AVX2 ones.
bool or_reduce_has_avx512();
bool or_reduce_has_avx2();

}  // namespace ubep::tools
