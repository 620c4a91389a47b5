// CUDA error checks and the device query of include/ubep/cuda.hpp (engine.hpp).
#include "backend/cuda/launch.hpp"
#include "ubep/error.hpp"

namespace ubep::cuda {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw SystemError(detail::concat("CUDA: ", what, ": ", cudaGetErrorString(err)));
}

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    if (why)
      *why = err != cudaSuccess ? detail::concat("cudaGetDeviceCount: ", cudaGetErrorString(err))
                                : std::string("no CUDA device");
    cudaGetLastError();  // the error is not sticky: clear it so later calls start clean
    return false;
  }
  return true;
}

}  // namespace ubep::cuda
