#include "protocol/call_checks.hpp"

#include <vector>

#include "ubep/error.hpp"
#include "ubep/fp8.hpp"

namespace ubep::protocol {

namespace {
// x in the buffer's dtype; fp8 buffers also take bf16/fp32 x (cast on send) or fp8 x with its
// scales [n, ceil(hidden/128)] fp32.
void validate_dispatch_dtype(const DispatchArgs& a, const BufferConfig& cfg) {
  const bool fp8 = cfg.dtype == DType::kFP8E4M3;
  const bool cast = fp8 && (a.x.dtype == DType::kBF16 || a.x.dtype == DType::kFP32);
  UBEP_CHECK_ARG(
      a.x.dtype == cfg.dtype || cast, "dispatch: x dtype ", dtype_name(a.x.dtype),
      " does not match the buffer's ", dtype_name(cfg.dtype),
      fp8 ? " (fp8 buffers take fp8 x with x_scales, or bf16/fp32 x to cast on send)" : "");
  const TensorView& s = a.x_scales;
  if (a.x.dtype != DType::kFP8E4M3) {
    UBEP_CHECK_ARG(s.ndim == 0, "dispatch: x_scales ", s.describe(), " given with ",
                   dtype_name(a.x.dtype), " x (scales belong to fp8 x only)");
    return;
  }
  const int64_t n = a.x.dim(0), nb = fp8_scales_per_row(cfg.hidden);
  UBEP_CHECK_ARG(s.ndim == 2 && s.dtype == DType::kFP32 && s.dim(0) == n && s.dim(1) == nb,
                 "dispatch: x_scales must be fp32 [", n, ", ", nb, "] (one scale per ",
                 kFp8BlockSize, " channels of hidden ", cfg.hidden, "), got ",
                 s.ndim == 0 ? std::string("none") : s.describe());
  UBEP_CHECK_ARG(s.data != nullptr || n == 0, "dispatch: x_scales has no data");
  UBEP_CHECK_ARG(s.device == cfg.device, "dispatch: x_scales is on ", s.device.describe(),
                 ", the buffer on ", cfg.device.describe());
}
}  // namespace

void check_dispatch_args(const DispatchArgs& a, const BufferConfig& cfg) {
  UBEP_CHECK_ARG(a.x.data != nullptr || a.x.numel() == 0, "dispatch: x has no data");
  for (const auto& [name, t] : {std::pair{"x", &a.x}, std::pair{"topk_idx", &a.topk_idx},
                                std::pair{"topk_weights", &a.topk_weights}})
    UBEP_CHECK_ARG(t->device == cfg.device, "dispatch: ", name, " is on ", t->device.describe(),
                   ", the buffer on ", cfg.device.describe());
  UBEP_CHECK_ARG(a.x.ndim == 2, "dispatch: x must be [num_tokens, hidden], got ", a.x.describe());
  const int64_t n = a.x.dim(0);
  validate_dispatch_dtype(a, cfg);
  UBEP_CHECK_ARG(a.x.dim(1) == cfg.hidden, "dispatch: x hidden size ", a.x.dim(1),
                 " does not match the buffer's hidden ", cfg.hidden);
  UBEP_CHECK_ARG(n >= 0 && n <= cfg.max_tokens_per_rank, "dispatch: num_tokens ", n,
                 " exceeds the buffer's capacity max_tokens_per_rank=", cfg.max_tokens_per_rank);
  UBEP_CHECK_ARG(a.topk_idx.ndim == 2 && a.topk_idx.dtype == DType::kInt64,
                 "dispatch: topk_idx must be int64 [num_tokens, k], got ", a.topk_idx.describe());
  UBEP_CHECK_ARG(a.topk_idx.dim(0) == n, "dispatch: topk_idx has ", a.topk_idx.dim(0),
                 " rows but x has ", n, " tokens");
  const int64_t k = a.topk_idx.dim(1);
  UBEP_CHECK_ARG(k >= 1 && k <= cfg.max_topk, "dispatch: topk ", k,
                 " outside [1, max_topk=", cfg.max_topk, "]");
  UBEP_CHECK_ARG(a.topk_weights.ndim == 2 && a.topk_weights.dtype == DType::kFP32,
                 "dispatch: topk_weights must be fp32 [num_tokens, k], got ",
                 a.topk_weights.describe());
  UBEP_CHECK_ARG(a.topk_weights.dim(0) == n && a.topk_weights.dim(1) == k,
                 "dispatch: topk_weights shape ", a.topk_weights.describe(),
                 " does not match topk_idx ", a.topk_idx.describe());
  UBEP_CHECK_ARG(a.topk_idx.data != nullptr || n * k == 0, "dispatch: topk_idx has no data");
  UBEP_CHECK_ARG(a.topk_weights.data != nullptr || n * k == 0,
                 "dispatch: topk_weights has no data");
}

namespace {
// The error for a token check_expert_ids found wrong: walks it again to name the first bad id.
[[noreturn]] void name_bad_expert_id(const int64_t* ids, int64_t t, int64_t k, int num_experts) {
  for (int64_t j = 0; j < k; ++j) {
    const int64_t e = ids[j];
    UBEP_CHECK_ARG(e >= -1 && e < num_experts, "dispatch: expert id ", e, " at token ", t, ", k ",
                   j, " is outside [-1, num_experts=", num_experts, ")");
    for (int64_t j2 = 0; j2 < j; ++j2)
      UBEP_CHECK_ARG(e < 0 || ids[j2] != e, "dispatch: expert id ", e, " appears twice for token ",
                     t, " (k ", j2, " and ", j, ")");
  }
  throw InvalidArgument(detail::concat("dispatch: token ", t, " has a bad expert id"));
}
}  // namespace

// One range test and one look at the last token that named the expert per id, so O(ids), not
// O(ids x k): the pairwise test took 95-125 us of a prefill call's 210 us routing (4096 tokens
// x 8, Xeon VM), this pass about a fifth of that (issue 31). A bad token is walked again for
// its message.
void check_expert_ids(const DispatchArgs& a, const BufferConfig& cfg,
                      std::vector<int32_t>* scratch) {
  const int64_t n = a.x.dim(0), k = a.topk_idx.dim(1);
  const auto* idx = a.topk_idx.as<const int64_t>();
  const int64_t experts = cfg.num_experts;
  std::vector<int32_t> own;
  std::vector<int32_t>& last_token = scratch ? *scratch : own;
  last_token.assign(static_cast<size_t>(experts), -1);
  int32_t* last = last_token.data();
  for (int64_t t = 0; t < n; ++t) {
    const int64_t* ids = idx + t * k;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[j];
      if (e < -1 || e >= experts) name_bad_expert_id(ids, t, k, cfg.num_experts);
      if (e < 0) continue;
      if (last[e] == t) name_bad_expert_id(ids, t, k, cfg.num_experts);
      last[e] = static_cast<int32_t>(t);
    }
  }
}

void check_recv_piece(int source, int local_expert, Layout layout, int ranks, int local_experts) {
  UBEP_CHECK_ARG(source >= 0 && source < ranks, "wait_recv_range: source ", source,
                 " is not a rank of the group [0, ", ranks, ")");
  if (layout == Layout::kLatency)
    UBEP_CHECK_ARG(local_expert >= 0 && local_expert < local_experts,
                   "wait_recv_range: local_expert ", local_expert, " is not in [0, ", local_experts,
                   ")");
  else
    UBEP_CHECK_ARG(local_expert == 0, "wait_recv_range: local_expert ", local_expert,
                   " must be 0 in the throughput layout (rows are not grouped by expert)");
}

}  // namespace ubep::protocol
