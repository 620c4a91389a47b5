// The CUDA runtime glue of the backend, used by cuda_ops.cu (the GPU's DeviceOps behind
// cuda_host::KernelEngine, the engine of ubep::Buffer): the cooperative launches of the kernels
// (defined in kernels.cu), the co-resident block count that sizes them, and CUDA error checks.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/device_plan.hpp"
#include "ubep/cuda.hpp"

namespace ubep::cuda {

// Cooperative launches of the kernels (kernels.cu). virtual_ranks picks the peer policy the
// kernels are instantiated for: false (IpcPeers, one rank per launch) is what the Buffer uses;
// true (VirtualPeers, every rank in one launch) is left to the kernels' CPU simulation tests.
void launch_dispatch(bool virtual_ranks, const cuda_hd::LaunchParams& p, int grid, int block,
                     size_t smem, cudaStream_t s);
void launch_combine(bool virtual_ranks, const cuda_hd::LaunchParams& p, int grid, int block,
                    cudaStream_t s);
// Blocks of `block` threads (dispatch's dynamic shared memory `smem`) that fit co-resident on
// `device` for both kernels: the most one cooperative launch may use.
int coresident_blocks(bool virtual_ranks, int block, size_t smem, int device);

// Throws SystemError "CUDA: <what>: <reason>" when err is not cudaSuccess.
void check_cuda(cudaError_t err, const char* what);

}  // namespace ubep::cuda
