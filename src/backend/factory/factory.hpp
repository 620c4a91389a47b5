// The one place a backend is chosen: from BufferConfig::device.
//   cpu        host roles (the ep algorithms) over the CPU data path (backend/cpu)
//   cuda:N     the CUDA backend's kernels on GPU N (backend/cuda; built with UBEP_WITH_CUDA)
//   cuda-sim:N the same kernels on CPU threads (backend/cuda_sim)
#pragma once

#include <memory>

#include "backend/data_path.hpp"
#include "backend/engine.hpp"

namespace ubep::backend {

// Whether the device's backend runs a whole call in its kernels (make_kernel_engine) rather
// than as host roles over a DataPath (make_data_path).
bool runs_kernels(const Device& device);
// InvalidArgument naming the value when the device's backend cannot serve the config on a group
// of `ranks` (checked on every rank before the Buffer's ranks agree on their configs).
void check_config(const BufferConfig& config, int ranks);
std::unique_ptr<DataPath> make_data_path(const BufferConfig& config);
// Collective over the group (maps the peers' windows). SystemError naming the reason where the
// device is unavailable (no CUDA in this build, no GPU).
std::unique_ptr<Engine> make_kernel_engine(Group& group, const BufferConfig& config);

}  // namespace ubep::backend
