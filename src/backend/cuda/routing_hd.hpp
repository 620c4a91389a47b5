// The per-lane arithmetic of the dispatch kernel's routing (dispatch.cuh, route()), as UBEP_HD
// functions, so the CPU tests can run the kernel's numbering -- one warp per destination rank,
// 32 tokens per chunk, a ballot and prefix popcount per chunk -- lane by lane and compare it with
// ep::Routing::build. The kernel adds only the warp plumbing: the ballot, __syncwarp between
// writing and reading the chunk table, and the chunk table in shared memory.
#pragma once

#include <cstdint>

#include "backend/cuda/device_plan.hpp"

namespace ubep::cuda_hd {

UBEP_HD inline int popcount(unsigned v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return __builtin_popcount(v);
#endif
}

// Lane `t - chunk start` of a chunk: row[j] = token t's expert j if it lives on rank r, else -1
// (also for t >= n, past the last token). Returns whether the token goes to rank r.
UBEP_HD inline bool chunk_row(const int64_t* idx, int64_t t, int64_t n, int K, int experts,
                              int local_experts, int r, int* row) {
  bool on = false;
  for (int j = 0; j < K; ++j) {
    const int32_t e = t < n ? expert_at(idx, t, j, K, experts) : -1;
    const bool mine = e >= 0 && e / local_experts == r;
    row[j] = mine ? e : -1;
    on = on || mine;
  }
  return on;
}

// Slot of lane's token among the source's rows for rank r: the rows of earlier chunks plus the
// earlier lanes of this chunk that go there (ballot: bit l set if lane l's token goes to r).
UBEP_HD inline int32_t chunk_dest_slot(int32_t rows_before, unsigned ballot, int lane) {
  return rows_before + popcount(ballot & ((1u << lane) - 1u));
}

// Slot of lane's token among the source's rows for expert e: the earlier chunks' rows for e
// (`before`) plus the earlier lanes whose token chose e (a token chooses an expert at most once:
// expert_at drops repeats). chunk: [32][K] rows as written by chunk_row.
UBEP_HD inline int32_t chunk_expert_slot(const int* chunk, int K, int lane, int e, int32_t before) {
  int32_t cnt = before;
  for (int l = 0; l < lane; ++l)
    for (int j = 0; j < K; ++j) cnt += chunk[l * K + j] == e;
  return cnt;
}

// Rows of the whole chunk (all 32 lanes) for expert e.
UBEP_HD inline int32_t chunk_expert_count(const int* chunk, int K, int e) {
  int32_t add = 0;
  for (int l = 0; l < 32 * K; ++l) add += chunk[l] == e;
  return add;
}

}  // namespace ubep::cuda_hd
