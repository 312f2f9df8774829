// See dlpack_view.h. Why not numpy.from_dlpack: numpy 1.23 (the one MXNet
// 1.9 runs with) refuses MXNet's capsules without __dlpack__, and has no
// bfloat16; why not libmxnet: its C++ types change between releases, the
// DLPack C ABI does not.

#include "dlpack_view.h"

#include "byteps/dlpack_capsule.h"

namespace py = pybind11;
namespace dl = byteps::dlpack;

namespace byteps_mxnet {
namespace {

const dl::Wording& mxnet_wording() {
  static const dl::Wording wording = [] {
    dl::Wording w;
    w.noun = "array";
    w.device_hint = " (copy it to mx.cpu() first)";
    w.supported = "float16, float32, float64, bfloat16, int32, int64";
    return w;
  }();
  return wording;
}

py::tuple from_dlpack(py::object capsule) {
  return dl::from_capsule(capsule, mxnet_wording(), {"NDArray.to_dlpack_for_write()"});
}

}  // namespace

py::tuple take_view(DLManagedTensor*& managed) { return dl::take_tensor(managed, mxnet_wording()); }

void register_dlpack_view(py::module_& m) {
  dl::register_reader(m, "DLPackBuffer",
                      "Owner of one DLManagedTensor; exports its bytes, calls MXNet's deleter when freed.",
                      &from_dlpack, "array");
}

}  // namespace byteps_mxnet
