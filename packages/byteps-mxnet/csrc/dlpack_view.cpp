// See dlpack_view.h. Why not numpy.from_dlpack: numpy 1.23 (the one MXNet
// 1.9 runs with) refuses MXNet's capsules without __dlpack__, and has no
// bfloat16; why not libmxnet: its C++ types change between releases, the
// DLPack C ABI does not.

#include "dlpack_view.h"

#include <sstream>

namespace py = pybind11;

namespace byteps_mxnet {
namespace {

constexpr int32_t kDLCPU = 1;
constexpr uint8_t kDLInt = 0;
constexpr uint8_t kDLUInt = 1;
constexpr uint8_t kDLFloat = 2;
constexpr uint8_t kDLBfloat = 4;
constexpr uint8_t kDLBool = 6;

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr const char* kSupported = "float16, float32, float64, bfloat16, int32, int64";

// byteps wire codes (byteps.common.dtypes.DType); never renumber.
enum BytepsDType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBfloat16 = 3, kInt32 = 4, kInt64 = 5 };

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

std::string dtype_name(const DLDataType& t) {
  std::string base;
  switch (t.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLBool: return "bool";
    default: base = "type code " + std::to_string(t.code) + " of ";
  }
  std::string name = base + std::to_string(t.bits);
  if (t.lanes != 1) name += " x" + std::to_string(t.lanes) + " lanes";
  return name;
}

std::string join(const int64_t* values, int32_t n) {
  std::ostringstream out;
  out << "[";
  for (int32_t i = 0; i < n; ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

// Row-major contiguity; extent-1 dimensions may carry any stride, and a
// tensor without elements is contiguous.
bool is_contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return true;
  }
  int64_t expected = 1;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// Owns one DLManagedTensor and exports its bytes; calls MXNet's deleter when freed.
class DLPackBuffer {
 public:
  DLPackBuffer(DLManagedTensor* managed, void* data, size_t nbytes)
      : managed_(managed), data_(data), nbytes_(nbytes) {}
  ~DLPackBuffer() { release(managed_); }
  DLPackBuffer(const DLPackBuffer&) = delete;
  DLPackBuffer& operator=(const DLPackBuffer&) = delete;

  py::buffer_info buffer() {
    static unsigned char empty = 0;  // a zero-byte array may have a null data pointer
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

}  // namespace

void release(DLManagedTensor* managed) {
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

std::string refusal(const DLTensor& t) {
  if (t.device.device_type != kDLCPU) {
    return "the array lives on device type " + std::to_string(t.device.device_type) +
           "; byteps reads CPU memory only (copy it to mx.cpu() first)";
  }
  if (byteps_dtype(t.dtype) < 0) {
    return "unsupported dtype " + dtype_name(t.dtype) + ": byteps reduces " + kSupported;
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    return "malformed DLPack tensor: ndim " + std::to_string(t.ndim);
  }
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) return "malformed DLPack tensor: shape " + join(t.shape, t.ndim);
  }
  if (!is_contiguous(t)) {
    return "the array is not contiguous (shape " + join(t.shape, t.ndim) + ", strides " +
           join(t.strides, t.ndim) + " in elements)";
  }
  return "";
}

py::tuple take_view(DLManagedTensor* managed) {
  const DLTensor& t = managed->dl_tensor;
  const std::string why = refusal(t);
  if (!why.empty()) throw py::value_error(why);
  size_t count = 1;
  py::tuple shape(t.ndim);
  for (int32_t d = 0; d < t.ndim; ++d) {
    count *= static_cast<size_t>(t.shape[d]);
    shape[d] = py::int_(t.shape[d]);
  }
  const size_t nbytes = count * (t.dtype.bits / 8);
  void* data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;
  const int code = byteps_dtype(t.dtype);
  // From here on the DLManagedTensor belongs to the owner object.
  py::object owner = py::cast(new DLPackBuffer(managed, data, nbytes), py::return_value_policy::take_ownership);
  py::object view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(owner.ptr()));
  if (!view) throw py::error_already_set();
  return py::make_tuple(view, code, shape);
}

py::tuple from_dlpack(py::object capsule) {
  PyObject* obj = capsule.ptr();
  if (!PyCapsule_CheckExact(obj)) {
    throw py::type_error(std::string("expected a DLPack capsule (NDArray.to_dlpack_for_write()), got ") +
                         Py_TYPE(obj)->tp_name);
  }
  const char* name = PyCapsule_GetName(obj);
  if (name == nullptr || std::string(name) != kCapsuleName) {
    throw py::value_error(std::string("the capsule is named '") + (name ? name : "") +
                          "', not 'dltensor': DLPack capsules can be consumed only once");
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(obj, kCapsuleName));
  if (managed == nullptr) throw py::error_already_set();
  // take_view checks before owning: a refused capsule stays MXNet's, whose destructor frees it.
  py::tuple result = take_view(managed);
  if (PyCapsule_SetName(obj, kUsedCapsuleName) != 0) throw py::error_already_set();
  return result;
}

void register_dlpack_view(py::module_& m) {
  m.attr("SUPPORTED_DTYPES") = py::make_tuple("float16", "float32", "float64", "bfloat16", "int32", "int64");
  py::class_<DLPackBuffer>(m, "DLPackBuffer", py::buffer_protocol(),
                           "Owner of one DLManagedTensor; exports its bytes, calls MXNet's deleter when freed.")
      .def_buffer(&DLPackBuffer::buffer)
      .def_property_readonly("nbytes", &DLPackBuffer::nbytes);
  m.def("from_dlpack", &from_dlpack, py::arg("capsule"),
        "Consume a 'dltensor' capsule of a contiguous CPU array; returns (memoryview of its bytes, "
        "byteps dtype code, shape). ValueError for another device or dtype, or a used capsule "
        "(which is then left unconsumed).");
}

}  // namespace byteps_mxnet
