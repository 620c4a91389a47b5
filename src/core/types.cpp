#include "ubep/types.hpp"

#include <sstream>

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
  }
  throw InvalidArgument("unknown dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP32:
      return "fp32";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "fp32") return DType::kFP32;
  throw InvalidArgument("unknown dtype '" + name + "' (expected bf16 or fp32)");
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
  return os.str();
}

}  // namespace ubep
