// The DLPack data structures (https://dmlc.github.io/dlpack/latest/c_api.html), written from the
// public specification so the module needs no framework headers: ABI of DLPack 0.x (the
// "dltensor" capsule every torch and numpy version exchanges) and of 1.x
// ("dltensor_versioned", which newer producers hand out when asked for max_version >= 1).
#pragma once

#include <cstdint>

namespace ubep::python::dl {

enum DeviceType : int32_t {
  kCPU = 1,
  kCUDA = 2,
  kCUDAHost = 3,
  kOpenCL = 4,
  kVulkan = 7,
  kMetal = 8,
  kVPI = 9,
  kROCM = 10,
  kROCMHost = 11,
  kExtDev = 12,
  kCUDAManaged = 13,
  kOneAPI = 14,
  kWebGPU = 15,
  kHexagon = 16,
  kMAIA = 17,
};

enum TypeCode : uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kOpaqueHandle = 3,
  kBfloat = 4,
  kComplex = 5,
  kBool = 6,
};

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; nullptr = compact row-major
  uint64_t byte_offset;
};

// 0.x: capsule name "dltensor", renamed "used_dltensor" by the consumer that takes ownership.
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

struct PackVersion {
  uint32_t major;
  uint32_t minor;
};

// 1.x: capsule name "dltensor_versioned" / "used_dltensor_versioned".
struct ManagedTensorVersioned {
  PackVersion version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;  // bit 0: read only, bit 1: is a copy
  Tensor dl_tensor;
};

inline constexpr uint64_t kFlagReadOnly = 1;

inline const char* device_name(int32_t type) {
  switch (type) {
    case kCPU:
      return "cpu";
    case kCUDA:
      return "cuda";
    case kCUDAHost:
      return "cuda_host (pinned)";
    case kOpenCL:
      return "opencl";
    case kVulkan:
      return "vulkan";
    case kMetal:
      return "metal";
    case kVPI:
      return "vpi";
    case kROCM:
      return "rocm";
    case kROCMHost:
      return "rocm_host";
    case kExtDev:
      return "ext_dev";
    case kCUDAManaged:
      return "cuda_managed";
    case kOneAPI:
      return "oneapi";
    case kWebGPU:
      return "webgpu";
    case kHexagon:
      return "hexagon";
    case kMAIA:
      return "maia";
    default:
      return "unknown device";
  }
}

}  // namespace ubep::python::dl
