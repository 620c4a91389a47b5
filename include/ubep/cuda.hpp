// ubep on NVIDIA GPUs. There is one API for every device: ubep::Buffer (ubep/buffer.hpp) with
// BufferConfig::device = {DeviceType::kCuda, N} runs every call through the CUDA backend's
// kernels (docs/CUDA.md). This header adds only what a GPU user needs besides the Buffer.
//
// How a Buffer on cuda:N behaves (the contract of ubep/buffer.hpp, plus):
//  * Ranks: threads of one process (ubep::run_on_threads) may share one GPU -- each rank launches
//    its own kernels and the ranks split the GPU's co-resident blocks -- or use one GPU each;
//    processes of one host (make_bootstrap_group, make_mpi_group) reach each other's windows
//    through CUDA IPC handles exchanged at construction. Ranks sharing a GPU must be threads:
//    two processes' kernels do not run concurrently on one GPU (without MPS). Across hosts: not
//    yet (refused at construction).
//  * Tensors: every TensorView passed in is device memory of GPU N with .device == cuda:N
//    (device_view below); results are views of device memory owned by the Buffer.
//  * Ordering and completion: the kernels start after the work already enqueued on the legacy
//    default stream (PyTorch's default), so inputs written there, or synchronised, are seen.
//    dispatch, combine, compact and the *_recv halves return once the kernels have finished
//    (num_recv_rows and any kernel error are then known); dispatch_send and combine_send only
//    enqueue. Do not free device memory (cudaFree synchronises the device) while a peer thread's
//    call may still be waiting for this rank.
//  * Bounds: every wait inside the kernels is bounded by the group's GroupOptions::timeout; a
//    late or dead peer gives a TimeoutError or PeerFailedError naming it, never a hang.
//  * Launch size: 512 threads per block, blocks per rank sized from the kernels' occupancy and
//    the number of ranks of this process on the device (no knob yet).
//
// Built when UBEP_WITH_CUDA is ON (the functions live in libubep). Requires compute
// capability 8.0+.
#pragma once

#include <initializer_list>
#include <string>

#include "ubep/types.hpp"

namespace ubep::cuda {

// True when a CUDA device is usable; otherwise false, and *why (if given) says why (no driver,
// no device). A Buffer on cuda:N on such a machine throws SystemError with the same reason.
bool device_available(std::string* why = nullptr);

// A view of `data`, device memory of GPU `index`, as a Buffer on cuda:index takes it.
inline TensorView device_view(void* data, DType dtype, std::initializer_list<int64_t> dims,
                              int index = 0) {
  TensorView v(data, dtype, dims);
  v.device = {DeviceType::kCuda, index};
  return v;
}

}  // namespace ubep::cuda
