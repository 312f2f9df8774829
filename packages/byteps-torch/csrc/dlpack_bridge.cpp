// byteps.torch._C: a tensor's memory seen through DLPack, without libtorch.
//
// torch.Tensor.__dlpack__() hands out a PyCapsule named "dltensor" holding a
// DLManagedTensor. from_dlpack() checks it (CPU memory, a dtype byteps
// reduces, contiguous strides), takes ownership (renaming the capsule
// "used_dltensor", as the protocol asks of a consumer) and returns a writable
// memoryview over the bytes. The memoryview keeps a small owner object alive,
// and the owner calls the producer's deleter when the last view is released,
// so the tensor's storage outlives every use of its bytes.
//
// Why not numpy.from_dlpack: numpy has no bfloat16 and refuses such tensors.
// Why not libtorch: a compiled adapter that links libtorch breaks with an
// undefined symbol on the next torch upgrade; the DLPack C ABI is stable.
//
// The structs below are our own declarations of the stable (v0.x, unversioned)
// DLPack ABI, which torch exports by default; only the fields we read matter,
// but the layout must match dlpack.h exactly.

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// --- DLPack ABI (dlpack.h, DLPACK_VERSION 0.x / the legacy DLManagedTensor) ---

struct DLDevice {
  int32_t device_type;  // DLDeviceType enum: 1 CPU, 2 CUDA, ...
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;  // DLDataTypeCode: 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL means compact row-major
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

constexpr int32_t kDLCPU = 1;
constexpr uint8_t kDLInt = 0;
constexpr uint8_t kDLUInt = 1;
constexpr uint8_t kDLFloat = 2;
constexpr uint8_t kDLBfloat = 4;
constexpr uint8_t kDLComplex = 5;
constexpr uint8_t kDLBool = 6;

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr const char* kSupported = "float32, float64, float16, bfloat16, int32, int64";

// byteps wire codes (byteps.common.dtypes.DType); never renumber.
enum BytepsDType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBfloat16 = 3, kInt32 = 4, kInt64 = 5 };

std::string device_name(int32_t type) {
  switch (type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host";
    case 4: return "opencl";
    case 7: return "vulkan";
    case 8: return "metal";
    case 9: return "vpi";
    case 10: return "rocm";
    case 11: return "rocm_host";
    case 12: return "ext_dev";
    case 13: return "cuda_managed";
    case 14: return "oneapi";
    case 15: return "webgpu";
    case 16: return "hexagon";
    case 17: return "maia";
    default: return "device type " + std::to_string(type);
  }
}

std::string dtype_name(const DLDataType& t) {
  std::string base;
  switch (t.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLComplex: base = "complex"; break;
    case kDLBool: return t.lanes == 1 ? "bool" : "bool x" + std::to_string(t.lanes);
    default: base = "type code " + std::to_string(t.code) + " of ";
  }
  std::string name = base + std::to_string(t.bits);
  if (t.lanes != 1) name += " x" + std::to_string(t.lanes) + " lanes";
  return name;
}

// The byteps code of a DLPack dtype, or -1.
int byteps_dtype(const DLDataType& t) {
  if (t.lanes != 1) return -1;
  if (t.code == kDLFloat && t.bits == 32) return kFloat32;
  if (t.code == kDLFloat && t.bits == 64) return kFloat64;
  if (t.code == kDLFloat && t.bits == 16) return kFloat16;
  if (t.code == kDLBfloat && t.bits == 16) return kBfloat16;
  if (t.code == kDLInt && t.bits == 32) return kInt32;
  if (t.code == kDLInt && t.bits == 64) return kInt64;
  return -1;
}

std::string join(const int64_t* values, int32_t n) {
  std::ostringstream out;
  out << "[";
  for (int32_t i = 0; i < n; ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

// Row-major contiguity. Dimensions of extent 1 may carry any stride (torch
// gives them arbitrary ones), and a tensor without elements is contiguous.
bool is_contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] == 0) return true;
  }
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// Owns one DLManagedTensor; its buffer is the tensor's bytes. Destroyed (and
// the producer's deleter called) when the last memoryview over it goes.
class DLPackBuffer {
 public:
  DLPackBuffer(DLManagedTensor* managed, void* data, size_t nbytes)
      : managed_(managed), data_(data), nbytes_(nbytes) {}
  ~DLPackBuffer() {
    if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  }
  DLPackBuffer(const DLPackBuffer&) = delete;
  DLPackBuffer& operator=(const DLPackBuffer&) = delete;

  py::buffer_info buffer() {
    // A zero-byte tensor may have a null data pointer; point at something.
    static unsigned char empty = 0;
    void* ptr = nbytes_ == 0 ? static_cast<void*>(&empty) : data_;
    return py::buffer_info(ptr, 1, py::format_descriptor<unsigned char>::format(), 1,
                           {static_cast<py::ssize_t>(nbytes_)}, {static_cast<py::ssize_t>(1)},
                           /*readonly=*/false);
  }
  size_t nbytes() const { return nbytes_; }

 private:
  DLManagedTensor* managed_;
  void* data_;
  size_t nbytes_;
};

py::tuple from_dlpack(py::object capsule) {
  PyObject* obj = capsule.ptr();
  if (!PyCapsule_CheckExact(obj)) {
    throw py::type_error(std::string("expected a DLPack capsule (tensor.__dlpack__()), got ") +
                         Py_TYPE(obj)->tp_name);
  }
  const char* name = PyCapsule_GetName(obj);
  if (name == nullptr || std::string(name) != kCapsuleName) {
    throw py::value_error(
        std::string("the capsule is named '") + (name ? name : "") +
        "', not 'dltensor': it was already consumed (DLPack capsules are single-use) or is a "
        "versioned DLPack capsule; pass a fresh tensor.__dlpack__()");
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(obj, kCapsuleName));
  if (managed == nullptr) throw py::error_already_set();
  const DLTensor& t = managed->dl_tensor;

  // Every check comes before taking ownership: a refused capsule stays the
  // producer's, whose capsule destructor frees it.
  if (t.device.device_type != kDLCPU) {
    throw py::value_error("the tensor lives on " + device_name(t.device.device_type) + ":" +
                          std::to_string(t.device.device_id) +
                          "; byteps reads CPU memory only: it must be staged to the CPU first "
                          "(tensor.cpu())");
  }
  const int code = byteps_dtype(t.dtype);
  if (code < 0) {
    throw py::value_error("unsupported dtype " + dtype_name(t.dtype) + ": byteps reduces " + kSupported);
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    throw py::value_error("malformed DLPack tensor: ndim " + std::to_string(t.ndim) +
                          (t.shape == nullptr ? " without a shape" : ""));
  }
  size_t count = 1;
  py::tuple shape(t.ndim);
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) throw py::value_error("malformed DLPack tensor: shape " + join(t.shape, t.ndim));
    count *= static_cast<size_t>(t.shape[d]);
    shape[d] = py::int_(t.shape[d]);
  }
  if (!is_contiguous(t)) {
    throw py::value_error("the tensor is not contiguous (shape " + join(t.shape, t.ndim) + ", strides " +
                          join(t.strides, t.ndim) +
                          " in elements); pass a contiguous tensor, e.g. tensor.contiguous()");
  }
  const size_t nbytes = count * (t.dtype.bits / 8);
  void* data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;

  if (PyCapsule_SetName(obj, kUsedCapsuleName) != 0) throw py::error_already_set();
  // From here on the DLManagedTensor is ours: the owner's destructor calls the deleter.
  py::object owner = py::cast(new DLPackBuffer(managed, data, nbytes), py::return_value_policy::take_ownership);
  py::object view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(owner.ptr()));
  if (!view) throw py::error_already_set();
  return py::make_tuple(view, code, shape);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "DLPack bridge of byteps.torch: a CPU tensor's bytes as a memoryview, no libtorch";
  m.attr("SUPPORTED_DTYPES") = py::make_tuple("float32", "float64", "float16", "bfloat16", "int32", "int64");

  py::class_<DLPackBuffer>(m, "DLPackBuffer", py::buffer_protocol(),
                           "Owner of one DLManagedTensor; exports its bytes, calls its deleter when freed.")
      .def_buffer(&DLPackBuffer::buffer)
      .def_property_readonly("nbytes", &DLPackBuffer::nbytes);

  m.def("from_dlpack", &from_dlpack, py::arg("capsule"),
        "Consume a 'dltensor' capsule of a contiguous CPU tensor; returns (memoryview of its bytes, "
        "byteps dtype code, shape). ValueError for another device, dtype or a non-contiguous "
        "tensor (the capsule is then left unconsumed).");
}
