// byteps.tensorflow._C: TensorFlow tensors in and out of byteps through DLPack,
// without TensorFlow's C++ ABI.
//
// In:  tf.experimental.dlpack.to_dlpack(tensor) hands out a PyCapsule named
//      "dltensor" holding a DLManagedTensor. from_dlpack() checks it (CPU
//      memory, a dtype byteps reduces, contiguous, sizes that fit), takes
//      ownership (renames the capsule "used_dltensor", as the protocol asks of
//      a consumer) and returns a memoryview over the tensor's own bytes:
//      byteps reads the input where TensorFlow keeps it. tensor.numpy() would
//      copy it. The reading is byteps-common's (byteps/dlpack_capsule.h).
// Out: HostBuffer is 64-byte aligned memory that byteps writes the result
//      into; to_dlpack() exports it as a "dltensor" capsule which
//      tf.experimental.dlpack.from_dlpack() adopts without a copy.
//      tf.convert_to_tensor(numpy_array) would copy it again.
//
// The exported memory is reference counted (std::shared_ptr), so TensorFlow
// may free its tensor on any thread, without the GIL, while a Python
// HostBuffer or memoryview still refers to the same block, and the other way
// round. Loops over tensor bytes (zeroing, copying rows in) release the GIL.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "byteps/buffer_arg.h"
#include "byteps/dlpack.h"
#include "byteps/dlpack_capsule.h"

namespace py = pybind11;
namespace dl = byteps::dlpack;

namespace {

constexpr size_t kAlignment = 64;  // what TensorFlow (Eigen) prefers for CPU tensors

// --- in: a TensorFlow tensor's bytes ---------------------------------------------------------

dl::Wording tf_wording() {
  dl::Wording wording;
  wording.noun = "tensor";
  wording.device_hint = ": copy it to the CPU first";
  return wording;
}

py::tuple from_dlpack(py::object capsule) {
  static const dl::Wording wording = tf_wording();
  return dl::from_capsule(capsule, wording, {"tf.experimental.dlpack.to_dlpack(t)"});
}

// --- out: aligned memory that TensorFlow adopts --------------------------------------------

struct Block {
  explicit Block(size_t n) : nbytes(n) {
    if (n > SIZE_MAX - kAlignment) throw std::bad_alloc();
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
  dl::DLManagedTensor managed{};
  std::shared_ptr<Block> block;
  std::vector<int64_t> shape;
};

void delete_export(dl::DLManagedTensor* self) { delete static_cast<Export*>(self->manager_ctx); }

// A capsule nobody consumed still owns its DLManagedTensor (protocol rule). It may run
// while an exception is propagating, so it neither raises nor clears one.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, dl::kCapsuleName)) {
    dl::release(static_cast<dl::DLManagedTensor*>(PyCapsule_GetPointer(capsule, dl::kCapsuleName)));
  }
}

std::string shape_text(const std::vector<int64_t>& shape) { return dl::join(shape.data(), shape.size()); }

class HostBuffer {
 public:
  HostBuffer(size_t nbytes, bool zero) : block_(std::make_shared<Block>(nbytes)) {
    if (zero && nbytes > 0) {
      py::gil_scoped_release release;
      std::memset(block_->data, 0, nbytes);
    }
  }

  py::buffer_info buffer() { return dl::byte_buffer(block_->data, block_->nbytes); }
  size_t nbytes() const { return block_->nbytes; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(block_->data); }

  // Copy ``source`` (a C-contiguous buffer; anything else is refused, not read as if it
  // were) to byte ``offset``: used to place one rank's rows in a gather buffer.
  void write_at(size_t offset, py::handle source) {
    const byteps::BufferArg src(source, "write_at: source", /*writable=*/false);
    const size_t n = src.nbytes();
    if (offset > block_->nbytes || n > block_->nbytes - offset) {
      throw py::value_error("write_at: " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                            " overflow a buffer of " + std::to_string(block_->nbytes) + " bytes");
    }
    if (n == 0) return;
    char* target = static_cast<char*>(block_->data) + offset;
    py::gil_scoped_release release;  // after src: the export is released with the GIL held
    std::memcpy(target, src.data(), n);
  }

  // A "dltensor" capsule over the first prod(shape) elements of ``code``.
  py::object to_dlpack(int code, const std::vector<int64_t>& shape) const {
    const dl::DLDataType dtype = dl::to_dl_dtype(code);  // ValueError for an unknown code
    uint64_t count = 0;
    uint64_t needed = 0;
    for (int64_t extent : shape) {
      if (extent < 0) throw py::value_error("to_dlpack: negative extent in shape " + shape_text(shape));
    }
    if (!dl::element_count(shape.data(), shape.size(), &count)) {
      throw py::value_error("to_dlpack: the element count of shape " + shape_text(shape) + " overflows 64 bits");
    }
    if (!dl::byte_count(count, dl::itemsize(code), &needed)) {
      throw py::value_error("to_dlpack: shape " + shape_text(shape) + " of " + dl::dtype_name(code) +
                            " needs more bytes than a buffer can hold (overflow)");
    }
    if (needed > block_->nbytes) {
      throw py::value_error("to_dlpack: shape " + shape_text(shape) + " needs " + std::to_string(needed) +
                            " bytes, the buffer has " + std::to_string(block_->nbytes));
    }
    auto exported = std::make_unique<Export>();
    exported->block = block_;
    exported->shape = shape;
    dl::DLTensor& t = exported->managed.dl_tensor;
    t.data = block_->data;
    t.device = {dl::kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = exported->shape.empty() ? nullptr : exported->shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    exported->managed.manager_ctx = exported.get();
    exported->managed.deleter = delete_export;
    PyObject* capsule = PyCapsule_New(&exported->managed, dl::kCapsuleName, capsule_destructor);
    if (capsule == nullptr) throw py::error_already_set();
    exported.release();  // owned by the capsule now, then by its consumer
    return py::reinterpret_steal<py::object>(capsule);
  }

 private:
  std::shared_ptr<Block> block_;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "DLPack bridge of byteps.tensorflow: tensor bytes in, aligned result buffers out; no TensorFlow inside";
  m.attr("ALIGNMENT") = kAlignment;
  dl::register_reader(m, "ImportedTensor",
                      "Owner of one consumed DLManagedTensor; exports its bytes, calls its deleter when freed.",
                      &from_dlpack, "tensor");

  py::class_<HostBuffer>(m, "HostBuffer", py::buffer_protocol(),
                         "64-byte aligned host memory that byteps writes a result into and TensorFlow adopts "
                         "through DLPack without a copy.")
      .def(py::init<size_t, bool>(), py::arg("nbytes"), py::arg("zero") = false)
      .def_buffer(&HostBuffer::buffer)
      .def_property_readonly("nbytes", &HostBuffer::nbytes)
      .def_property_readonly("address", &HostBuffer::address)
      .def("write_at", &HostBuffer::write_at, py::arg("offset"), py::arg("source"),
           "Copy a C-contiguous buffer's bytes to byte ``offset`` (GIL released); ValueError for a "
           "non-contiguous source or one that does not fit.")
      .def("to_dlpack", &HostBuffer::to_dlpack, py::arg("code"), py::arg("shape"),
           "A 'dltensor' capsule over the first prod(shape) elements of byteps dtype ``code``; the memory "
           "lives until both this buffer and every consumer are gone.");
}
