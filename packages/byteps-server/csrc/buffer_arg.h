// Borrowing a Python buffer (numpy array, memoryview, bytes, zmq.Frame) for
// the duration of one call, with errors that name the argument.

#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>

namespace byteps {
namespace server {

namespace py = pybind11;

// A C-contiguous Py_buffer, released in the destructor. Create and destroy it
// with the GIL held, i.e. outside any gil_scoped_release.
class BufferArg {
 public:
  BufferArg(py::handle obj, const char* name, bool writable) : name_(name) {
    if (!PyObject_CheckBuffer(obj.ptr())) {
      throw py::type_error(name_ + " must support the buffer protocol (numpy array, "
                           "memoryview, bytes, zmq.Frame), got " +
                           std::string(Py_TYPE(obj.ptr())->tp_name));
    }
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) {
      py::error_already_set err;
      throw py::value_error(name_ + " must be a C-contiguous buffer: " + err.what());
    }
    if (writable && view_.readonly) {
      const size_t n = nbytes();
      PyBuffer_Release(&view_);
      throw py::value_error(name_ + " is read-only (" + std::to_string(n) +
                            " bytes); it must be a writable buffer");
    }
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

}  // namespace server
}  // namespace byteps
