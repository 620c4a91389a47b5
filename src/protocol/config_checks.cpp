#include "protocol/config_checks.hpp"

#include "protocol/protocol.hpp"

#include "ubep/error.hpp"

namespace ubep::protocol {

void check_shape(const ShapeFields& s, int ranks, const char* who, ConfigLimits limits) {
  UBEP_CHECK_ARG(s.max_tokens_per_rank >= 1, who, ": max_tokens_per_rank must be >= 1, got ",
                 s.max_tokens_per_rank);
  UBEP_CHECK_ARG(s.max_tokens_per_rank < (int64_t{1} << 30), who,
                 ": max_tokens_per_rank must be < 2^30, got ", s.max_tokens_per_rank);
  UBEP_CHECK_ARG(s.hidden >= 1, who, ": hidden must be >= 1, got ", s.hidden);
  const bool dtype_ok = s.dtype == DType::kBF16 || s.dtype == DType::kFP32 ||
                        (limits.fp8 && s.dtype == DType::kFP8E4M3);
  UBEP_CHECK_ARG(dtype_ok, who, ": dtype must be bf16, fp32", limits.fp8 ? " or fp8" : " (no fp8)",
                 ", got ", dtype_name(s.dtype));
  UBEP_CHECK_ARG(ranks >= 1, who, ": the group has ", ranks, " ranks");
  UBEP_CHECK_ARG(s.num_experts >= 1 && s.num_experts % ranks == 0, who, ": num_experts ",
                 s.num_experts, " must be a positive multiple of the group size ", ranks);
  UBEP_CHECK_ARG(s.max_topk >= 1 && s.max_topk <= limits.max_topk, who,
                 ": max_topk must be in [1, ", limits.max_topk, "], got ", s.max_topk);
}

void check_buffer_config(const BufferConfig& c, int ranks, const char* who, ConfigLimits limits) {
  check_shape({c.max_tokens_per_rank, c.hidden, c.dtype, c.num_experts, c.max_topk}, ranks, who,
              limits);
  UBEP_CHECK_ARG(!c.enable_latency_layout || c.max_tokens_per_rank < LatencyRecord::kMaxTokens, who,
                 ": max_tokens_per_rank must be < 2^24 with enable_latency_layout (a latency "
                 "row's record holds its token in 24 bits), got ",
                 c.max_tokens_per_rank);
  UBEP_CHECK_ARG(c.num_workers >= -1 && c.num_workers <= 1024, who,
                 ": num_workers must be in [-1, 1024], got ", c.num_workers);
}

}  // namespace ubep::protocol
