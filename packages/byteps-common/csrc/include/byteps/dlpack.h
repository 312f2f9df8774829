// Reading a DLPack tensor: the one C++ copy of the DLPack ABI in byteps, and
// the checks every framework adapter runs before it touches a tensor's bytes.
//
// Header-only and free of Python, so that an adapter can read a
// DLManagedTensor that did not come in a capsule (MXNet's engine hands them
// out through its C API). dlpack_capsule.h adds the PyCapsule protocol on top.
//
// The structs are our own declarations of the stable, unversioned DLPack ABI
// (DLPACK_VERSION 0.x, the legacy DLManagedTensor that torch, TensorFlow and
// MXNet export by default). Only the layout has to match dlpack.h; they live
// in namespace byteps::dlpack so that a translation unit may also include the
// real dlpack.h.
//
//     const byteps::dlpack::TensorInfo info = byteps::dlpack::inspect(managed->dl_tensor, wording);
//     // info.data, info.nbytes, info.dtype (a byteps wire code), info.shape
//
// inspect() throws byteps::dlpack::Refusal (a std::invalid_argument, so a
// ValueError in Python) for anything byteps cannot read: a device other than
// the CPU, a dtype byteps does not reduce, a malformed or non-contiguous
// tensor, or a size whose arithmetic would overflow.

#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace byteps {
namespace dlpack {

// --- the DLPack ABI (dlpack.h, DLPACK_VERSION 0.x) ------------------------------------------

struct DLDevice {
  int32_t device_type;  // DLDeviceType: 1 CPU, 2 CUDA, 3 CUDA host, ...
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;  // DLDataTypeCode: 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
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

constexpr int32_t kDLCPU = 1;
constexpr uint8_t kDLInt = 0;
constexpr uint8_t kDLUInt = 1;
constexpr uint8_t kDLFloat = 2;
constexpr uint8_t kDLBfloat = 4;
constexpr uint8_t kDLComplex = 5;
constexpr uint8_t kDLBool = 6;

// --- byteps dtypes ----------------------------------------------------------------------------

// Wire codes of byteps.common.dtypes.DType; never renumber.
enum DType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBfloat16 = 3, kInt32 = 4, kInt64 = 5 };
constexpr int kNumDTypes = 6;

inline const char* dtype_name(int code) {
  static const char* const names[kNumDTypes] = {"float32", "float64", "float16", "bfloat16", "int32", "int64"};
  return code >= 0 && code < kNumDTypes ? names[code] : "unknown";
}

inline size_t itemsize(int code) {
  static const size_t sizes[kNumDTypes] = {4, 8, 2, 2, 4, 8};
  return code >= 0 && code < kNumDTypes ? sizes[code] : 0;
}

// The DLPack dtype of a byteps code (for exporting); throws std::invalid_argument for an unknown code.
inline DLDataType to_dl_dtype(int code) {
  switch (code) {
    case kFloat32: return {kDLFloat, 32, 1};
    case kFloat64: return {kDLFloat, 64, 1};
    case kFloat16: return {kDLFloat, 16, 1};
    case kBfloat16: return {kDLBfloat, 16, 1};
    case kInt32: return {kDLInt, 32, 1};
    case kInt64: return {kDLInt, 64, 1};
    default: throw std::invalid_argument("unknown byteps dtype code " + std::to_string(code));
  }
}

// The byteps code of a DLPack dtype, or -1 if byteps does not reduce it.
inline int from_dl_dtype(const DLDataType& t) {
  if (t.lanes != 1) return -1;
  if (t.code == kDLFloat && t.bits == 32) return kFloat32;
  if (t.code == kDLFloat && t.bits == 64) return kFloat64;
  if (t.code == kDLFloat && t.bits == 16) return kFloat16;
  if (t.code == kDLBfloat && t.bits == 16) return kBfloat16;
  if (t.code == kDLInt && t.bits == 32) return kInt32;
  if (t.code == kDLInt && t.bits == 64) return kInt64;
  return -1;
}

// --- names for error messages -----------------------------------------------------------------

inline std::string device_name(int32_t type) {
  switch (type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host";
    case 4: return "opencl";
    case 7: return "vulkan";
    case 8: return "metal";
    case 9: return "vpi";
    case 10: return "rocm";
    case 11: return "rocm_host";
    case 12: return "ext_dev";
    case 13: return "cuda_managed";
    case 14: return "oneapi";
    case 15: return "webgpu";
    case 16: return "hexagon";
    case 17: return "maia";
    default: return "device type " + std::to_string(type);
  }
}

inline std::string dl_dtype_name(const DLDataType& t) {
  std::string base;
  switch (t.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLComplex: base = "complex"; break;
    case kDLBool: return t.lanes == 1 ? "bool" : "bool x" + std::to_string(t.lanes);
    default: base = "type code " + std::to_string(t.code) + " of ";
  }
  std::string name = base + std::to_string(t.bits);
  if (t.lanes != 1) name += " x" + std::to_string(t.lanes) + " lanes";
  return name;
}

inline std::string join(const int64_t* values, size_t n) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < n; ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

// --- size arithmetic --------------------------------------------------------------------------

// The largest buffer byteps hands to Python: a memoryview's length is a Py_ssize_t.
constexpr uint64_t kMaxBytes = static_cast<uint64_t>(PTRDIFF_MAX);

// *out = a * b; false (and *out untouched) if the product does not fit in 64 bits.
inline bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return false;
  *out = product;
  return true;
}

// Elements of a shape, or false if an extent is negative or the count overflows. A shape
// with a zero extent has no elements, whatever its other extents.
inline bool element_count(const int64_t* shape, size_t ndim, uint64_t* count) {
  bool empty = false;
  for (size_t d = 0; d < ndim; ++d) {
    if (shape[d] < 0) return false;
    empty = empty || shape[d] == 0;
  }
  if (empty) {
    *count = 0;
    return true;
  }
  uint64_t n = 1;
  for (size_t d = 0; d < ndim; ++d) {
    if (!checked_mul(n, static_cast<uint64_t>(shape[d]), &n)) return false;
  }
  *count = n;
  return true;
}

// Bytes of `count` elements of `item` bytes, or false past kMaxBytes.
inline bool byte_count(uint64_t count, size_t item, uint64_t* nbytes) {
  uint64_t n = 0;
  if (!checked_mul(count, item, &n) || n > kMaxBytes) return false;
  *nbytes = n;
  return true;
}

// Row-major contiguity. Extent-1 dimensions may carry any stride (torch gives them
// arbitrary ones), and a tensor without elements is contiguous. Call only on a shape whose
// element count fits (element_count), so the running product cannot overflow.
inline bool is_contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return true;
  }
  int64_t expected = 1;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// --- inspect ----------------------------------------------------------------------------------

// Everything inspect() refuses; a ValueError when thrown through pybind11.
class Refusal : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// How an adapter words its refusals: what its users call a tensor, and what they should do.
struct Wording {
  const char* noun = "tensor";            // "the tensor lives on cuda:0"
  const char* device_hint = "";           // appended after "byteps reads CPU memory only"
  const char* contiguous_hint = "";       // appended after "(shape [..], strides [..] in elements)"
  const char* supported = "float32, float64, float16, bfloat16, int32, int64";
};

// What byteps needs of a readable tensor: its first byte (byte_offset applied), its size,
// its byteps dtype code and its shape.
struct TensorInfo {
  void* data = nullptr;
  size_t nbytes = 0;
  int dtype = -1;
  std::vector<int64_t> shape;
};

// Check a DLTensor and describe it; throws Refusal. Reads only the DLTensor, so a refused
// tensor stays whoever's it was.
inline TensorInfo inspect(const DLTensor& t, const Wording& wording = Wording()) {
  const std::string noun = wording.noun;
  if (t.device.device_type != kDLCPU) {
    throw Refusal("the " + noun + " lives on " + device_name(t.device.device_type) + ":" +
                  std::to_string(t.device.device_id) + "; byteps reads CPU memory only" + wording.device_hint);
  }
  TensorInfo info;
  info.dtype = from_dl_dtype(t.dtype);
  if (info.dtype < 0) {
    throw Refusal("unsupported dtype " + dl_dtype_name(t.dtype) + ": byteps reduces " + wording.supported);
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    throw Refusal("malformed DLPack tensor: ndim " + std::to_string(t.ndim) +
                  (t.ndim > 0 ? " without a shape" : ""));
  }
  const size_t ndim = static_cast<size_t>(t.ndim);
  uint64_t count = 0;
  if (!element_count(t.shape, ndim, &count)) {
    for (size_t d = 0; d < ndim; ++d) {
      if (t.shape[d] < 0) throw Refusal("malformed DLPack tensor: shape " + join(t.shape, ndim));
    }
    throw Refusal("malformed DLPack tensor: the element count of shape " + join(t.shape, ndim) +
                  " overflows 64 bits");
  }
  uint64_t nbytes = 0;
  if (!byte_count(count, itemsize(info.dtype), &nbytes)) {
    throw Refusal("malformed DLPack tensor: shape " + join(t.shape, ndim) + " of " + dtype_name(info.dtype) +
                  " is " + std::to_string(count) + " elements, more bytes than a buffer can hold (overflow)");
  }
  if (!is_contiguous(t)) {
    throw Refusal("the " + noun + " is not contiguous (shape " + join(t.shape, ndim) + ", strides " +
                  join(t.strides, ndim) + " in elements)" + wording.contiguous_hint);
  }
  if (t.data != nullptr) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
    if (t.byte_offset > UINTPTR_MAX - base || nbytes > UINTPTR_MAX - base - t.byte_offset) {
      throw Refusal("malformed DLPack tensor: byte_offset " + std::to_string(t.byte_offset) + " and " +
                    std::to_string(nbytes) + " bytes overflow the address space");
    }
    info.data = reinterpret_cast<void*>(base + static_cast<uintptr_t>(t.byte_offset));
  } else if (nbytes != 0) {
    throw Refusal("malformed DLPack tensor: no data pointer for " + std::to_string(nbytes) + " bytes");
  }
  info.nbytes = static_cast<size_t>(nbytes);
  info.shape.assign(t.shape, t.shape + ndim);
  return info;
}

// Calls a DLManagedTensor's deleter, if it has one (the consumer's last word on it).
inline void release(DLManagedTensor* managed) noexcept {
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

}  // namespace dlpack
}  // namespace byteps
