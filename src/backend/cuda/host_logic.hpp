// Host-side logic of the CUDA backend that needs no CUDA runtime: argument checks, launch
// sizing, window/scratch/result views and turning a kernel's error word into an exception.
// Plain C++, so the CPU test suite (tests/cuda/test_cuda_host.cpp) runs all of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cuda/device_plan.hpp"
#include "ubep/buffer.hpp"

namespace ubep::cuda_host {

// Validates a dispatch's shapes, dtypes and devices, and its expert ids where they are in
// host-readable memory (ids_on_host; otherwise the kernel checks them and reports kBadExpert).
// Throws InvalidArgument naming the rank.
void check_dispatch(const DispatchArgs& a, const BufferConfig& cfg, int rank,
                    bool ids_on_host = false);
// Validates a combine input against the last dispatch's recv_x. Throws InvalidArgument.
void check_combine(const CombineArgs& a, const BufferConfig& cfg, const TensorView& recv_x,
                   uint64_t handle, int rank);
// Checks the buffer config for the CUDA backend (ranks divide experts, limits of the kernels).
void check_config(const BufferConfig& cfg, int ranks, int local_ranks);

// Blocks per rank for a cooperative launch of `local_ranks` ranks when `coresident` blocks fit
// on the device at once: as requested (0: as many as fit, at most kMaxBlocksPerRank).
// Throws InvalidArgument when not even one block per rank fits.
int blocks_per_rank(int requested, int coresident, int local_ranks);
// Dynamic shared memory of the dispatch kernel's routing (per warp: [32*K] + [El] int32).
size_t dispatch_smem(int warps, int max_topk, int local_experts);

// The window map and scratch map of a buffer.
protocol::WindowLayout window_layout(const BufferConfig& cfg, int ranks);
cuda_hd::ScratchLayout scratch_layout(const BufferConfig& cfg, int ranks);

// Dispatch result views of `rank` into its window `base` (device memory) for call `seq`.
// Throughput recv_x is shaped by capacity [ranks*max_tokens, hidden] in both placements (the
// CPU's per-source shape; compact rows are the first sum(recv_count), known on the device).
DispatchResult dispatch_views(const protocol::WindowLayout& m, const BufferConfig& cfg, void* base,
                              int half, Layout layout, Placement placement, int topk,
                              void* recv_count, void* recv_range, uint64_t handle);
TensorView combine_view(const protocol::WindowLayout& m, const BufferConfig& cfg, void* base,
                        int half, Layout layout);

// The exception for an error word (kOk: none; nothing thrown).
void throw_if_error(const cuda_hd::ErrorInfo& e, double timeout_s);
std::string describe(const cuda_hd::ErrorInfo& e, double timeout_s);

}  // namespace ubep::cuda_host
