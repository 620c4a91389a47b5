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

// Reads obj.__dlpack__() into a view of `expect` type on `device` (the Buffer's). NumPy has no
// bfloat16: for kBF16 a uint16 array is taken as bf16 bit patterns. Devices: a DLPack kDLCUDA
// array is cuda:<device_id>; a kDLCPU array is host memory, which is cpu -- or, for a cuda-sim
// buffer, the simulation device (its memory is host memory), so it is tagged cuda-sim:N. Throws
// InvalidArgument naming `what` for objects without __dlpack__, an array on another device than
// `device` (naming both), other dtypes, more than 3 dimensions or strides that are not
// row-major contiguous.
Borrowed borrow(pb::handle obj, const char* what, DType expect, const Device& device);
// Same, for an output the module will write (rejects read-only exports).
Borrowed borrow_writable(pb::handle obj, const char* what, DType expect, const Device& device);

// A flags array (bool, or uint8: torch exports bool as either, by version) borrowed as borrow()
// does; the view carries one byte per element as kFP8E4M3 (a byte type, read as 0 / not 0).
Borrowed borrow_flags(pb::handle obj, const char* what, const Device& device);

// For a fast path set up for one call shape: `obj` borrowed as borrow() does if it is an exact
// torch.Tensor (the fast exporter's type) of exactly `expect`'s DLPack type (a uint16 tensor is
// not bf16 here), 2-D with `cols` columns, on `device`; otherwise nullopt, with nothing thrown
// (the caller's full path then checks it). A match that is not contiguous throws, as borrow().
std::optional<Borrowed> borrow_torch_matrix(pb::handle obj, const char* what, DType expect,
                                            int64_t cols, const Device& device);

// Host memory made for the caller (not a view of Buffer memory): a 64-byte aligned block of at
// least `bytes`, and its owner, a capsule that frees it. Arrays exported with that owner
// (export_capsule, to_array) keep it alive; the last one to go frees it. written_whole: the
// caller writes every byte at once (a copy, a combine's output): from 2 MiB the block is then
// whole huge pages asked for transparent huge pages, whose first touch costs ~4x less here
// than 4 KiB pages'; a block written sparsely (DeepEP's src_info) keeps ordinary pages, where
// each huge page touched would be zeroed whole.
struct HostBlock {
  char* data;
  pb::object owner;
};
HostBlock make_host_block(size_t bytes, bool written_whole = false);

// The ubep device of a DLPack device (type, id) as a Buffer on `buffer_device` sees it (kDLCPU
// is cuda-sim on a cuda-sim buffer); nullopt for devices ubep has no backend for.
std::optional<Device> device_of(int32_t dl_type, int32_t dl_id, const Device& buffer_device);

// A DLPack 0.x capsule ("dltensor") viewing `v`, holding a reference to `owner`.
pb::capsule export_capsule(const TensorView& v, pb::handle owner);

// The same view behind the Python array protocol (numpy.from_dlpack takes only such objects).
// Host views (cpu, cuda-sim) are exported as kDLCPU and have the buffer protocol; views of GPU
// memory (cuda:N) are exported as kDLCUDA and are DeviceArrayOut (no buffer protocol).
struct ArrayOut {
  TensorView view;
  pb::object owner;
};
struct DeviceArrayOut : ArrayOut {};

// How results are handed to the caller: the framework of the inputs.
enum class Kind : int { kTorch = 0, kNumpy = 1, kDLPack = 2 };

// Converts a view for `kind`, with the functions registered by the Python layer
// (torch.utils.dlpack.from_dlpack, numpy.from_dlpack). kDLPack returns the ArrayOut itself.
pb::object to_array(const TensorView& v, pb::handle owner, Kind kind);
void set_converters(pb::object torch_from_dlpack, pb::object numpy_from_dlpack);

// fp32 ones [n, k] on the device of `like` (a GPU array), made by the function the Python layer
// registered (torch.ones): dispatch weights when the caller gives none on a cuda buffer, where
// host memory will not do. Throws InvalidArgument when none is registered or it fails.
pb::object device_ones(int64_t n, int64_t k, pb::handle like);

void bind_arrays(pb::module_& m);

}  // namespace ubep::python
