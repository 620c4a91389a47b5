// Peer-table policies the kernels are templated on: which rank a block works for, and how bsp's
// group barrier is made. Peers' windows are always reached through LaunchParams::bases, a
// device array of plain pointers in this process's address space.
//
//  VirtualPeers: R ranks in one process on one GPU, all their blocks in ONE cooperative launch.
//    Every spin-wait's partner block is then resident (cooperative launches are all-or-nothing),
//    which per-rank streams cannot guarantee: rank 1's kernel could wait for rank 0's count
//    record while rank 0's kernel waits behind it for SMs -- a deadlock.
//  IpcPeers: one rank per process (cudaIpcOpenMemHandle'd windows of the other processes on the
//    host, ipc_buffer.cu). Its blocks are one cooperative launch too, for the rank-local signals.
//  Across hosts: not a policy yet (docs/CUDA.md: NCCL GIN put + signal, or the MPI relay).
#pragma once

#include "backend/cuda/sync.cuh"

namespace ubep::cuda_dev {

using cuda_hd::LaunchParams;

struct VirtualPeers {
  __device__ static int local_rank(const LaunchParams& p) {
    return static_cast<int>(blockIdx.x) / p.blocks_per_rank;
  }
  __device__ static int block_in_rank(const LaunchParams& p) {
    return static_cast<int>(blockIdx.x) % p.blocks_per_rank;
  }
  // bsp's group barrier: every rank is in this grid, so the grid barrier is the group barrier
  // (it also orders memory, grid-wide).
  __device__ static void group_barrier(const LaunchParams&, int) { grid_barrier(); }
};

struct IpcPeers {
  __device__ static int local_rank(const LaunchParams&) { return 0; }
  __device__ static int block_in_rank(const LaunchParams&) { return static_cast<int>(blockIdx.x); }
  // bsp's group barrier across processes: the rank's blocks meet (grid barrier), then thread s
  // of block 0 writes this rank's arrival into rank s's window (stage flag of source `rank`,
  // one writer per flag) and waits for rank s's arrival in its own window. Flag values count
  // barriers monotonically (the same sequence on every rank, since bsp calls are collective),
  // compared wrap-safe: a fast rank that already arrived at the next barrier never hides its
  // arrival at this one. Then the blocks meet again, so nobody runs ahead of the exchange.
  __device__ static void group_barrier(const LaunchParams& p, int k) {
    grid_barrier();
    const int s = static_cast<int>(threadIdx.x);
    const uint32_t value = p.barrier_seq + static_cast<uint32_t>(k);
    if (blockIdx.x == 0 && s < p.ranks) {
      __threadfence_system();
      st_release_sys(p.map.stage_flag(p.bases[s], 0, p.first_rank), value);
      wait_reached(p.map.stage_flag(p.bases[p.first_rank], 0, s), value, p.timeout_cycles, p.error,
                   p.first_rank, s);
    }
    grid_barrier();
  }
};

}  // namespace ubep::cuda_dev
