// The one validator of a BufferConfig, used by every component that sizes memory from one: the
// Buffer (its config agreement), the MPI baseline, the moe expert layer and the CUDA backend.
// Each failure is an InvalidArgument that names the component, the field and the value, thrown
// before anything is sized.
#pragma once

#include <cstdint>

#include "ubep/buffer.hpp"

namespace ubep::protocol {

// What a component serves beyond the common limits.
struct ConfigLimits {
  bool fp8 = true;    // the e4m3 dtype (the CUDA kernels and the expert layer have none)
  int max_topk = 64;  // the widest topk a token row may carry
};

// The fields that shape memory: max_tokens_per_rank, hidden, dtype, num_experts (a positive
// multiple of `ranks`), max_topk, num_workers. `who` prefixes every message ("Buffer", ...).
void check_buffer_config(const BufferConfig& config, int ranks, const char* who,
                         ConfigLimits limits = {});

// The same rules for configs that carry these fields without being a BufferConfig
// (ExpertLayerConfig): one copy of the limits and of their messages.
struct ShapeFields {
  int64_t max_tokens_per_rank;
  int64_t hidden;
  DType dtype;
  int num_experts;
  int max_topk;
};
void check_shape(const ShapeFields& shape, int ranks, const char* who, ConfigLimits limits = {});

}  // namespace ubep::protocol
