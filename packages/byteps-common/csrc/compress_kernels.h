// byteps.common._C's compression functions (compress_kernels.cpp), added to
// the module by its PYBIND11_MODULE in reduce_kernels.cpp.

#pragma once

#include <pybind11/pybind11.h>

namespace byteps {

// Defines onebit/topk/randomk/dithering compress and decompress, their size
// functions, xorshift_next, axpy and nesterov on m.
void register_compression(pybind11::module_& m);

}  // namespace byteps
