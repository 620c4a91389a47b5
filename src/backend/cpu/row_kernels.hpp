// The per-row arithmetic of combine, shared by every implementation so their results agree bit
// for bit: acc[h] += w * row[h] (or acc[h] += row[h]) in fp32, then one rounding to the dtype.
// Built for several instruction sets (target_clones); contraction into FMA is disabled
// project-wide, so every variant rounds exactly like the scalar reference.
#pragma once

#include <cstdint>

#include "ubep/types.hpp"

namespace ubep::kernels {

void accumulate_row(float* acc, const void* row, DType dtype, int64_t hidden);
void accumulate_row_weighted(float* acc, const void* row, DType dtype, int64_t hidden,
                             float weight);
void store_row(void* dst, const float* acc, DType dtype, int64_t hidden);

// Copies a row into another rank's memory with non-temporal stores (no read-for-ownership of
// lines the writer will never read), then an sfence, so that on return the row is globally
// visible before any later store -- in particular before the release store of its epoch tag.
// Partial lines at either end take plain stores; memcpy for spans without a whole line and in
// sanitizer builds.
void copy_row_to_peer(void* dst, const void* src, size_t bytes);
// The same stores without the fence: returns true if it used non-temporal stores, which are
// ordered before later stores only after a store_fence() (CpuDataPath fences once per batch).
bool stream_row_to_peer(void* dst, const void* src, size_t bytes);
void store_fence();  // sfence: earlier non-temporal stores before every later store
// Starts fetching the lines of [dst, dst + bytes) that a store will soon write (a hint).
void prefetch_for_write(const void* dst, size_t bytes);

// out = round(((0 + w0*r0) + w1*r1) + ...) element-wise, in one pass over the rows (fp32
// accumulator held per chunk): the same operations in the same order as the kernels above, so
// the same bits, with a fraction of the memory traffic. weights == nullptr: unweighted. n may be 0.
// stream: a large output, written with non-temporal stores where the kernel can (bf16); the
// caller must store_fence() before another thread reads it. next_rows, next_n: the rows the
// caller reduces next, a hint (their first lines are fetched as this reduction ends).
// prefetch = false: rows the hardware prefetchers already follow: no software prefetch into
// next_rows, nor ahead in the rows except where the AVX2 kernel runs (reduce_bf16.hpp).
void reduce_rows(void* out, DType dtype, int64_t hidden, const void* const* rows,
                 const float* weights, int n, bool stream = false,
                 const void* const* next_rows = nullptr, int next_n = 0, bool prefetch = true);
// The same without the hand-vectorised bf16 kernels (reduce_bf16.hpp): compiler-vectorised,
// for CPUs without AVX2 and to time against.
void reduce_rows_portable(void* out, DType dtype, int64_t hidden, const void* const* rows,
                          const float* weights, int n);

}  // namespace ubep::kernels
