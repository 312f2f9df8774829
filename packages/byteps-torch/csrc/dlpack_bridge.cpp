// byteps.torch._C: a tensor's memory seen through DLPack, without libtorch.
//
// torch.Tensor.__dlpack__() hands out a PyCapsule named "dltensor" holding a
// DLManagedTensor. from_dlpack() checks it (CPU memory, a dtype byteps
// reduces, contiguous strides, sizes that fit), takes ownership (renaming the
// capsule "used_dltensor", as the protocol asks of a consumer) and returns a
// writable memoryview over the bytes. The memoryview keeps a small owner
// object alive, and the owner calls the producer's deleter when the last view
// is released, so the tensor's storage outlives every use of its bytes.
//
// The reading itself is byteps-common's (byteps/dlpack_capsule.h), shared
// with the other adapters; what is torch's here is only the wording.
//
// Why not numpy.from_dlpack: numpy has no bfloat16 and refuses such tensors.
// Why not libtorch: a compiled adapter that links libtorch breaks with an
// undefined symbol on the next torch upgrade; the DLPack C ABI is stable.

#include <pybind11/pybind11.h>

#include "byteps/dlpack_capsule.h"

namespace py = pybind11;

namespace {

byteps::dlpack::Wording torch_wording() {
  byteps::dlpack::Wording wording;
  wording.noun = "tensor";
  wording.device_hint = ": it must be staged to the CPU first (tensor.cpu())";
  wording.contiguous_hint = "; pass a contiguous tensor, e.g. tensor.contiguous()";
  return wording;
}

py::tuple from_dlpack(py::object capsule) {
  static const byteps::dlpack::Wording wording = torch_wording();
  return byteps::dlpack::from_capsule(capsule, wording, {"tensor.__dlpack__()"});
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "DLPack bridge of byteps.torch: a CPU tensor's bytes as a memoryview, no libtorch";
  byteps::dlpack::register_reader(m, "DLPackBuffer",
                                  "Owner of one DLManagedTensor; exports its bytes, calls its deleter when freed.",
                                  &from_dlpack, "tensor");
}
