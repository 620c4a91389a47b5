// Arrays in and out of the module, through DLPack only (no framework is linked).
//
// In: any object with __dlpack__ (torch tensors, numpy arrays, ...) is read in place for the
// length of one call. Out: views of ubep memory as DLPack capsules (torch takes those) or as
// ArrayOut objects with __dlpack__/__dlpack_device__ (numpy.from_dlpack needs the protocol);
// every export holds a reference to its owner (the Buffer), so the memory stays mapped while any
// consumer still points at it. What the memory holds is the Buffer's business: see PYTHON.md.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "ubep/types.hpp"

namespace ubep::python {

namespace pb = pybind11;

// An input array borrowed for one call: the view, and the capsule that keeps the producer's
// export alive until the borrow ends (the producer frees it with the capsule).
struct Borrowed {
  TensorView view;
  pb::object capsule;
};

// Reads obj.__dlpack__() into a view of `expect` type. NumPy has no bfloat16: for kBF16 a
// uint16 array is taken as bf16 bit patterns. Throws InvalidArgument naming `what` for objects
// without __dlpack__, non-CPU devices, other dtypes, more than 3 dimensions or strides that are
// not row-major contiguous.
Borrowed borrow(pb::handle obj, const char* what, DType expect);
// Same, for an output the module will write (rejects read-only exports).
Borrowed borrow_writable(pb::handle obj, const char* what, DType expect);

// A DLPack 0.x capsule ("dltensor") viewing `v`, holding a reference to `owner`.
pb::capsule export_capsule(const TensorView& v, pb::handle owner);

// The same view behind the Python array protocol (numpy.from_dlpack takes only such objects).
struct ArrayOut {
  TensorView view;
  pb::object owner;
};

// How results are handed to the caller: the framework of the inputs.
enum class Kind : int { kTorch = 0, kNumpy = 1, kDLPack = 2 };

// Converts a view for `kind`, with the functions registered by the Python layer
// (torch.utils.dlpack.from_dlpack, numpy.from_dlpack). kDLPack returns the ArrayOut itself.
pb::object to_array(const TensorView& v, pb::handle owner, Kind kind);
void set_converters(pb::object torch_from_dlpack, pb::object numpy_from_dlpack);

void bind_arrays(pb::module_& m);

}  // namespace ubep::python
