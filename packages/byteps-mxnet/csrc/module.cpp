// byteps.mxnet._C: NDArray memory through DLPack and push_pulls on MXNet's
// engine through its C API; libmxnet is neither linked nor included.

#include <pybind11/pybind11.h>

#include "dlpack_view.h"
#include "engine_op.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "byteps.mxnet's bridge to MXNet: DLPack views of NDArrays and push_pulls as engine ops";
  byteps_mxnet::register_dlpack_view(m);
  byteps_mxnet::register_engine_op(m);
}
