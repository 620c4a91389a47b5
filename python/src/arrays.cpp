#include "arrays.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "block_cache.hpp"
#include "dlpack.hpp"
#include "ubep/error.hpp"

namespace ubep::python {

namespace {

// Registered by the Python layer at import; leaked on purpose so no destructor runs during
// interpreter shutdown.
pb::object* g_torch_from_dlpack = nullptr;
pb::object* g_numpy_from_dlpack = nullptr;
pb::object* g_device_ones = nullptr;  // (n, k, like) -> fp32 ones [n, k] on like's device
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

// What to do about an array on `got` for a buffer on `want`, as a hint after the names.
std::string move_hint(const Device& got, const Device& want) {
  if (want.type == DeviceType::kCuda)
    return detail::concat("move it with .to(\"", want.describe(), "\")");
  if (got.type == DeviceType::kCuda)
    return detail::concat("move it with .cpu(), or make the Buffer with device=\"", got.describe(),
                          "\"");
  return "host arrays are cpu; a cuda-sim buffer takes host arrays as its own";
}

// The DLPack tensor in a capsule from take_capsule (and whether its producer marked it
// read-only); throws InvalidArgument for anything else.
const dl::Tensor* capsule_tensor(pb::handle capsule, const char* what, bool* read_only) {
  PyObject* cap = capsule.ptr();
  *read_only = false;
  if (PyCapsule_IsValid(cap, "dltensor"))
    return &static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"))->dl_tensor;
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    auto* v =
        static_cast<dl::ManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    UBEP_CHECK_ARG(v->version.major == 1, what, ": DLPack version ", v->version.major,
                   " is not supported (1 or 0.x)");
    *read_only = (v->flags & dl::kFlagReadOnly) != 0;
    return &v->dl_tensor;
  }
  throw InvalidArgument(detail::concat(what, ": __dlpack__ did not return a DLPack capsule"));
}

// borrow()'s checks of the exported tensor t, and the view of it.
Borrowed view_of(pb::object capsule, const dl::Tensor* t, bool read_only, const char* what,
                 DType expect, bool writable, const Device& device) {
  Borrowed b;
  b.capsule = std::move(capsule);
  const std::optional<Device> on = device_of(t->device.device_type, t->device.device_id, device);
  UBEP_CHECK_ARG(on.has_value(), what, ": the array is on device ",
                 dl::device_name(t->device.device_type), ":", t->device.device_id,
                 " (DLPack), the buffer on ", device.describe(),
                 "; ubep takes host (cpu) and CUDA GPU arrays");
  UBEP_CHECK_ARG(*on == device, what, ": the array is on ", on->describe(), ", the buffer on ",
                 device.describe(), " (", move_hint(*on, device), ")");
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
  // An empty array may come without an address (torch exports nullptr for 0 elements); the CUDA
  // backend's input check refuses a null x even with no rows, so an empty view gets an address
  // of no bytes (never read: there is nothing to read).
  static char no_bytes[1];
  if (numel == 0 && v.data == nullptr) v.data = no_bytes;
  v.dtype = *dt;
  v.device = *on;
  v.ndim = t->ndim;
  for (int i = 0; i < t->ndim; ++i) v.shape[static_cast<size_t>(i)] = t->shape[i];
  return b;
}

Borrowed borrow_impl(pb::handle obj, const char* what, DType expect, bool writable,
                     const Device& device) {
  pb::object capsule = take_capsule(obj, what);
  bool read_only = false;
  const dl::Tensor* t = capsule_tensor(capsule, what, &read_only);
  return view_of(std::move(capsule), t, read_only, what, expect, writable, device);
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

dl::Device dl_device(const Device& d) {
  if (d.type == DeviceType::kCuda) return {dl::kCUDA, d.index};
  return {dl::kCPU, 0};
}

}  // namespace

std::optional<Device> device_of(int32_t dl_type, int32_t dl_id, const Device& buffer_device) {
  if (dl_type == dl::kCPU)  // host memory: the simulation device's memory is host memory
    return buffer_device.type == DeviceType::kCudaSim ? buffer_device : Device{};
  if (dl_type == dl::kCUDA) return Device{DeviceType::kCuda, dl_id};
  return std::nullopt;
}

Borrowed borrow(pb::handle obj, const char* what, DType expect, const Device& device) {
  return borrow_impl(obj, what, expect, false, device);
}
Borrowed borrow_writable(pb::handle obj, const char* what, DType expect, const Device& device) {
  return borrow_impl(obj, what, expect, true, device);
}

Borrowed borrow_flags(pb::handle obj, const char* what, const Device& device) {
  pb::object capsule = take_capsule(obj, what);
  bool read_only = false;
  const dl::Tensor* t = capsule_tensor(capsule, what, &read_only);
  UBEP_CHECK_ARG((t->dtype.code == dl::kBool || t->dtype.code == dl::kUInt) && t->dtype.bits == 8 &&
                     t->dtype.lanes == 1,
                 what, " must be bool, got ", dl_type_name(t->dtype));
  dl::Tensor bytes = *t;  // the same memory and shape, typed as the byte carrier
  bytes.dtype = dl_type(DType::kFP8E4M3);
  return view_of(std::move(capsule), &bytes, read_only, what, DType::kFP8E4M3, false, device);
}

std::optional<Borrowed> borrow_torch_matrix(pb::handle obj, const char* what, DType expect,
                                            int64_t cols, const Device& device) {
  if (!g_torch_to_dlpack || Py_TYPE(obj.ptr()) != g_torch_tensor_type) return std::nullopt;
  pb::object capsule = take_capsule(obj, what);
  bool read_only = false;
  const dl::Tensor* t = capsule_tensor(capsule, what, &read_only);
  const dl::DataType want = dl_type(expect);  // exactly: a uint16 tensor is not bf16 here
  if (t->dtype.code != want.code || t->dtype.bits != want.bits || t->dtype.lanes != 1 ||
      t->ndim != 2 || t->shape[1] != cols)
    return std::nullopt;
  const std::optional<Device> on = device_of(t->device.device_type, t->device.device_id, device);
  if (!on || *on != device) return std::nullopt;
  return view_of(std::move(capsule), t, read_only, what, expect, false, device);
}

namespace {
constexpr const char* kHostBlockName = "ubep.host_block";
constexpr std::align_val_t kHostBlockAlign{64};
constexpr size_t kHugePage = size_t{2} << 20;
// Blocks from map_huge, freed, for the next of about the same size: up to 8 and 1 GiB, which the
// kernel may reclaim under pressure (block_cache.hpp). Never destroyed: capsules may be freed
// during interpreter shutdown, after static destructors would have run.
BlockCache& huge_block_cache() {
  static auto* cache = new BlockCache(8, size_t{1} << 30);
  return *cache;
}
std::atomic<uint64_t> g_huge_reuses{0};
// The capsule's context: the mapped length of a block from map_huge (nullptr: operator new).
void free_host_block(PyObject* cap) {
  void* p = PyCapsule_GetPointer(cap, kHostBlockName);
  if (const auto len = reinterpret_cast<size_t>(PyCapsule_GetContext(cap)))
    huge_block_cache().give(p, len);
  else
    ::operator delete(p, kHostBlockAlign);
}
// A block of whole huge pages, aligned to one, asked for transparent huge pages: a large result
// (a prefill's received rows, a combine's output: tens of MB) costs its first touch, which in
// 4 KiB pages ran at ~1 GB/s on the project's VMs (docs/PERFORMANCE.md, issue 31, 28th
// session). The hint is only a hint: without THP the block is ordinary memory.
void* map_huge(size_t len) {
  void* raw =
      mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  if (const uintptr_t end = start + len + kHugePage; end > aligned + len)
    munmap(reinterpret_cast<void*>(aligned + len), end - aligned - len);
  madvise(reinterpret_cast<void*>(aligned), len, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}
}  // namespace

HostBlock make_host_block(size_t bytes, bool written_whole) {
  size_t len =
      written_whole && bytes >= kHugePage ? (bytes + kHugePage - 1) / kHugePage * kHugePage : 0;
  void* p = nullptr;
  if (len) {
    p = huge_block_cache().take(len, &len);
    if (p)
      g_huge_reuses.fetch_add(1, std::memory_order_relaxed);
    else
      p = map_huge(len);
  } else {
    p = ::operator new(std::max<size_t>(bytes, 64), kHostBlockAlign);
  }
  PyObject* cap = PyCapsule_New(p, kHostBlockName, free_host_block);
  if (!cap) {
    if (len)
      munmap(p, len);
    else
      ::operator delete(p, kHostBlockAlign);
    throw pb::error_already_set();
  }
  PyCapsule_SetContext(cap, reinterpret_cast<void*>(len));  // a fresh capsule: cannot fail
  return {static_cast<char*>(p), pb::reinterpret_steal<pb::object>(cap)};
}

pb::object device_ones(int64_t n, int64_t k, pb::handle like) {
  UBEP_CHECK_ARG(g_device_ones != nullptr,
                 "dispatch: topk_weights=None on a GPU buffer needs "
                 "torch (the ones are made on the GPU); pass topk_weights");
  try {
    return (*g_device_ones)(n, k, like);
  } catch (pb::error_already_set& e) {
    throw InvalidArgument(
        detail::concat("dispatch: topk_weights=None: could not make ones on the GPU (", e.what(),
                       "); pass topk_weights"));
  }
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
  // GPU memory as kDLCUDA (torch makes a CUDA tensor on that GPU); host memory -- the cpu
  // backend's and the CUDA simulation device's -- as kDLCPU.
  t.device = dl_device(v.device);
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
  pb::object out = v.device.type == DeviceType::kCuda
                       ? pb::cast(DeviceArrayOut{{v, pb::reinterpret_borrow<pb::object>(owner)}})
                       : pb::cast(ArrayOut{v, pb::reinterpret_borrow<pb::object>(owner)});
  if (kind == Kind::kNumpy && g_numpy_from_dlpack) return (*g_numpy_from_dlpack)(out);
  return out;
}

namespace {
// __dlpack__, __dlpack_device__, shape, dtype and repr: the same for host and GPU views.
template <typename C>
void def_view_methods(C& c) {
  using T = typename C::type;
  c.def(
       "__dlpack__",
       // stream: results are complete when the call returns (the CUDA backend synchronises
       // before returning), so there is nothing to order on the consumer's stream.
       // dl_device / copy (DLPack 1.0, the array API): a consumer that asks for this memory on
       // another device (NumPy asks for the CPU) or for a copy gets BufferError, never a
       // pointer it would misread.
       [](const T& a, pb::object /*stream*/, pb::kwargs kw) {
         const dl::Device d = dl_device(a.view.device);
         if (kw.contains("dl_device") && !kw["dl_device"].is_none()) {
           const auto want = kw["dl_device"].cast<std::pair<int, int>>();
           if (want.first != int(d.device_type) || want.second != int(d.device_id))
             throw pb::buffer_error(detail::concat(
                 "__dlpack__: ", a.view.describe(), " is in ", a.view.device.describe(),
                 (a.view.device.type == DeviceType::kCuda ? " GPU memory" : " memory"),
                 " and cannot be exported to DLPack device (", want.first, ", ", want.second,
                 "): ubep does not copy; take it with torch.from_dlpack or cupy"));
         }
         if (kw.contains("copy") && !kw["copy"].is_none() && kw["copy"].cast<bool>())
           throw pb::buffer_error(detail::concat("__dlpack__: copy=True is not supported for ",
                                                 a.view.describe(), " (ubep exports views)"));
         return export_capsule(a.view, a.owner);
       },
       pb::arg("stream") = pb::none())
      .def("__dlpack_device__",
           [](const T& a) {
             const dl::Device d = dl_device(a.view.device);
             return pb::make_tuple(int(d.device_type), int(d.device_id));
           })
      .def_property_readonly("shape",
                             [](const T& a) {
                               pb::tuple t(a.view.ndim);
                               for (int i = 0; i < a.view.ndim; ++i) t[i] = a.view.dim(i);
                               return t;
                             })
      .def_property_readonly("dtype", [](const T& a) { return dtype_name(a.view.dtype); })
      .def_property_readonly("device", [](const T& a) { return a.view.device.describe(); })
      .def("__repr__", [](const T& a) { return "<ubep.ArrayOut " + a.view.describe() + ">"; });
}
}  // namespace

void bind_arrays(pb::module_& m) {
  m.def(
      "_huge_block_cache",
      [] {
        BlockCache& c = huge_block_cache();
        return pb::make_tuple(c.blocks(), c.bytes(), g_huge_reuses.load());
      },
      "(blocks kept, bytes kept, blocks reused so far) of the freed result blocks kept for reuse.");
  pb::class_<ArrayOut> host(m, "ArrayOut", pb::buffer_protocol(),
                            "A view of ubep host memory behind the DLPack protocol "
                            "(torch.utils.dlpack.from_dlpack, numpy.from_dlpack) and the buffer "
                            "protocol (numpy.asarray: writable, and bf16 as uint16 bit patterns, "
                            "which NumPy's DLPack import lacks).");
  host.def_buffer([](ArrayOut& a) {
    std::vector<pb::ssize_t> shape, strides;
    const auto item = static_cast<pb::ssize_t>(dtype_size(a.view.dtype));
    pb::ssize_t stride = item;
    for (int i = a.view.ndim - 1; i >= 0; --i) {
      shape.insert(shape.begin(), a.view.dim(i));
      strides.insert(strides.begin(), stride);
      stride *= a.view.dim(i);
    }
    const char* format = a.view.dtype == DType::kBF16      ? "H"
                         : a.view.dtype == DType::kFP32    ? "f"
                         : a.view.dtype == DType::kInt32   ? "i"
                         : a.view.dtype == DType::kFP8E4M3 ? "B"  // e4m3 codes as bytes
                                                           : "q";
    return pb::buffer_info(a.view.data, item, format, a.view.ndim, shape, strides, false);
  });
  def_view_methods(host);
  // GPU memory: DLPack only (torch.from_dlpack, cupy.from_dlpack); no buffer protocol, and
  // numpy.asarray is refused by name instead of making an object array.
  pb::class_<DeviceArrayOut> gpu(m, "DeviceArrayOut",
                                 "A view of ubep GPU memory (a cuda buffer's result) behind the "
                                 "DLPack protocol (kDLCUDA): torch.from_dlpack, cupy.from_dlpack.");
  def_view_methods(gpu);
  gpu.def("__array__", [](const DeviceArrayOut& a, pb::args, pb::kwargs) -> pb::object {
    throw InvalidArgument(detail::concat(
        "a view of GPU memory (", a.view.describe(),
        ") has no NumPy form: take it with torch.from_dlpack (then .cpu()) or cupy"));
  });
  m.def("_set_converters", &set_converters, pb::arg("torch_from_dlpack"),
        pb::arg("numpy_from_dlpack"));
  m.def(
      "_set_device_ones", [](pb::object f) { g_device_ones = new pb::object(std::move(f)); },
      "Registers (n, k, like) -> fp32 ones [n, k] on like's device (dispatch weights when none "
      "are given on a cuda buffer).");
  m.def(
      "_set_torch_fast_path",
      [](pb::object tensor_type, pb::object to_dlpack) {
        g_torch_tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type.release().ptr());
        g_torch_to_dlpack = new pb::object(to_dlpack);
      },
      "Registers torch.Tensor and torch.to_dlpack: exact torch.Tensor inputs are exported by "
      "the C function directly.");
  m.def(
      "_parse_device", [](const std::string& name) { return Device::parse(name).describe(); },
      "The canonical name of a device (\"cpu\", \"cuda:N\", \"cuda-sim:N\"); InvalidArgument "
      "for other names.");
  m.def(
      "_borrow_info",
      [](pb::handle obj, const std::string& expect, const std::string& device) {
        Borrowed b = borrow(obj, "array",
                            expect == "bf16"    ? DType::kBF16
                            : expect == "fp32"  ? DType::kFP32
                            : expect == "int32" ? DType::kInt32
                                                : DType::kInt64,
                            Device::parse(device));
        return pb::make_tuple(reinterpret_cast<uintptr_t>(b.view.data), b.view.describe());
      },
      pb::arg("obj"), pb::arg("expect"), pb::arg("device") = "cpu",
      "Test hook: the address and description ubep reads an array at (zero-copy checks), as a "
      "buffer on `device` takes it.");
}

}  // namespace ubep::python
