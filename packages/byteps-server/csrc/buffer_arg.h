// Borrowing a Python buffer (numpy array, memoryview, bytes, zmq.Frame) for
// the duration of one call, or holding on to it for longer, with errors that
// name the argument.

#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>

namespace byteps {
namespace server {

namespace py = pybind11;

// Fills *view with obj's C-contiguous buffer (to be released with
// PyBuffer_Release) or throws the error that names the argument.
inline void get_buffer(py::handle obj, const std::string& name, bool writable, Py_buffer* view) {
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error(name + " must support the buffer protocol (numpy array, "
                         "memoryview, bytes, zmq.Frame), got " +
                         std::string(Py_TYPE(obj.ptr())->tp_name));
  }
  if (PyObject_GetBuffer(obj.ptr(), view, PyBUF_C_CONTIGUOUS) != 0) {
    py::error_already_set err;
    throw py::value_error(name + " must be a C-contiguous buffer: " + err.what());
  }
  if (writable && view->readonly) {
    const auto n = static_cast<size_t>(view->len);
    PyBuffer_Release(view);
    throw py::value_error(name + " is read-only (" + std::to_string(n) +
                          " bytes); it must be a writable buffer");
  }
}

// A C-contiguous Py_buffer, released in the destructor. Create and destroy it
// with the GIL held, i.e. outside any gil_scoped_release.
class BufferArg {
 public:
  BufferArg(py::handle obj, const char* name, bool writable) : name_(name) {
    get_buffer(obj, name_, writable, &view_);
  }
  ~BufferArg() { PyBuffer_Release(&view_); }
  BufferArg(const BufferArg&) = delete;
  BufferArg& operator=(const BufferArg&) = delete;

  void* data() const { return view_.buf; }
  size_t nbytes() const { return static_cast<size_t>(view_.len); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  Py_buffer view_{};
};

// A read-only buffer export that lives as long as its last owner: how the
// engine keeps a push (a zmq.Frame, say) without copying it. The export
// holds a reference to obj, so obj outlives the caller's own reference.
// Owners are meant to be dropped with the GIL held; one dropped without it
// takes the GIL to release the export.
inline std::shared_ptr<const Py_buffer> hold_buffer(py::handle obj, const char* name) {
  auto view = std::make_unique<Py_buffer>();
  get_buffer(obj, name, false, view.get());
  return std::shared_ptr<const Py_buffer>(view.release(), [](const Py_buffer* held) {
    auto* v = const_cast<Py_buffer*>(held);
    if (PyGILState_Check()) {
      PyBuffer_Release(v);
    } else {
      py::gil_scoped_acquire gil;
      PyBuffer_Release(v);
    }
    delete v;
  });
}

}  // namespace server
}  // namespace byteps
