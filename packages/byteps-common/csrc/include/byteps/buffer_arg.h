// Borrowing a Python buffer (numpy array, memoryview, bytes, zmq.Frame) as a
// C-contiguous block of bytes, for one call (BufferArg) or for as long as an
// owner needs it (hold_buffer), with errors that name the argument.
//
// Shared by byteps-common's kernels and byteps-server's engine, and usable by
// any adapter: a buffer that is not C-contiguous is refused (ValueError),
// never read as if it were.
//
//     BufferArg src(obj, "src", /*writable=*/false);
//     const size_t n = src.count(4, "float32");   // ValueError unless a multiple of 4 bytes
//     py::gil_scoped_release release;              // after src, so released before it
//     use(src.data(), src.nbytes());

#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>

namespace byteps {

// Fills *view with obj's C-contiguous buffer (to be released with PyBuffer_Release) or
// throws: TypeError without the buffer protocol, ValueError if not C-contiguous or, when
// `writable`, read-only.
inline void get_buffer(pybind11::handle obj, const std::string& name, bool writable, Py_buffer* view) {
  namespace py = pybind11;
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error(name + " must support the buffer protocol (numpy array, memoryview, bytes, zmq.Frame), got " +
                         std::string(Py_TYPE(obj.ptr())->tp_name));
  }
  if (PyObject_GetBuffer(obj.ptr(), view, PyBUF_C_CONTIGUOUS) != 0) {
    py::error_already_set err;
    throw py::value_error(name + " must be a C-contiguous buffer: " + err.what());
  }
  if (writable && view->readonly) {
    const auto n = static_cast<size_t>(view->len);
    PyBuffer_Release(view);
    throw py::value_error(name + " is read-only (" + std::to_string(n) + " bytes); it must be a writable buffer");
  }
}

// A C-contiguous Py_buffer, released in the destructor. Create and destroy it with the GIL
// held, i.e. outside any gil_scoped_release.
class BufferArg {
 public:
  BufferArg(pybind11::handle obj, const char* name, bool writable) : name_(name) {
    get_buffer(obj, name_, writable, &view_);
  }
  ~BufferArg() { PyBuffer_Release(&view_); }
  BufferArg(const BufferArg&) = delete;
  BufferArg& operator=(const BufferArg&) = delete;

  void* data() const { return view_.buf; }
  size_t nbytes() const { return static_cast<size_t>(view_.len); }
  const std::string& name() const { return name_; }

  // Element count for an item size; ValueError if the bytes do not divide.
  size_t count(size_t itemsize, const std::string& type_name) const {
    if (nbytes() % itemsize != 0) {
      throw pybind11::value_error(name_ + " has " + std::to_string(nbytes()) + " bytes, not a multiple of the " +
                                  type_name + " itemsize " + std::to_string(itemsize));
    }
    return nbytes() / itemsize;
  }

 private:
  std::string name_;
  Py_buffer view_{};
};

// A read-only buffer export that lives as long as its last owner: how a consumer keeps a
// buffer (a zmq.Frame, say) without copying it. The export holds a reference to obj, so obj
// outlives the caller's own reference. Owners are meant to be dropped with the GIL held; one
// dropped without it takes the GIL to release the export.
inline std::shared_ptr<const Py_buffer> hold_buffer(pybind11::handle obj, const char* name) {
  auto view = std::make_unique<Py_buffer>();
  get_buffer(obj, name, false, view.get());
  return std::shared_ptr<const Py_buffer>(view.release(), [](const Py_buffer* held) {
    auto* v = const_cast<Py_buffer*>(held);
    if (PyGILState_Check()) {
      PyBuffer_Release(v);
    } else {
      pybind11::gil_scoped_acquire gil;
      PyBuffer_Release(v);
    }
    delete v;
  });
}

}  // namespace byteps
