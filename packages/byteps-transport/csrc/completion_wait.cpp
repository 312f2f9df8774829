// Waiting for RDMA completions without holding the GIL.
//
// A completion queue is memory that the NIC (or the verbs stand-in's
// engine) writes and the process reads: entries, and a count of those
// produced. A thread that waits for its write's completion spins on that
// count here, with the GIL released, so that the process's other threads
// (the sends to other servers, the framework's own) run meanwhile. Python
// reads the new entries once the count moved.

#include <pybind11/pybind11.h>

#include <sched.h>

#include <cstdint>
#include <stdexcept>

namespace py = pybind11;

namespace {

uint64_t wait_for_change(const py::buffer& memory, size_t offset, uint64_t seen, uint64_t spins) {
  py::buffer_info info = memory.request();
  const size_t nbytes = static_cast<size_t>(info.size * info.itemsize);
  if (offset % alignof(uint64_t) != 0 || offset + sizeof(uint64_t) > nbytes) {
    throw std::out_of_range("wait_for_change: offset " + std::to_string(offset) +
                            " is not an aligned 8-byte count inside " + std::to_string(nbytes) + " bytes");
  }
  const auto* count = reinterpret_cast<const uint64_t*>(static_cast<const char*>(info.ptr) + offset);
  uint64_t now = seen;
  {
    py::gil_scoped_release released;
    for (uint64_t spin = 0; spin < spins; ++spin) {
      now = __atomic_load_n(count, __ATOMIC_ACQUIRE);
      if (now != seen) break;
      if (spin % 64 == 63) sched_yield();  // a NIC needs no CPU; a stand-in's engine thread does
    }
  }
  return now;
}

}  // namespace

void add_completion_wait(py::module_& m) {
  m.def("wait_for_change", &wait_for_change, py::arg("memory"), py::arg("offset"), py::arg("seen"),
        py::arg("spins"),
        "Spin with the GIL released until the u64 at ``offset`` of ``memory`` differs from ``seen``, at most "
        "``spins`` times; returns its value.");
}
