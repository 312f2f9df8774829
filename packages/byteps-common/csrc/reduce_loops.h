// The element loops behind the reduction kernels, one set per instruction
// set, and the runtime choice between them.
//
// The wheel is built for the baseline x86-64 (no -march=native) so it runs
// anywhere; the same generic loops are compiled a second time inside
// functions marked target("avx2,f16c"), where GCC vectorises them with
// 256-bit registers, and float16 gets explicit F16C conversions. Which set
// runs is decided once, from __builtin_cpu_supports, when the module loads.
//
// Dtype codes are the wire codes of byteps.common.dtypes.DType.

#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "half_float.h"

#if defined(__x86_64__) || defined(__i386__)
#define BYTEPS_X86 1
#include <immintrin.h>
#endif

#define BYTEPS_INLINE inline __attribute__((always_inline))

// The scale loops write dst from src where dst may be src itself (scale is
// scale_into(buf, buf)), so __restrict__ would be a lie; what is true, and
// all the vectoriser needs, is that no iteration reads what another wrote.
#if defined(__clang__)
#define BYTEPS_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define BYTEPS_IVDEP _Pragma("GCC ivdep")
#else
#define BYTEPS_IVDEP
#endif

namespace byteps {
namespace kernels {

enum DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
};
constexpr int kNumDTypes = 6;

// ---------------------------------------------------------------------------
// Generic loops. always_inline, so each instruction-set variant below gets
// its own copy compiled (and vectorised) for its target.

// Integers wrap on overflow like numpy; signed overflow is undefined in C++,
// so the addition is done in the unsigned type.
template <typename T>
BYTEPS_INLINE T wrapping_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <typename T>
BYTEPS_INLINE void add_loop(T* __restrict__ dst, const T* __restrict__ src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = wrapping_add(dst[i], src[i]);
}

template <typename T>
BYTEPS_INLINE void copy_or_add(void* acc, const void* src, size_t n, bool first) {
  if (first) {
    if (acc != src) std::memmove(acc, src, n * sizeof(T));
  } else {
    add_loop(static_cast<T*>(acc), static_cast<const T*>(src), n);
  }
}

template <class Codec>
BYTEPS_INLINE void widen_loop(float* __restrict__ acc, const uint16_t* __restrict__ src, size_t n,
                              bool first) {
  if (first) {
    for (size_t i = 0; i < n; ++i) acc[i] = Codec::to_float(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] += Codec::to_float(src[i]);
  }
}

template <class Codec>
BYTEPS_INLINE void narrow_loop(uint16_t* __restrict__ out, const float* __restrict__ acc,
                               size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Codec::from_float(acc[i]);
}

template <class Codec>
BYTEPS_INLINE void half_add_loop(uint16_t* __restrict__ dst, const uint16_t* __restrict__ src,
                                 size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = Codec::from_float(Codec::to_float(dst[i]) + Codec::to_float(src[i]));
}

template <class Codec>
BYTEPS_INLINE void half_scale_loop(uint16_t* dst, const uint16_t* src, size_t n, float divisor) {
  BYTEPS_IVDEP
  for (size_t i = 0; i < n; ++i) dst[i] = Codec::from_float(Codec::to_float(src[i]) / divisor);
}

template <typename T>
BYTEPS_INLINE void float_scale_loop(T* dst, const T* src, size_t n, T divisor) {
  BYTEPS_IVDEP
  for (size_t i = 0; i < n; ++i) dst[i] = src[i] / divisor;
}

// numpy's floor division: the quotient rounded towards minus infinity, and
// MIN // -1 wraps to MIN. For int32 the double quotient is exact enough that
// floor() of it is the floor quotient (|a|, |d| < 2^31 << 2^53), and it
// vectorises, unlike integer division.
BYTEPS_INLINE void int32_floor_div_loop(int32_t* dst, const int32_t* src, size_t n,
                                        int64_t divisor) {
  const double d = static_cast<double>(divisor);
  BYTEPS_IVDEP
  for (size_t i = 0; i < n; ++i)
    dst[i] = static_cast<int32_t>(std::floor(static_cast<double>(src[i]) / d));
}

BYTEPS_INLINE void int64_floor_div_loop(int64_t* dst, const int64_t* src, size_t n,
                                        int64_t divisor) {
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = src[i];
    int64_t q = a / divisor;
    if ((a % divisor != 0) && ((a < 0) != (divisor < 0))) --q;
    dst[i] = q;
  }
}

template <typename T>
BYTEPS_INLINE void negate_loop(T* dst, const T* src, size_t n) {
  using U = std::make_unsigned_t<T>;
  BYTEPS_IVDEP
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(U(0) - static_cast<U>(src[i]));
}

// The four operations (scale as scale-into) over every dtype, given the
// half-precision loops of one instruction set (Isa::F16, Isa::BF16: the
// only loops written by hand per instruction set; the rest differ only by
// compiler target).
template <class Isa>
BYTEPS_INLINE void accumulate_body(void* acc, const void* src, size_t n, int dtype, bool first) {
  switch (dtype) {
    case kFloat32: copy_or_add<float>(acc, src, n, first); break;
    case kFloat64: copy_or_add<double>(acc, src, n, first); break;
    case kInt32: copy_or_add<int32_t>(acc, src, n, first); break;
    case kInt64: copy_or_add<int64_t>(acc, src, n, first); break;
    case kFloat16:
      Isa::F16::widen(static_cast<float*>(acc), static_cast<const uint16_t*>(src), n, first);
      break;
    case kBFloat16:
      Isa::BF16::widen(static_cast<float*>(acc), static_cast<const uint16_t*>(src), n, first);
      break;
    default: break;
  }
}

template <class Isa>
BYTEPS_INLINE void finalize_body(void* out, const void* acc, size_t n, int dtype) {
  switch (dtype) {
    case kFloat32:
    case kInt32:
      if (out != acc) std::memmove(out, acc, n * 4);
      break;
    case kFloat64:
    case kInt64:
      if (out != acc) std::memmove(out, acc, n * 8);
      break;
    case kFloat16:
      Isa::F16::narrow(static_cast<uint16_t*>(out), static_cast<const float*>(acc), n);
      break;
    case kBFloat16:
      Isa::BF16::narrow(static_cast<uint16_t*>(out), static_cast<const float*>(acc), n);
      break;
    default: break;
  }
}

template <class Isa>
BYTEPS_INLINE void sum_into_body(void* dst, const void* src, size_t n, int dtype) {
  switch (dtype) {
    case kFloat32: add_loop(static_cast<float*>(dst), static_cast<const float*>(src), n); break;
    case kFloat64: add_loop(static_cast<double*>(dst), static_cast<const double*>(src), n); break;
    case kInt32: add_loop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n); break;
    case kInt64: add_loop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n); break;
    case kFloat16:
      Isa::F16::add(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
      break;
    case kBFloat16:
      Isa::BF16::add(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
      break;
    default: break;
  }
}

// dst = src / divisor; dst is either src itself (scale in place) or a
// buffer that does not overlap it.
template <class Isa>
BYTEPS_INLINE void scale_body(void* dst, const void* src, size_t n, int dtype, int64_t divisor) {
  if (divisor == -1 && (dtype == kInt32 || dtype == kInt64)) {
    if (dtype == kInt32) {
      negate_loop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n);
    } else {
      negate_loop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n);
    }
    return;
  }
  switch (dtype) {
    case kFloat32:
      float_scale_loop(static_cast<float*>(dst), static_cast<const float*>(src), n,
                       static_cast<float>(divisor));
      break;
    case kFloat64:
      float_scale_loop(static_cast<double*>(dst), static_cast<const double*>(src), n,
                       static_cast<double>(divisor));
      break;
    case kInt32:
      int32_floor_div_loop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n,
                           divisor);
      break;
    case kInt64:
      int64_floor_div_loop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n,
                           divisor);
      break;
    case kFloat16:
      Isa::F16::scale(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n,
                      static_cast<float>(divisor));
      break;
    case kBFloat16:
      Isa::BF16::scale(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n,
                       static_cast<float>(divisor));
      break;
    default: break;
  }
}

// ---------------------------------------------------------------------------
// Half-precision loops without F16C: the branch-free scalar codecs, which
// GCC still vectorises with the baseline SSE2 (slowly, for float16).
template <class Codec>
struct PortableHalf {
  static BYTEPS_INLINE void widen(float* acc, const uint16_t* src, size_t n, bool first) {
    widen_loop<Codec>(acc, src, n, first);
  }
  static BYTEPS_INLINE void narrow(uint16_t* out, const float* acc, size_t n) {
    narrow_loop<Codec>(out, acc, n);
  }
  static BYTEPS_INLINE void add(uint16_t* dst, const uint16_t* src, size_t n) {
    half_add_loop<Codec>(dst, src, n);
  }
  static BYTEPS_INLINE void scale(uint16_t* dst, const uint16_t* src, size_t n, float divisor) {
    half_scale_loop<Codec>(dst, src, n, divisor);
  }
};

struct PortableIsa {
  using F16 = PortableHalf<half::F16Codec>;
  using BF16 = PortableHalf<half::BF16Codec>;
};

}  // namespace kernels
}  // namespace byteps
