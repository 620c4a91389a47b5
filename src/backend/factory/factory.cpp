#include "backend/factory/factory.hpp"

#include "backend/cpu/cpu_data_path.hpp"
#include "backend/cuda/device_ops.hpp"
#include "backend/cuda/host_logic.hpp"
#include "backend/cuda/kernel_engine.hpp"
#include "ubep/error.hpp"

namespace ubep {

namespace cuda_host {
#if !defined(UBEP_WITH_CUDA_OPS)
std::unique_ptr<DeviceOps> make_cuda_ops(const Device& device) {
  throw SystemError("Buffer on " + device.describe() +
                    ": this build of ubep has no CUDA backend (configure with nvcc present, "
                    "UBEP_WITH_CUDA=ON); the CUDA simulation device is cuda-sim:0");
}
#endif
}  // namespace cuda_host

namespace backend {

bool runs_kernels(const Device& device) { return device.type != DeviceType::kCpu; }

void check_config(const BufferConfig& config, int ranks) {
  if (!runs_kernels(config.device)) return;
  cuda_host::check_config(config, ranks, 1);
}

std::unique_ptr<DataPath> make_data_path(const BufferConfig& config) {
  UBEP_CHECK_ARG(config.device.type == DeviceType::kCpu,
                 "make_data_path: ", config.device.describe(), " runs kernels, not host roles");
  return std::make_unique<cpu::CpuDataPath>(config.num_workers);
}

std::unique_ptr<Engine> make_kernel_engine(Group& group, const BufferConfig& config) {
  std::unique_ptr<cuda_host::DeviceOps> ops = config.device.type == DeviceType::kCudaSim
                                                  ? cuda_host::make_sim_ops(config.device)
                                                  : cuda_host::make_cuda_ops(config.device);
  return std::make_unique<cuda_host::KernelEngine>(group, config, std::move(ops));
}

}  // namespace backend
}  // namespace ubep
