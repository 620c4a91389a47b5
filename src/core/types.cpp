#include "ubep/types.hpp"

#include <sstream>

#include "core/enum_names.hpp"
#include "ubep/error.hpp"

namespace ubep {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBF16:
      return 2;
    case DType::kFP32:
      return 4;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kFP8E4M3:
      return 1;
  }
  throw InvalidArgument("unknown dtype");
}

namespace {
constexpr detail::EnumName<DType> kDTypes[] = {{DType::kBF16, "bf16"},
                                               {DType::kFP32, "fp32"},
                                               {DType::kInt32, "int32"},
                                               {DType::kInt64, "int64"},
                                               {DType::kFP8E4M3, "fp8"}};
constexpr detail::EnumName<DType> kPayloadDTypes[] = {
    {DType::kBF16, "bf16"}, {DType::kFP32, "fp32"}, {DType::kFP8E4M3, "fp8"}};
}  // namespace

const char* dtype_name(DType t) { return detail::enum_name(kDTypes, t); }
DType parse_dtype(const std::string& name) {
  return detail::parse_enum(kPayloadDTypes, name, "dtype");
}

std::string Device::describe() const {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kCuda:
      return "cuda:" + std::to_string(index);
    case DeviceType::kCudaSim:
      return "cuda-sim:" + std::to_string(index);
  }
  return "?";
}

Device Device::parse(const std::string& name) {
  const size_t colon = name.find(':');
  const std::string kind = name.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    const std::string digits = name.substr(colon + 1);
    UBEP_CHECK_ARG(!digits.empty() && digits.size() < 6 &&
                       digits.find_first_not_of("0123456789") == std::string::npos,
                   "device '", name, "': the index after ':' must be a number");
    index = std::stoi(digits);
  }
  if (kind == "cpu" && colon == std::string::npos) return {DeviceType::kCpu, 0};
  if (kind == "cuda") return {DeviceType::kCuda, index};
  if (kind == "cuda-sim") return {DeviceType::kCudaSim, index};
  throw InvalidArgument(
      detail::concat("device '", name, "' is not one of cpu, cuda[:N], cuda-sim[:N]"));
}

TensorView::TensorView(void* d, DType t, std::initializer_list<int64_t> dims) : data(d), dtype(t) {
  UBEP_CHECK_ARG(dims.size() <= 3, "tensors have at most 3 dimensions, got ", dims.size());
  for (int64_t v : dims) shape[static_cast<size_t>(ndim++)] = v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

std::string TensorView::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[static_cast<size_t>(i)];
  os << "]";
  if (device.type != DeviceType::kCpu) os << " on " << device.describe();
  return os.str();
}

}  // namespace ubep
