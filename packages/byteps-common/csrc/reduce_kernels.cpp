// byteps.common._C: the reduction kernels.
//
// Summing gradients is the server's and the worker's hot path, so the
// element loops are C++ (see reduce_loops.h), dispatched at runtime to an
// AVX2/F16C build where the CPU has one and a portable build otherwise.
//
// Two ways in:
//  * Python functions taking any buffer-protocol object (numpy arrays,
//    memoryview, bytes for inputs, zmq.Frame); they validate sizes and
//    writability, then release the GIL for the loop.
//  * kernel_table(): the addresses of two C functions with a fixed ABI, so
//    that byteps-server's extension, compiled separately, can call the same
//    kernels from its own thread pool without Python in between:
//      void accumulate(void* acc, const void* src, size_t count, int dtype, int first);
//      void finalize(void* out, const void* acc, size_t count, int dtype);
//    Bump kKernelAbi whenever those signatures or their meaning change.

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "avx2_loops.h"
#include "byteps/buffer_arg.h"
#include "compress_kernels.h"
#include "reduce_loops.h"

namespace py = pybind11;
using byteps::BufferArg;
using namespace byteps::kernels;

namespace {

constexpr int kKernelAbi = 1;

// ---------------------------------------------------------------------------
// One full set of kernels per instruction set.

namespace portable {
void accumulate(void* acc, const void* src, size_t n, int dtype, bool first) {
  accumulate_body<PortableIsa>(acc, src, n, dtype, first);
}
void finalize(void* out, const void* acc, size_t n, int dtype) {
  finalize_body<PortableIsa>(out, acc, n, dtype);
}
void sum_into(void* dst, const void* src, size_t n, int dtype) {
  sum_into_body<PortableIsa>(dst, src, n, dtype);
}
void scale_into(void* dst, const void* src, size_t n, int dtype, int64_t divisor) {
  scale_body<PortableIsa>(dst, src, n, dtype, divisor);
}
}  // namespace portable

#if defined(BYTEPS_X86)
namespace avx2 {
BYTEPS_AVX2 void accumulate(void* acc, const void* src, size_t n, int dtype, bool first) {
  accumulate_body<Avx2Isa>(acc, src, n, dtype, first);
}
BYTEPS_AVX2 void finalize(void* out, const void* acc, size_t n, int dtype) {
  finalize_body<Avx2Isa>(out, acc, n, dtype);
}
BYTEPS_AVX2 void sum_into(void* dst, const void* src, size_t n, int dtype) {
  sum_into_body<Avx2Isa>(dst, src, n, dtype);
}
BYTEPS_AVX2 void scale_into(void* dst, const void* src, size_t n, int dtype, int64_t divisor) {
  scale_body<Avx2Isa>(dst, src, n, dtype, divisor);
}
}  // namespace avx2
#endif

// ---------------------------------------------------------------------------
// Runtime dispatch.

enum Isa : int { kPortable = 0, kAvx2 = 1 };

struct CpuFeatures {
  bool avx2 = false;
  bool f16c = false;
  bool avx512f = false;
};

CpuFeatures detect_cpu() {
  CpuFeatures f;
#if defined(BYTEPS_X86)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
#endif
  return f;
}

const CpuFeatures& cpu() {
  static const CpuFeatures features = detect_cpu();
  return features;
}

bool avx2_usable() { return cpu().avx2 && cpu().f16c; }

// Only tests change it (through _set_isa), to run the portable loops on an
// AVX2 machine too.
std::atomic<int> g_isa{avx2_usable() ? kAvx2 : kPortable};

const char* isa_name(int isa) { return isa == kAvx2 ? "avx2+f16c" : "portable"; }

}  // namespace

// The C ABI behind kernel_table(). An unknown dtype code is a no-op: these
// cannot throw, so callers validate first (the Python functions here and the
// server engine both do).
extern "C" void byteps_kernel_accumulate(void* acc, const void* src, size_t count, int dtype,
                                         int first) noexcept {
#if defined(BYTEPS_X86)
  if (g_isa.load(std::memory_order_relaxed) == kAvx2)
    return avx2::accumulate(acc, src, count, dtype, first != 0);
#endif
  portable::accumulate(acc, src, count, dtype, first != 0);
}

extern "C" void byteps_kernel_finalize(void* out, const void* acc, size_t count,
                                       int dtype) noexcept {
#if defined(BYTEPS_X86)
  if (g_isa.load(std::memory_order_relaxed) == kAvx2)
    return avx2::finalize(out, acc, count, dtype);
#endif
  portable::finalize(out, acc, count, dtype);
}

namespace {

void dispatch_sum_into(void* dst, const void* src, size_t n, int dtype) {
#if defined(BYTEPS_X86)
  if (g_isa.load(std::memory_order_relaxed) == kAvx2) return avx2::sum_into(dst, src, n, dtype);
#endif
  portable::sum_into(dst, src, n, dtype);
}

// dst is src itself (scale) or does not overlap it (scale_into).
void dispatch_scale_into(void* dst, const void* src, size_t n, int dtype, int64_t divisor) {
#if defined(BYTEPS_X86)
  if (g_isa.load(std::memory_order_relaxed) == kAvx2) {
    return avx2::scale_into(dst, src, n, dtype, divisor);
  }
#endif
  portable::scale_into(dst, src, n, dtype, divisor);
}

// ---------------------------------------------------------------------------
// Python side: argument checking.

const char* const kNames[kNumDTypes] = {"float32", "float64", "float16",
                                        "bfloat16", "int32", "int64"};
const size_t kItemsize[kNumDTypes] = {4, 8, 2, 2, 4, 8};
const size_t kAccItemsize[kNumDTypes] = {4, 8, 4, 4, 4, 8};

int check_dtype(int dtype) {
  if (dtype < 0 || dtype >= kNumDTypes) {
    throw py::value_error("unknown dtype code " + std::to_string(dtype) +
                          ": expected 0..5 (FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, INT64)");
  }
  return dtype;
}

std::string acc_name(int dtype) { return kAccItemsize[dtype] == 4 && kItemsize[dtype] == 2
                                             ? "float32" : kNames[dtype]; }

// In-place (same start, same size) is fine for elementwise loops; any other
// overlap would read values the loop has already overwritten.
void check_no_partial_overlap(const BufferArg& dst, const BufferArg& src) {
  const auto* d = static_cast<const char*>(dst.data());
  const auto* s = static_cast<const char*>(src.data());
  const bool overlap = d < s + src.nbytes() && s < d + dst.nbytes();
  const bool identical = d == s && dst.nbytes() == src.nbytes();
  if (overlap && !identical) {
    throw py::value_error(dst.name() + " and " + src.name() +
                          " overlap in memory without being the same buffer");
  }
}

// The element count of dst and src, which must hold as many dtype elements.
size_t same_count(const BufferArg& dst, const BufferArg& src, int dtype) {
  const size_t n_dst = dst.count(kItemsize[dtype], kNames[dtype]);
  const size_t n_src = src.count(kItemsize[dtype], kNames[dtype]);
  if (n_dst != n_src) {
    throw py::value_error("dst has " + std::to_string(dst.nbytes()) + " bytes (" +
                          std::to_string(n_dst) + " " + kNames[dtype] + ") but src has " +
                          std::to_string(src.nbytes()) + " bytes (" + std::to_string(n_src) +
                          ")");
  }
  return n_dst;
}

void py_accumulate(py::handle acc_obj, py::handle src_obj, int dtype, bool first) {
  check_dtype(dtype);
  BufferArg acc(acc_obj, "acc", true);
  BufferArg src(src_obj, "src", false);
  const size_t n = src.count(kItemsize[dtype], kNames[dtype]);
  if (acc.nbytes() != n * kAccItemsize[dtype]) {
    throw py::value_error("acc has " + std::to_string(acc.nbytes()) + " bytes, but src's " +
                          std::to_string(n) + " " + kNames[dtype] + " elements need " +
                          std::to_string(n * kAccItemsize[dtype]) + " bytes of " +
                          acc_name(dtype) + " accumulator");
  }
  check_no_partial_overlap(acc, src);
  py::gil_scoped_release release;
  byteps_kernel_accumulate(acc.data(), src.data(), n, dtype, first ? 1 : 0);
}

void py_finalize(py::handle out_obj, py::handle acc_obj, int dtype) {
  check_dtype(dtype);
  BufferArg out(out_obj, "out", true);
  BufferArg acc(acc_obj, "acc", false);
  const size_t n = acc.count(kAccItemsize[dtype], acc_name(dtype));
  if (out.nbytes() != n * kItemsize[dtype]) {
    throw py::value_error("out has " + std::to_string(out.nbytes()) + " bytes, but acc's " +
                          std::to_string(n) + " " + acc_name(dtype) + " elements need " +
                          std::to_string(n * kItemsize[dtype]) + " bytes of " +
                          kNames[dtype]);
  }
  check_no_partial_overlap(out, acc);
  py::gil_scoped_release release;
  byteps_kernel_finalize(out.data(), acc.data(), n, dtype);
}

void py_sum_into(py::handle dst_obj, py::handle src_obj, int dtype) {
  check_dtype(dtype);
  BufferArg dst(dst_obj, "dst", true);
  BufferArg src(src_obj, "src", false);
  const size_t n = same_count(dst, src, dtype);
  check_no_partial_overlap(dst, src);
  py::gil_scoped_release release;
  dispatch_sum_into(dst.data(), src.data(), n, dtype);
}

void py_scale(py::handle buf_obj, int dtype, int64_t divisor) {
  check_dtype(dtype);
  if (divisor == 0) throw py::value_error("divisor must not be 0");
  BufferArg buf(buf_obj, "buf", true);
  const size_t n = buf.count(kItemsize[dtype], kNames[dtype]);
  py::gil_scoped_release release;
  dispatch_scale_into(buf.data(), buf.data(), n, dtype, divisor);
}

// scale without the copy in front of it: one pass, reading src and writing
// dst, where a copy then scale would pass over the bytes twice.
void py_scale_into(py::handle dst_obj, py::handle src_obj, int dtype, int64_t divisor) {
  check_dtype(dtype);
  if (divisor == 0) throw py::value_error("divisor must not be 0");
  BufferArg dst(dst_obj, "dst", true);
  BufferArg src(src_obj, "src", false);
  const size_t n = same_count(dst, src, dtype);
  check_no_partial_overlap(dst, src);
  py::gil_scoped_release release;
  dispatch_scale_into(dst.data(), src.data(), n, dtype, divisor);
}

py::dict kernel_table() {
  py::dict table;
  table["abi"] = kKernelAbi;
  table["accumulate"] = reinterpret_cast<uintptr_t>(&byteps_kernel_accumulate);
  table["finalize"] = reinterpret_cast<uintptr_t>(&byteps_kernel_finalize);
  return table;
}

py::dict cpu_features() {
  py::dict d;
  d["avx2"] = cpu().avx2;
  d["f16c"] = cpu().f16c;
  d["avx512f"] = cpu().avx512f;
  d["isa"] = isa_name(g_isa.load());
  return d;
}

std::string set_isa(const std::string& name) {
  const std::string previous = isa_name(g_isa.load());
  if (name == "portable") {
    g_isa = kPortable;
  } else if (name == "avx2+f16c" || name == "avx2") {
    if (!avx2_usable()) throw py::value_error("this CPU lacks AVX2/F16C; cannot select " + name);
    g_isa = kAvx2;
  } else {
    throw py::value_error("unknown instruction set " + name + ": use 'portable' or 'avx2+f16c'");
  }
  return previous;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "byteps reduction kernels (sum, widen/narrow, average) over raw buffers";
  m.attr("KERNEL_ABI") = kKernelAbi;

  m.def("accumulate", &py_accumulate, py::arg("acc"), py::arg("src"), py::arg("dtype"),
        py::arg("first"),
        "acc (accumulation type) = widen(src) if first else acc + widen(src).");
  m.def("finalize", &py_finalize, py::arg("out"), py::arg("acc"), py::arg("dtype"),
        "out (dtype) = narrow(acc), round to nearest even for float16/bfloat16.");
  m.def("sum_into", &py_sum_into, py::arg("dst"), py::arg("src"), py::arg("dtype"),
        "dst += src elementwise in dtype (halves through float32).");
  m.def("scale", &py_scale, py::arg("buf"), py::arg("dtype"), py::arg("divisor"),
        "buf /= divisor in place; floor division (numpy //) for integer dtypes.");
  m.def("scale_into", &py_scale_into, py::arg("dst"), py::arg("src"), py::arg("dtype"),
        py::arg("divisor"),
        "dst = src / divisor in one pass, rounded as scale; dst is src or does not overlap it.");
  m.def("itemsize", [](int dtype) { return kItemsize[check_dtype(dtype)]; }, py::arg("dtype"),
        "Bytes per element of dtype.");
  m.def("accumulation_itemsize", [](int dtype) { return kAccItemsize[check_dtype(dtype)]; },
        py::arg("dtype"), "Bytes per element of dtype's accumulation type.");
  m.def("kernel_table", &kernel_table,
        "{'abi': 1, 'accumulate': address, 'finalize': address} for other extensions.");
  m.def("cpu_features", &cpu_features,
        "CPU features detected at load and the instruction set the kernels use.");
  m.def("_set_isa", &set_isa, py::arg("name"),
        "Testing hook: select 'portable' or 'avx2+f16c' kernels; returns the previous one.");
  byteps::register_compression(m);
}
