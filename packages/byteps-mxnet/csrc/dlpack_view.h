// An NDArray's memory seen through DLPack, without libmxnet's C++ types.
//
// MXNet hands out DLManagedTensors two ways: NDArray.to_dlpack_for_read/write
// wrap one in a PyCapsule named "dltensor", and the C function
// MXNDArrayToDLPack (which engine_op.cpp calls from inside MXNet's engine)
// returns one directly. Either way byteps-common's reader
// (byteps/dlpack_capsule.h) checks it (CPU memory, a dtype byteps reduces,
// row-major contiguous, sizes that fit), takes ownership and returns
// (writable flat byte memoryview, byteps dtype code, shape). The memoryview
// keeps a small owner alive, and the owner calls MXNet's deleter when the
// last view goes, which releases MXNet's reference to the array's memory.
// What is MXNet's here is only the wording and the Python names.

#pragma once

#include <pybind11/pybind11.h>

#include "byteps/dlpack.h"

namespace byteps_mxnet {

using byteps::dlpack::DLManagedTensor;
using byteps::dlpack::release;

// Take a DLManagedTensor from MXNDArrayToDLPack: returns (memoryview of its bytes, byteps
// dtype code, shape) and sets `managed` to nullptr, the view's owner now calling its
// deleter. On an exception (ValueError for a refused array) `managed` is left to the caller.
pybind11::tuple take_view(DLManagedTensor*& managed);

void register_dlpack_view(pybind11::module_& m);

}  // namespace byteps_mxnet
