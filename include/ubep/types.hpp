// Element types and non-owning tensor views used at the API boundary.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace ubep {

// kFP8E4M3: fp8 e4m3 codes (one byte each), always paired with per-128-channel fp32 scales
// (ubep/fp8.hpp); a dispatch-only dtype (combine of an fp8 buffer is bf16).
enum class DType : uint8_t { kBF16, kFP32, kInt32, kInt64, kFP8E4M3 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType parse_dtype(const std::string& name);  // "bf16" | "fp32" | "fp8"; throws InvalidArgument

// Where a tensor's memory lives, and so which backend a Buffer runs on (BufferConfig::device).
// kCpu: host memory, the CPU backend. kCuda: memory of GPU `index`, the CUDA backend.
// kCudaSim: the CUDA simulation device -- host memory, and the CUDA backend's kernels run on CPU
// threads (for testing that code without a GPU; slow).
enum class DeviceType : uint8_t { kCpu, kCuda, kCudaSim };
struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string describe() const;                  // "cpu" | "cuda:1" | "cuda-sim:0"
  static Device parse(const std::string& name);  // the same names; throws InvalidArgument
};

// A non-owning view of a dense, row-major tensor of up to 3 dimensions.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFP32;
  std::array<int64_t, 3> shape{0, 0, 0};
  int ndim = 0;
  Device device;  // the Buffer checks that it matches its own

  TensorView() = default;
  TensorView(void* d, DType t, std::initializer_list<int64_t> dims);
  TensorView(const void* d, DType t, std::initializer_list<int64_t> dims)
      : TensorView(const_cast<void*>(d), t, dims) {}
  TensorView(std::nullptr_t, DType t, std::initializer_list<int64_t> dims)
      : TensorView(static_cast<void*>(nullptr), t, dims) {}

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i)]; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  std::string describe() const;  // e.g. "bf16[128, 7168]", "bf16[128, 7168] on cuda:0"
};

}  // namespace ubep
