// An NDArray's memory seen through DLPack, without libmxnet's C++ types.
//
// MXNet hands out DLManagedTensors two ways: NDArray.to_dlpack_for_read/write
// wrap one in a PyCapsule named "dltensor", and the C function
// MXNDArrayToDLPack (which engine_op.cpp calls from inside MXNet's engine)
// returns one directly. Either way, take_view() checks it (CPU memory, a
// dtype byteps reduces, row-major contiguous), takes ownership and returns
// (writable flat byte memoryview, byteps dtype code, shape). The memoryview
// keeps a small owner alive, and the owner calls MXNet's deleter when the
// last view goes, which releases MXNet's reference to the array's memory.
//
// The structs are our own declarations of the unversioned DLPack ABI
// (DLPACK_VERSION 0.x, the one MXNet 1.x exports); only the layout matters.

#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace byteps_mxnet {

struct DLDevice {
  int32_t device_type;  // 1 CPU, 2 CUDA, 3 CUDA host (pinned), ...
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
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

// What byteps cannot take from this tensor, or "" if it can take it.
std::string refusal(const DLTensor& tensor);

// Take ownership of a checked DLManagedTensor and return
// (memoryview of its bytes, byteps dtype code, shape). Throws ValueError
// (leaving `managed` to the caller) if refusal() is not empty.
pybind11::tuple take_view(DLManagedTensor* managed);

// Calls a DLManagedTensor's deleter, if it has one.
void release(DLManagedTensor* managed);

// Consume a "dltensor" capsule (NDArray.to_dlpack_for_write()) the same way.
pybind11::tuple from_dlpack(pybind11::object capsule);

void register_dlpack_view(pybind11::module_& m);

}  // namespace byteps_mxnet
