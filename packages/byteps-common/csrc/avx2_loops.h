// Half-precision loops for CPUs with AVX2 and F16C, written with intrinsics
// where the auto-vectoriser falls short. Compiled only into functions marked
// target("avx2,f16c") and reached only after __builtin_cpu_supports said
// yes. Tails go through the scalar codecs, which round identically.
//
// float16: F16C converts 8 halves per instruction, rounding to nearest even
// in hardware. bfloat16: widening interleaves zero low halves (the bf16 bits
// become a float's top half), narrowing rounds in integer arithmetic; GCC
// vectorises both conversions alone, but not the add that pairs them.

#pragma once

#include "reduce_loops.h"

#if defined(BYTEPS_X86)

#define BYTEPS_AVX2 __attribute__((target("avx2,f16c")))

namespace byteps {
namespace kernels {

struct F16cF16 {
  static constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

  BYTEPS_AVX2 static __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  BYTEPS_AVX2 static void store8(uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kRound));
  }

  BYTEPS_AVX2 static void widen(float* __restrict__ acc, const uint16_t* __restrict__ src,
                                size_t n, bool first) {
    size_t i = 0;
    if (first) {
      for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(acc + i, load8(src + i));
        _mm256_storeu_ps(acc + i + 8, load8(src + i + 8));
      }
    } else {
      for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), load8(src + i)));
        _mm256_storeu_ps(acc + i + 8,
                         _mm256_add_ps(_mm256_loadu_ps(acc + i + 8), load8(src + i + 8)));
      }
    }
    widen_loop<half::F16Codec>(acc + i, src + i, n - i, first);
  }

  BYTEPS_AVX2 static void narrow(uint16_t* __restrict__ out, const float* __restrict__ acc,
                                 size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      store8(out + i, _mm256_loadu_ps(acc + i));
      store8(out + i + 8, _mm256_loadu_ps(acc + i + 8));
    }
    narrow_loop<half::F16Codec>(out + i, acc + i, n - i);
  }

  BYTEPS_AVX2 static void add(uint16_t* __restrict__ dst, const uint16_t* __restrict__ src,
                              size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      store8(dst + i, _mm256_add_ps(load8(dst + i), load8(src + i)));
      store8(dst + i + 8, _mm256_add_ps(load8(dst + i + 8), load8(src + i + 8)));
    }
    half_add_loop<half::F16Codec>(dst + i, src + i, n - i);
  }

  // dst may be src itself: each group of eight is loaded before it is stored.
  BYTEPS_AVX2 static void scale(uint16_t* dst, const uint16_t* src, size_t n, float divisor) {
    const __m256 d = _mm256_set1_ps(divisor);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) store8(dst + i, _mm256_div_ps(load8(src + i), d));
    half_scale_loop<half::F16Codec>(dst + i, src + i, n - i, divisor);
  }
};

struct Avx2BF16 {
  // Eight floats -> eight bfloat16 in the low 16 bits of each 32-bit lane,
  // exactly as half::float_to_bf16 (nearest even; NaN stays a quiet NaN).
  BYTEPS_AVX2 static __m256i round8(__m256 f) {
    const __m256i w = _mm256_castps_si256(f);
    const __m256i high = _mm256_srli_epi32(w, 16);
    const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
    const __m256i biased = _mm256_add_epi32(_mm256_add_epi32(w, _mm256_set1_epi32(0x7FFF)), lsb);
    const __m256i rounded = _mm256_srli_epi32(biased, 16);
    const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
    const __m256 is_nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded),
                                                 _mm256_castsi256_ps(quiet_nan), is_nan));
  }

  BYTEPS_AVX2 static void widen(float* __restrict__ acc, const uint16_t* __restrict__ src,
                                size_t n, bool first) {
    widen_loop<half::BF16Codec>(acc, src, n, first);
  }

  BYTEPS_AVX2 static void narrow(uint16_t* __restrict__ out, const float* __restrict__ acc,
                                 size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      // packus interleaves 128-bit lanes: [a0-3 b0-3 | a4-7 b4-7]; restore order.
      const __m256i packed = _mm256_packus_epi32(round8(_mm256_loadu_ps(acc + i)),
                                                 round8(_mm256_loadu_ps(acc + i + 8)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm256_permute4x64_epi64(packed, 0xD8));
    }
    narrow_loop<half::BF16Codec>(out + i, acc + i, n - i);
  }

  BYTEPS_AVX2 static void add(uint16_t* __restrict__ dst, const uint16_t* __restrict__ src,
                              size_t n) {
    const __m256i zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dst + i));
      const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      // unpack and packus both work within 128-bit lanes, so packing the
      // low and high unpacked halves back restores the original order.
      const __m256 lo = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, d)),
                                      _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, s)));
      const __m256 hi = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, d)),
                                      _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, s)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_packus_epi32(round8(lo), round8(hi)));
    }
    half_add_loop<half::BF16Codec>(dst + i, src + i, n - i);
  }

  BYTEPS_AVX2 static void scale(uint16_t* dst, const uint16_t* src, size_t n, float divisor) {
    half_scale_loop<half::BF16Codec>(dst, src, n, divisor);
  }
};

struct Avx2Isa {
  using F16 = F16cF16;
  using BF16 = Avx2BF16;
};

}  // namespace kernels
}  // namespace byteps

#endif  // BYTEPS_X86
