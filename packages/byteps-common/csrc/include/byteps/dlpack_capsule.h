// DLPack tensors to Python: consuming a "dltensor" PyCapsule (or a bare
// DLManagedTensor) into a writable memoryview over the tensor's own bytes.
//
// The protocol: a capsule named "dltensor" owns its DLManagedTensor, and the
// producer's capsule destructor frees it while the name stays "dltensor". A
// consumer that takes the tensor renames the capsule "used_dltensor" and
// from then on owes exactly one call of the tensor's deleter.
//
// So the hand-over is done in an order that cannot free a tensor twice or
// never: first every check (inspect()) and every Python object the result
// needs (the owner, its memoryview, the shape tuple) are made while the
// tensor is still the producer's; any failure there leaves the capsule as it
// was. Then, with nothing left that can fail or run Python code, the capsule
// is checked once more (a garbage-collector callback or another thread may
// have consumed it meanwhile), renamed, and the owner adopts the tensor. The
// owner calls the deleter when the last view of its bytes is released.
//
//     // in a PYBIND11_MODULE:
//     byteps::dlpack::register_owner(m, "DLPackBuffer", "Owner of one DLManagedTensor ...");
//     m.def("from_dlpack", [](py::object capsule) { return byteps::dlpack::from_capsule(capsule, kWording); });
//
// The owner type is registered py::module_local(), so several adapters can
// register it in one process.

#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include "byteps/dlpack.h"

namespace byteps {
namespace dlpack {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

// A flat, writable byte buffer; a zero-byte one points at a static byte (numpy wants a pointer).
inline pybind11::buffer_info byte_buffer(void* data, size_t nbytes) {
  static unsigned char empty = 0;
  void* ptr = nbytes == 0 ? static_cast<void*>(&empty) : data;
  return pybind11::buffer_info(ptr, 1, pybind11::format_descriptor<unsigned char>::format(), 1,
                               {static_cast<pybind11::ssize_t>(nbytes)}, {static_cast<pybind11::ssize_t>(1)},
                               /*readonly=*/false);
}

// Exports a consumed tensor's bytes and calls its deleter when destroyed, i.e. when the last
// memoryview over it goes. Made empty, then adopt()s the tensor once the hand-over commits.
class TensorOwner {
 public:
  TensorOwner(void* data, size_t nbytes) : data_(data), nbytes_(nbytes) {}
  ~TensorOwner() { release(managed_); }
  TensorOwner(const TensorOwner&) = delete;
  TensorOwner& operator=(const TensorOwner&) = delete;

  void adopt(DLManagedTensor* managed) noexcept { managed_ = managed; }
  pybind11::buffer_info buffer() const { return byte_buffer(data_, nbytes_); }
  size_t nbytes() const { return nbytes_; }

 private:
  DLManagedTensor* managed_ = nullptr;
  void* data_;
  size_t nbytes_;
};

// Registers TensorOwner as `name` in module m (each adapter keeps its own class name).
inline void register_owner(pybind11::module_& m, const char* name, const char* doc) {
  pybind11::class_<TensorOwner>(m, name, pybind11::module_local(), pybind11::buffer_protocol(), doc)
      .def_buffer(&TensorOwner::buffer)
      .def_property_readonly("nbytes", &TensorOwner::nbytes);
}

// Registers an adapter's reader in its module m: SUPPORTED_DTYPES, the owner class
// (`owner`, each adapter keeps its class name) and from_dlpack(capsule) -> (memoryview,
// byteps dtype code, shape). `what` names the adapter's tensors in the docstring.
template <typename FromDLPack>
inline void register_reader(pybind11::module_& m, const char* owner, const char* owner_doc,
                            FromDLPack from_dlpack, const char* what) {
  m.attr("SUPPORTED_DTYPES") =
      pybind11::make_tuple("float32", "float64", "float16", "bfloat16", "int32", "int64");
  register_owner(m, owner, owner_doc);
  const std::string doc = std::string("Consume a 'dltensor' capsule of a contiguous CPU ") + what +
                          "; returns (memoryview of its bytes, byteps dtype code, shape). ValueError for "
                          "another device or dtype, a non-contiguous " + what +
                          ", a size that overflows or a used capsule (the capsule is then left unconsumed).";
  m.def("from_dlpack", from_dlpack, pybind11::arg("capsule"), doc.c_str());
}

namespace detail {

// The Python side of one tensor, built before the hand-over: nothing owned yet.
struct PendingView {
  TensorOwner* owner = nullptr;
  pybind11::tuple result;  // (memoryview, byteps dtype code, shape)
};

inline PendingView prepare(const TensorInfo& info) {
  namespace py = pybind11;
  PendingView pending;
  auto owner = std::make_unique<TensorOwner>(info.data, info.nbytes);
  pending.owner = owner.get();
  py::object holder = py::cast(std::move(owner));
  py::object view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(holder.ptr()));
  if (!view) throw py::error_already_set();
  py::tuple shape(info.shape.size());
  for (size_t d = 0; d < info.shape.size(); ++d) shape[d] = py::int_(info.shape[d]);
  pending.result = py::make_tuple(view, info.dtype, shape);
  return pending;
}

}  // namespace detail

// Take a DLManagedTensor that no capsule holds (from a C API): on success `managed` is set
// to nullptr and the returned view's owner calls its deleter; on any exception (a Refusal
// is a ValueError) `managed` is untouched and still the caller's to release.
inline pybind11::tuple take_tensor(DLManagedTensor*& managed, const Wording& wording = Wording()) {
  if (managed == nullptr) throw std::invalid_argument("take_tensor: null DLManagedTensor");
  detail::PendingView pending = detail::prepare(inspect(managed->dl_tensor, wording));
  pending.owner->adopt(std::exchange(managed, nullptr));
  return pending.result;
}

// Where the capsules an adapter consumes come from, for the TypeError.
struct CapsuleSource {
  const char* how = "tensor.__dlpack__()";
};

// Consume a "dltensor" capsule: (writable flat byte memoryview, byteps dtype code, shape).
// TypeError if `capsule` is not a capsule; ValueError (the capsule then left as it was) for a
// used or versioned capsule or a tensor inspect() refuses.
inline pybind11::tuple from_capsule(pybind11::handle capsule, const Wording& wording = Wording(),
                                    const CapsuleSource& source = CapsuleSource()) {
  namespace py = pybind11;
  PyObject* obj = capsule.ptr();
  if (!PyCapsule_CheckExact(obj)) {
    throw py::type_error(std::string("expected a DLPack capsule (") + source.how + "), got " +
                         Py_TYPE(obj)->tp_name);
  }
  const auto fresh = [obj] { return PyCapsule_IsValid(obj, kCapsuleName) != 0; };
  if (!fresh()) {
    const char* name = PyCapsule_GetName(obj);
    if (name == nullptr) PyErr_Clear();  // a nameless capsule: say so below
    throw py::value_error(std::string("the capsule is named '") + (name ? name : "") +
                          "', not 'dltensor': it was already consumed (DLPack capsules can be consumed "
                          "only once) or is a versioned DLPack capsule; pass a fresh one");
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(obj, kCapsuleName));
  if (managed == nullptr) throw py::error_already_set();

  detail::PendingView pending = detail::prepare(inspect(managed->dl_tensor, wording));

  // The hand-over. Making the objects above may have run Python code (the garbage
  // collector), which may have consumed this capsule already: then it is not ours.
  if (!fresh() || PyCapsule_GetPointer(obj, kCapsuleName) != managed) {
    throw py::value_error("the capsule was consumed elsewhere while byteps read it (DLPack capsules can be "
                          "consumed only once)");
  }
  if (PyCapsule_SetName(obj, kUsedCapsuleName) != 0) throw py::error_already_set();
  pending.owner->adopt(managed);
  return pending.result;
}

}  // namespace dlpack
}  // namespace byteps
