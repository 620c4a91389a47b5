// What one call may carry, checked the same way on every backend (one set of input checks):
// shapes, dtypes, devices and pointers of DispatchArgs against the BufferConfig, and -- where the
// host can read them -- the expert ids. Each failure is an InvalidArgument naming the value, thrown
// before anything is sent, so the buffer and the group stay usable.
#pragma once

#include <cstdint>
#include <vector>

#include "ubep/buffer.hpp"

namespace ubep::protocol {

// Everything but the expert ids (which a device backend may only read on the device).
void check_dispatch_args(const DispatchArgs& args, const BufferConfig& config);
// Every expert id in [-1, num_experts), none twice per token; topk_idx in host memory.
// `scratch` (resized to num_experts) lets a caller that checks every call keep the pass's array.
void check_expert_ids(const DispatchArgs& args, const BufferConfig& config,
                      std::vector<int32_t>* scratch = nullptr);
// The receive hook's piece: a rank of the group, and a local expert (latency layout) or 0.
void check_recv_piece(int source, int local_expert, Layout layout, int ranks, int local_experts);

}  // namespace ubep::protocol
