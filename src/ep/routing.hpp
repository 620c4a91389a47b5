// Routing metadata of one dispatch (the "layout" stage), computed on the sending rank from
// topk_idx into arrays sized once at buffer creation.
#pragma once

#include <cstdint>
#include <vector>

#include "ubep/buffer.hpp"

namespace ubep::ep {

struct Routing {
  int ranks = 0;
  int local_experts = 0;
  int64_t max_tokens = 0;
  int max_topk = 0;

  int64_t num_tokens = 0;
  int topk = 0;
  int64_t num_entries = 0;          // (token, k) entries naming an expert: the latency rows
  std::vector<int32_t> topk_idx;    // [T, K] global expert ids (-1 = none), copied from input
  std::vector<float> topk_weights;  // [T, K]
  std::vector<int32_t>
      expert_slot;  // [T, K] index of the token among this rank's tokens for that expert
  // [T, K] the rank of each entry's expert (-1 = none): the senders test an entry against a
  // destination with one compare, which vectorizes, where looking the rank up by expert id is
  // a gather per entry (DispatchCall::place_row).
  std::vector<int32_t> entry_rank;
  std::vector<uint8_t> sent_to;  // [T, R] 1 if the token goes to rank r
  std::vector<int32_t>
      dest_slot;  // [T, R] index of the token among those going to rank r (-1: not sent)
  std::vector<int32_t> dest_rows;         // [R] tokens going to rank r
  std::vector<int32_t> dest_tokens;       // [R, T] which tokens, in token order
  std::vector<int32_t> dest_expert_rows;  // [R, E_local] rows for each (rank, local expert)
  // [E] each expert's rank and local index (expert / and % local_experts), so the per-entry
  // loops look them up instead of dividing.
  std::vector<int32_t> expert_rank, expert_local;
  std::vector<int32_t> last_token;  // [E] the expert id check's scratch

  Routing(int r, int num_experts, int64_t t, int k);

  // Validates args against the buffer's config (throws InvalidArgument naming the bad value)
  // and fills every array. Nothing is written to shared memory before this succeeds.
  // masked[r] != 0: rank r is masked (docs/ELASTIC.md); entries naming its experts become -1
  // after validation, so its experts get no rows and their weights drop out of combine.
  void build(const DispatchArgs& args, const BufferConfig& cfg, const uint8_t* masked = nullptr);

  bool sent(int64_t t, int r) const { return sent_to[static_cast<size_t>(t * ranks + r)] != 0; }
  int32_t slot_at(int64_t t, int r) const { return dest_slot[static_cast<size_t>(t * ranks + r)]; }
  int32_t dest_token(int r, int64_t i) const {
    return dest_tokens[static_cast<size_t>(r * max_tokens + i)];
  }
};

// Validates the shapes and dtype of a dispatch's inputs (shared with the MPI baseline).
void validate_dispatch(const DispatchArgs& args, const BufferConfig& cfg);

}  // namespace ubep::ep
