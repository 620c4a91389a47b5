// Instantiations and cooperative launches of the dispatch and combine kernels for both peer
// policies. Compiled with -Xptxas -v,-warn-spills,-Werror (CMakeLists.txt): a register spill in
// these hot kernels fails the build.
#include "backend/cuda/combine.cuh"
#include "backend/cuda/launch.hpp"

namespace ubep::cuda {

namespace {

template <class Peers>
void launch(void (*kernel)(cuda_hd::LaunchParams), const cuda_hd::LaunchParams& p, int grid,
            int block, size_t smem, cudaStream_t s) {
  void* args[] = {const_cast<cuda_hd::LaunchParams*>(&p)};
  check_cuda(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(grid), dim3(block),
                                         args, smem, s),
             "cooperative kernel launch");
}

template <class Peers>
int fit(int block, size_t smem, int device) {
  check_cuda(
      cudaFuncSetAttribute(reinterpret_cast<const void*>(&cuda_dev::dispatch_kernel<Peers>),
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
      "dispatch kernel shared memory");
  int per_sm_d = 0, per_sm_c = 0, sms = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                 &per_sm_d, cuda_dev::dispatch_kernel<Peers>, block, smem),
             "dispatch occupancy");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                 &per_sm_c, cuda_dev::combine_kernel<Peers>, block, 0),
             "combine occupancy");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  return std::min(per_sm_d, per_sm_c) * sms;
}

}  // namespace

int coresident_blocks(bool virtual_ranks, int block, size_t smem, int device) {
  return virtual_ranks ? fit<cuda_dev::VirtualPeers>(block, smem, device)
                       : fit<cuda_dev::IpcPeers>(block, smem, device);
}

void launch_dispatch(bool virtual_ranks, const cuda_hd::LaunchParams& p, int grid, int block,
                     size_t smem, cudaStream_t s) {
  if (virtual_ranks)
    launch<cuda_dev::VirtualPeers>(cuda_dev::dispatch_kernel<cuda_dev::VirtualPeers>, p, grid,
                                   block, smem, s);
  else
    launch<cuda_dev::IpcPeers>(cuda_dev::dispatch_kernel<cuda_dev::IpcPeers>, p, grid, block, smem,
                               s);
}

void launch_combine(bool virtual_ranks, const cuda_hd::LaunchParams& p, int grid, int block,
                    cudaStream_t s) {
  if (virtual_ranks)
    launch<cuda_dev::VirtualPeers>(cuda_dev::combine_kernel<cuda_dev::VirtualPeers>, p, grid, block,
                                   0, s);
  else
    launch<cuda_dev::IpcPeers>(cuda_dev::combine_kernel<cuda_dev::IpcPeers>, p, grid, block, 0, s);
}

}  // namespace ubep::cuda
