// byteps.tensorflow._C: TensorFlow tensors in and out of byteps through DLPack,
// without TensorFlow's C++ ABI.
//
// In:  tf.experimental.dlpack.to_dlpack(tensor) hands out a PyCapsule named
//      "dltensor" holding a DLManagedTensor. from_dlpack() checks it (CPU
//      memory, a dtype byteps reduces, contiguous), takes ownership (renames
//      the capsule "used_dltensor", as the protocol asks of a consumer) and
//      returns a memoryview over the tensor's own bytes: byteps reads the
//      input where TensorFlow keeps it. tensor.numpy() would copy it.
// Out: HostBuffer is 64-byte aligned memory that byteps writes the result
//      into; to_dlpack() exports it as a "dltensor" capsule which
//      tf.experimental.dlpack.from_dlpack() adopts without a copy.
//      tf.convert_to_tensor(numpy_array) would copy it again.
//
// The exported memory is reference counted (std::shared_ptr), so TensorFlow
// may free its tensor on any thread, without the GIL, while a Python
// HostBuffer or memoryview still refers to the same block, and the other way
// round. Loops over tensor bytes (zeroing, copying rows in) release the GIL.
//
// The structs below are our own declarations of the stable (v0.x,
// unversioned) DLPack ABI that TensorFlow exports; the layout must match
// dlpack.h exactly.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// --- DLPack ABI (dlpack.h, DLPACK_VERSION 0.x / the legacy DLManagedTensor) ---

struct DLDevice {
  int32_t device_type;  // DLDeviceType: 1 CPU, 2 CUDA, ...
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
constexpr size_t kAlignment = 64;  // what TensorFlow (Eigen) prefers for CPU tensors

// byteps wire codes (byteps.common.dtypes.DType); never renumber.
enum BytepsDType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBfloat16 = 3, kInt32 = 4, kInt64 = 5 };

struct DTypeInfo {
  DLDataType dl;
  size_t itemsize;
};

DTypeInfo dtype_info(int code) {
  switch (code) {
    case kFloat32: return {{kDLFloat, 32, 1}, 4};
    case kFloat64: return {{kDLFloat, 64, 1}, 8};
    case kFloat16: return {{kDLFloat, 16, 1}, 2};
    case kBfloat16: return {{kDLBfloat, 16, 1}, 2};
    case kInt32: return {{kDLInt, 32, 1}, 4};
    case kInt64: return {{kDLInt, 64, 1}, 8};
    default: throw py::value_error("unknown byteps dtype code " + std::to_string(code));
  }
}

std::string device_name(int32_t type) {
  switch (type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host";
    case 4: return "opencl";
    case 7: return "vulkan";
    case 8: return "metal";
    case 10: return "rocm";
    case 11: return "rocm_host";
    case 12: return "ext_dev";
    case 13: return "cuda_managed";
    case 14: return "oneapi";
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

py::buffer_info byte_buffer(void* data, size_t nbytes) {
  // A zero-byte buffer may have a null pointer; numpy wants something.
  static unsigned char empty = 0;
  void* ptr = nbytes == 0 ? static_cast<void*>(&empty) : data;
  return py::buffer_info(ptr, 1, py::format_descriptor<unsigned char>::format(), 1,
                         {static_cast<py::ssize_t>(nbytes)}, {static_cast<py::ssize_t>(1)},
                         /*readonly=*/false);
}

// --- in: a TensorFlow tensor's bytes ---------------------------------------------------------

// Owns one consumed DLManagedTensor; calls the producer's deleter when the
// last memoryview over it goes.
class ImportedTensor {
 public:
  ImportedTensor(DLManagedTensor* managed, void* data, size_t nbytes)
      : managed_(managed), data_(data), nbytes_(nbytes) {}
  ~ImportedTensor() {
    if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  }
  ImportedTensor(const ImportedTensor&) = delete;
  ImportedTensor& operator=(const ImportedTensor&) = delete;

  py::buffer_info buffer() { return byte_buffer(data_, nbytes_); }
  size_t nbytes() const { return nbytes_; }

 private:
  DLManagedTensor* managed_;
  void* data_;
  size_t nbytes_;
};

py::tuple from_dlpack(py::object capsule) {
  PyObject* obj = capsule.ptr();
  if (!PyCapsule_CheckExact(obj)) {
    throw py::type_error(std::string("expected a DLPack capsule (tf.experimental.dlpack.to_dlpack(t)), got ") +
                         Py_TYPE(obj)->tp_name);
  }
  const char* name = PyCapsule_GetName(obj);
  if (name == nullptr || std::string(name) != kCapsuleName) {
    throw py::value_error(std::string("the capsule is named '") + (name ? name : "") +
                          "', not 'dltensor': it was already consumed (DLPack capsules are single-use) or "
                          "is a versioned DLPack capsule; pass a fresh one");
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(obj, kCapsuleName));
  if (managed == nullptr) throw py::error_already_set();
  const DLTensor& t = managed->dl_tensor;

  // Every check comes before taking ownership: a refused capsule stays the
  // producer's, whose capsule destructor frees it.
  if (t.device.device_type != kDLCPU) {
    throw py::value_error("the tensor lives on " + device_name(t.device.device_type) + ":" +
                          std::to_string(t.device.device_id) +
                          "; byteps reads CPU memory only: copy it to the CPU first");
  }
  const int code = byteps_dtype(t.dtype);
  if (code < 0) throw py::value_error("unsupported dtype " + dtype_name(t.dtype) + ": byteps reduces " + kSupported);
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
                          join(t.strides, t.ndim) + " in elements)");
  }
  const size_t nbytes = count * (t.dtype.bits / 8);
  void* data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;

  if (PyCapsule_SetName(obj, kUsedCapsuleName) != 0) throw py::error_already_set();
  // From here on the DLManagedTensor is ours: the owner's destructor calls the deleter.
  py::object owner = py::cast(new ImportedTensor(managed, data, nbytes), py::return_value_policy::take_ownership);
  py::object view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(owner.ptr()));
  if (!view) throw py::error_already_set();
  return py::make_tuple(view, code, shape);
}

// --- out: aligned memory that TensorFlow adopts --------------------------------------------

struct Block {
  explicit Block(size_t n) : nbytes(n) {
    const size_t rounded = ((n + kAlignment - 1) / kAlignment) * kAlignment;
    data = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
    if (data == nullptr) throw std::bad_alloc();
  }
  ~Block() { std::free(data); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  void* data;
  size_t nbytes;
};

// What a capsule's DLManagedTensor points back to: a share of the block and
// the shape array TensorFlow reads.
struct Export {
  DLManagedTensor managed{};
  std::shared_ptr<Block> block;
  std::vector<int64_t> shape;
};

void delete_export(DLManagedTensor* self) { delete static_cast<Export*>(self->manager_ctx); }

// A capsule nobody consumed still owns its DLManagedTensor (protocol rule).
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kCapsuleName)) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  } else {
    PyErr_Clear();
  }
}

class HostBuffer {
 public:
  HostBuffer(size_t nbytes, bool zero) : block_(std::make_shared<Block>(nbytes)) {
    if (zero && nbytes > 0) {
      py::gil_scoped_release release;
      std::memset(block_->data, 0, nbytes);
    }
  }

  py::buffer_info buffer() { return byte_buffer(block_->data, block_->nbytes); }
  size_t nbytes() const { return block_->nbytes; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(block_->data); }

  // Copy ``source`` (any C-contiguous buffer) to byte ``offset``: used to
  // place one rank's rows in a gather buffer.
  void write_at(size_t offset, py::buffer source) {
    py::buffer_info info = source.request();
    const size_t n = static_cast<size_t>(info.size) * static_cast<size_t>(info.itemsize);
    if (offset > block_->nbytes || n > block_->nbytes - offset) {
      throw py::value_error("write_at: " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                            " overflow a buffer of " + std::to_string(block_->nbytes) + " bytes");
    }
    if (n == 0) return;
    char* target = static_cast<char*>(block_->data) + offset;
    py::gil_scoped_release release;
    std::memcpy(target, info.ptr, n);
  }

  // A "dltensor" capsule over the first prod(shape) elements of ``code``.
  py::object to_dlpack(int code, const std::vector<int64_t>& shape) const {
    const DTypeInfo info = dtype_info(code);
    size_t count = 1;
    for (int64_t extent : shape) {
      if (extent < 0) throw py::value_error("to_dlpack: negative extent in shape " + shape_text(shape));
      count *= static_cast<size_t>(extent);
    }
    if (count * info.itemsize > block_->nbytes) {
      throw py::value_error("to_dlpack: shape " + shape_text(shape) + " needs " +
                            std::to_string(count * info.itemsize) + " bytes, the buffer has " +
                            std::to_string(block_->nbytes));
    }
    auto exported = std::make_unique<Export>();
    exported->block = block_;
    exported->shape = shape;
    DLTensor& t = exported->managed.dl_tensor;
    t.data = block_->data;
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = info.dl;
    t.shape = exported->shape.empty() ? nullptr : exported->shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    exported->managed.manager_ctx = exported.get();
    exported->managed.deleter = delete_export;
    PyObject* capsule = PyCapsule_New(&exported->managed, kCapsuleName, capsule_destructor);
    if (capsule == nullptr) throw py::error_already_set();
    exported.release();  // owned by the capsule now, then by its consumer
    return py::reinterpret_steal<py::object>(capsule);
  }

 private:
  static std::string shape_text(const std::vector<int64_t>& shape) {
    return join(shape.data(), static_cast<int32_t>(shape.size()));
  }

  std::shared_ptr<Block> block_;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "DLPack bridge of byteps.tensorflow: tensor bytes in, aligned result buffers out; no TensorFlow inside";
  m.attr("SUPPORTED_DTYPES") = py::make_tuple("float32", "float64", "float16", "bfloat16", "int32", "int64");
  m.attr("ALIGNMENT") = kAlignment;

  py::class_<ImportedTensor>(m, "ImportedTensor", py::buffer_protocol(),
                             "Owner of one consumed DLManagedTensor; exports its bytes, calls its deleter when freed.")
      .def_buffer(&ImportedTensor::buffer)
      .def_property_readonly("nbytes", &ImportedTensor::nbytes);

  m.def("from_dlpack", &from_dlpack, py::arg("capsule"),
        "Consume a 'dltensor' capsule of a contiguous CPU tensor; returns (memoryview of its bytes, "
        "byteps dtype code, shape). ValueError for another device, dtype or a non-contiguous tensor "
        "(the capsule is then left unconsumed).");

  py::class_<HostBuffer>(m, "HostBuffer", py::buffer_protocol(),
                         "64-byte aligned host memory that byteps writes a result into and TensorFlow adopts "
                         "through DLPack without a copy.")
      .def(py::init<size_t, bool>(), py::arg("nbytes"), py::arg("zero") = false)
      .def_buffer(&HostBuffer::buffer)
      .def_property_readonly("nbytes", &HostBuffer::nbytes)
      .def_property_readonly("address", &HostBuffer::address)
      .def("write_at", &HostBuffer::write_at, py::arg("offset"), py::arg("source"),
           "Copy a C-contiguous buffer's bytes to byte ``offset`` (GIL released).")
      .def("to_dlpack", &HostBuffer::to_dlpack, py::arg("code"), py::arg("shape"),
           "A 'dltensor' capsule over the first prod(shape) elements of byteps dtype ``code``; the memory "
           "lives until both this buffer and every consumer are gone.");
}
