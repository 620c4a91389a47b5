#include "arrays.hpp"

#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "dlpack.hpp"
#include "ubep/error.hpp"

namespace ubep::python {

namespace {

// Registered by the Python layer at import; leaked on purpose so no destructor runs during
// interpreter shutdown.
pb::object* g_torch_from_dlpack = nullptr;
pb::object* g_numpy_from_dlpack = nullptr;
// Fast exporter for exact torch.Tensor inputs (torch.to_dlpack, a C function): skips the Python
// body of Tensor.__dlpack__, which costs about a microsecond per argument.
PyTypeObject* g_torch_tensor_type = nullptr;
pb::object* g_torch_to_dlpack = nullptr;

std::string dl_type_name(const dl::DataType& t) {
  const char* base = "?";
  switch (t.code) {
    case dl::kInt:
      base = "int";
      break;
    case dl::kUInt:
      base = "uint";
      break;
    case dl::kFloat:
      base = "float";
      break;
    case dl::kBfloat:
      base = "bfloat";
      break;
    case dl::kComplex:
      base = "complex";
      break;
    case dl::kBool:
      return "bool";
    default:
      base = "opaque";
  }
  std::string s = base + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

// The ubep type a DLPack type maps to, if any (uint16 only where bf16 is expected).
std::optional<DType> to_dtype(const dl::DataType& t, DType expect) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == dl::kBfloat && t.bits == 16) return DType::kBF16;
  if (t.code == dl::kUInt && t.bits == 16 && expect == DType::kBF16) return DType::kBF16;
  if (t.code == dl::kFloat && t.bits == 32) return DType::kFP32;
  if (t.code == dl::kInt && t.bits == 32) return DType::kInt32;
  if (t.code == dl::kInt && t.bits == 64) return DType::kInt64;
  // fp8 e4m3 codes travel as bytes: torch < 2.1 and NumPy have no float8 dtype, and the Python
  // layer views torch.float8_e4m3fn as uint8 before export (DLPack float8 codes are recent).
  if (t.code == dl::kUInt && t.bits == 8 && expect == DType::kFP8E4M3) return DType::kFP8E4M3;
  return std::nullopt;
}

const char* expect_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bfloat16 (torch.bfloat16, or uint16 bf16 bit patterns for NumPy)";
    case DType::kFP32:
      return "float32";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFP8E4M3:
      return "fp8 e4m3 codes (uint8, or torch.float8_e4m3fn)";
  }
  return "?";
}

std::string shape_str(const int64_t* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Calls __dlpack__ (or the torch fast path). Producer failures (a tensor that requires grad, a
// read-only NumPy array) become InvalidArgument; a tensor that requires grad is read through
// detach(), since dispatch and combine are not differentiable ops.
pb::object take_capsule(pb::handle obj, const char* what) {
  try {
    if (g_torch_to_dlpack && Py_TYPE(obj.ptr()) == g_torch_tensor_type) {
      // Vectorcall without an argument tuple: this runs for every array of every call.
      PyObject* cap = PyObject_CallOneArg(g_torch_to_dlpack->ptr(), obj.ptr());
      if (!cap) throw pb::error_already_set();
      return pb::reinterpret_steal<pb::object>(cap);
    }
    if (!pb::hasattr(obj, "__dlpack__"))
      throw InvalidArgument(detail::concat(
          what, ": expected an array with __dlpack__ (torch.Tensor", " or numpy.ndarray), got ",
          std::string(pb::str(pb::type::of(obj).attr("__name__")))));
    try {
      return obj.attr("__dlpack__")();
    } catch (pb::error_already_set&) {
      if (!pb::hasattr(obj, "detach")) throw;
      return obj.attr("detach")().attr("__dlpack__")();
    }
  } catch (pb::error_already_set& e) {
    throw InvalidArgument(
        detail::concat(what, ": the array could not be exported through DLPack: ", e.what()));
  }
}

Borrowed borrow_impl(pb::handle obj, const char* what, DType expect, bool writable) {
  Borrowed b;
  b.capsule = take_capsule(obj, what);
  PyObject* cap = b.capsule.ptr();
  const dl::Tensor* t = nullptr;
  bool read_only = false;
  if (PyCapsule_IsValid(cap, "dltensor")) {
    t = &static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"))->dl_tensor;
  } else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    auto* v =
        static_cast<dl::ManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    UBEP_CHECK_ARG(v->version.major == 1, what, ": DLPack version ", v->version.major,
                   " is not supported (1 or 0.x)");
    t = &v->dl_tensor;
    read_only = (v->flags & dl::kFlagReadOnly) != 0;
  } else {
    throw InvalidArgument(detail::concat(what, ": __dlpack__ did not return a DLPack capsule"));
  }
  UBEP_CHECK_ARG(t->device.device_type == dl::kCPU, what, ": the array is on device ",
                 dl::device_name(t->device.device_type), ":", t->device.device_id,
                 "; this build of ubep works on CPU memory (move it with .cpu())");
  const std::optional<DType> dt = to_dtype(t->dtype, expect);
  UBEP_CHECK_ARG(dt && *dt == expect, what, " must be ", expect_name(expect), ", got ",
                 dl_type_name(t->dtype));
  UBEP_CHECK_ARG(t->ndim >= 1 && t->ndim <= 3, what, " must have 1 to 3 dimensions, got ", t->ndim,
                 " ", shape_str(t->shape, t->ndim));
  int64_t numel = 1;
  for (int i = 0; i < t->ndim; ++i) numel *= t->shape[i];
  if (t->strides && numel > 0) {  // an empty array has no layout to check
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      UBEP_CHECK_ARG(t->shape[i] == 1 || t->strides[i] == expected, what,
                     " must be contiguous (row-major): shape ", shape_str(t->shape, t->ndim),
                     " has strides ", shape_str(t->strides, t->ndim),
                     " (elements); pass x.contiguous() or numpy.ascontiguousarray(x)");
      expected *= t->shape[i];
    }
  }
  UBEP_CHECK_ARG(!(writable && read_only), what, " is read-only");
  TensorView& v = b.view;
  v.data = static_cast<char*>(t->data) + t->byte_offset;
  v.dtype = *dt;
  v.ndim = t->ndim;
  for (int i = 0; i < t->ndim; ++i) v.shape[static_cast<size_t>(i)] = t->shape[i];
  return b;
}

// What a capsule owns: the managed tensor, its shape, and the reference to the owner.
struct Export {
  dl::ManagedTensor mt;
  int64_t shape[3];
  PyObject* owner;
};

void delete_export(dl::ManagedTensor* self) {
  auto* e = static_cast<Export*>(self->manager_ctx);
  // Consumers (torch) may free their tensor on a thread that does not hold the GIL.
  if (Py_IsInitialized()) {
    PyGILState_STATE s = PyGILState_Ensure();
    Py_XDECREF(e->owner);
    PyGILState_Release(s);
  }
  delete e;
}

void capsule_destructor(PyObject* cap) {
  // Still named "dltensor": no consumer took it, so it is ours to free.
  if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* mt = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    mt->deleter(mt);
  }
}

dl::DataType dl_type(DType t) {
  switch (t) {
    case DType::kBF16:
      return {dl::kBfloat, 16, 1};
    case DType::kFP32:
      return {dl::kFloat, 32, 1};
    case DType::kInt32:
      return {dl::kInt, 32, 1};
    case DType::kInt64:
      return {dl::kInt, 64, 1};
    case DType::kFP8E4M3:  // e4m3 codes as bytes
      return {dl::kUInt, 8, 1};
  }
  return {dl::kFloat, 32, 1};
}

}  // namespace

Borrowed borrow(pb::handle obj, const char* what, DType expect) {
  return borrow_impl(obj, what, expect, false);
}
Borrowed borrow_writable(pb::handle obj, const char* what, DType expect) {
  return borrow_impl(obj, what, expect, true);
}

pb::capsule export_capsule(const TensorView& v, pb::handle owner) {
  auto* e = new Export{};
  for (int i = 0; i < v.ndim; ++i) e->shape[i] = v.shape[static_cast<size_t>(i)];
  e->owner = owner.ptr();
  Py_XINCREF(e->owner);
  e->mt.manager_ctx = e;
  e->mt.deleter = delete_export;
  dl::Tensor& t = e->mt.dl_tensor;
  t.data = v.data;
  t.device = {dl::kCPU, 0};
  t.ndim = v.ndim;
  t.dtype = dl_type(v.dtype);
  t.shape = e->shape;
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  PyObject* cap = PyCapsule_New(&e->mt, "dltensor", capsule_destructor);
  if (!cap) {
    delete_export(&e->mt);
    throw pb::error_already_set();
  }
  return pb::reinterpret_steal<pb::capsule>(cap);
}

void set_converters(pb::object torch_from_dlpack, pb::object numpy_from_dlpack) {
  if (!torch_from_dlpack.is_none()) g_torch_from_dlpack = new pb::object(torch_from_dlpack);
  if (!numpy_from_dlpack.is_none()) g_numpy_from_dlpack = new pb::object(numpy_from_dlpack);
}

pb::object to_array(const TensorView& v, pb::handle owner, Kind kind) {
  if (kind == Kind::kTorch && g_torch_from_dlpack) {
    pb::capsule cap = export_capsule(v, owner);
    PyObject* t = PyObject_CallOneArg(g_torch_from_dlpack->ptr(), cap.ptr());
    if (!t) throw pb::error_already_set();
    return pb::reinterpret_steal<pb::object>(t);
  }
  pb::object out = pb::cast(ArrayOut{v, pb::reinterpret_borrow<pb::object>(owner)});
  if (kind == Kind::kNumpy && g_numpy_from_dlpack) return (*g_numpy_from_dlpack)(out);
  return out;
}

void bind_arrays(pb::module_& m) {
  pb::class_<ArrayOut>(m, "ArrayOut", pb::buffer_protocol(),
                       "A view of ubep memory behind the DLPack protocol "
                       "(torch.utils.dlpack.from_dlpack, numpy.from_dlpack) and the buffer "
                       "protocol (numpy.asarray: writable, and bf16 as uint16 bit patterns, "
                       "which NumPy's DLPack import lacks).")
      .def_buffer([](ArrayOut& a) {
        std::vector<pb::ssize_t> shape, strides;
        const auto item = static_cast<pb::ssize_t>(dtype_size(a.view.dtype));
        pb::ssize_t stride = item;
        for (int i = a.view.ndim - 1; i >= 0; --i) {
          shape.insert(shape.begin(), a.view.dim(i));
          strides.insert(strides.begin(), stride);
          stride *= a.view.dim(i);
        }
        const char* format = a.view.dtype == DType::kBF16    ? "H"
                             : a.view.dtype == DType::kFP32  ? "f"
                             : a.view.dtype == DType::kInt32 ? "i"
                             : a.view.dtype == DType::kFP8E4M3 ? "B"  // e4m3 codes as bytes
                                                             : "q";
        return pb::buffer_info(a.view.data, item, format, a.view.ndim, shape, strides, false);
      })
      .def(
          "__dlpack__",
          [](const ArrayOut& a, pb::object /*stream*/, pb::kwargs) {
            return export_capsule(a.view, a.owner);
          },
          pb::arg("stream") = pb::none())
      .def("__dlpack_device__", [](const ArrayOut&) { return pb::make_tuple(int(dl::kCPU), 0); })
      .def_property_readonly("shape",
                             [](const ArrayOut& a) {
                               pb::tuple t(a.view.ndim);
                               for (int i = 0; i < a.view.ndim; ++i) t[i] = a.view.dim(i);
                               return t;
                             })
      .def_property_readonly("dtype", [](const ArrayOut& a) { return dtype_name(a.view.dtype); })
      .def("__repr__",
           [](const ArrayOut& a) { return "<ubep.ArrayOut " + a.view.describe() + ">"; });
  m.def("_set_converters", &set_converters, pb::arg("torch_from_dlpack"),
        pb::arg("numpy_from_dlpack"));
  m.def(
      "_set_torch_fast_path",
      [](pb::object tensor_type, pb::object to_dlpack) {
        g_torch_tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type.release().ptr());
        g_torch_to_dlpack = new pb::object(to_dlpack);
      },
      "Registers torch.Tensor and torch.to_dlpack: exact torch.Tensor inputs are exported by "
      "the C function directly.");
  m.def(
      "_borrow_info",
      [](pb::handle obj, const std::string& expect) {
        Borrowed b = borrow(obj, "array",
                            expect == "bf16"    ? DType::kBF16
                            : expect == "fp32"  ? DType::kFP32
                            : expect == "int32" ? DType::kInt32
                                                : DType::kInt64);
        return pb::make_tuple(reinterpret_cast<uintptr_t>(b.view.data), b.view.describe());
      },
      "Test hook: the address and description ubep reads an array at (zero-copy checks).");
}

}  // namespace ubep::python
