// The element loops of the gradient compressors (onebit, topk, randomk
// here; dithering in dithering_loops.h) and of their error-feedback /
// momentum arithmetic, on raw pointers: no Python here, so
// compress_kernels.cpp can run them with the GIL released after it has
// validated every size.
//
// The math is BytePS's (v0.2.5); the byte layouts are ours (see
// compress_kernels.cpp for the formats). Storage types: float, double, and
// uint16_t standing for IEEE float16, which is computed in float through
// half_float.h, as BytePS does.
//
// Every compress loop takes an optional `error` output (nullptr: none):
// error feedback's e = x - D(C(x)) written in the compressing pass, where
// D is the matching decompress loop, bit for bit what decompressing into e
// and numpy's np.subtract(x, e, out=e) give (store_error below). `error`
// may be x itself (the update in place) but must not otherwise overlap it.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "half_float.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the compressed layouts are little-endian and are written with memcpy from native integers"
#endif

namespace byteps {
namespace compress {

// ---------------------------------------------------------------------------
// BytePS's xorshift128+, bit for bit, so that seeded randomk/dithering pick
// what BytePS workers and servers pick.

struct Xorshift128p {
  uint64_t a;
  uint64_t b;

  uint64_t next() {
    uint64_t t = a;
    const uint64_t s = b;
    a = s;
    t ^= t << 23;
    t ^= t >> 17;
    t ^= s ^ (s >> 26);
    b = t;
    return t + s;
  }

  // One draw per call whatever p is, so the stream position depends only on
  // how many calls were made. 2^64 as a double; p <= 0 or NaN is false.
  bool bernoulli(double p) { return to_double(next()) < p * 18446744073709551616.0; }

  // (double)r, rounded to nearest as the plain cast is, without the branch on
  // the top bit that x86-64 compilers emit for it (taken at random here):
  // both halves convert exactly and the one addition rounds.
  static double to_double(uint64_t r) {
    return static_cast<double>(r >> 32) * 4294967296.0 + static_cast<double>(r & 0xFFFFFFFFu);
  }
};

// ---------------------------------------------------------------------------
// Element types.

template <typename S>
struct Element;

template <>
struct Element<float> {
  using Compute = float;
  using Bits = uint32_t;
  static constexpr Bits kAbsMask = 0x7FFFFFFFu;
  static constexpr Bits kInf = 0x7F800000u;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};

template <>
struct Element<double> {
  using Compute = double;
  using Bits = uint64_t;
  static constexpr Bits kAbsMask = 0x7FFFFFFFFFFFFFFFull;
  static constexpr Bits kInf = 0x7FF0000000000000ull;
  static double load(double v) { return v; }
  static double store(double v) { return v; }
};

template <>
struct Element<uint16_t> {  // IEEE float16
  using Compute = float;
  using Bits = uint16_t;
  static constexpr Bits kAbsMask = 0x7FFFu;
  static constexpr Bits kInf = 0x7C00u;
  static float load(uint16_t h) { return half::f16_to_float(h); }
  static uint16_t store(float v) { return half::float_to_f16(v); }
};

template <typename S>
using Compute = typename Element<S>::Compute;

template <typename S>
inline Compute<S> load(S v) {
  return Element<S>::load(v);
}

// ---------------------------------------------------------------------------
// Error feedback's difference e = x - d, d being what the matching decompress
// loop gives, as numpy's np.subtract(x, d, out=e) computes it: in the compute
// type (float16 through float32), and stored as numpy stores it (store_error).
// e may be x itself, or must not overlap it.
//
//   error_by_sign(x, e, n, pos, neg)   d = x < 0 ? neg : pos (onebit; 0 and 0: sparse)
//   error_minus(x, d, e, n)            d given in the compute type (dithering)
//
// GCC does not vectorise half_float.h's scalar codecs here (under
// -ftrapping-math it keeps their selects as branches), so for float16 both
// run on F16C where the CPU has it: the same bits, as its conversions are
// exact (half to float) and round to nearest even keeping a NaN's payload
// (float to half) as numpy's cast does.

// float16 stored as numpy's float32 -> float16 cast, which keeps a NaN's
// payload (its top 10 bits, quiet bit included), where float_to_f16, like
// Element::store, gives every NaN the one payload 0x200.
template <typename S>
inline S store_error(Compute<S> v) {
  return Element<S>::store(v);
}

template <>
inline uint16_t store_error<uint16_t>(float v) {
  const uint32_t w = half::float_to_bits(v);
  const uint32_t payload = (w & 0x007FFFFFu) >> 13;
  const uint32_t nan = ((w >> 16) & 0x8000u) | 0x7C00u | payload | (payload == 0);
  const uint32_t is_nan = 0u - static_cast<uint32_t>((w & 0x7FFFFFFFu) > 0x7F800000u);
  return static_cast<uint16_t>((nan & is_nan) | (half::float_to_f16(v) & ~is_nan));
}

template <typename S, typename F>
inline void error_loop_disjoint(const S* __restrict__ x, S* __restrict__ e, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) e[i] = store_error<S>(f(load(x[i]), i));
}

// e[i] = f(x[i], i), stored as numpy would: in place and disjoint in loops
// of their own, so that both vectorise without a runtime overlap check.
template <typename S, typename F>
inline void error_loop(const S* x, S* e, size_t n, F f) {
  if (static_cast<const void*>(x) == static_cast<const void*>(e)) {
    for (size_t i = 0; i < n; ++i) e[i] = store_error<S>(f(load(e[i]), i));
  } else {
    error_loop_disjoint(x, e, n, f);
  }
}

template <typename S>
void error_by_sign_portable(const S* x, S* e, size_t n, Compute<S> pos, Compute<S> neg) {
  error_loop(x, e, n, [pos, neg](Compute<S> v, size_t) { return v - (v < 0 ? neg : pos); });
}

template <typename S>
void error_minus_portable(const S* x, const Compute<S>* d, S* e, size_t n) {
  error_loop(x, e, n, [d](Compute<S> v, size_t i) { return v - d[i]; });
}

#if defined(__x86_64__) || defined(__i386__)
#define BYTEPS_ERROR_F16C 1

inline bool error_f16c_usable() {
  static const bool usable = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return usable;
}

// Eight elements at a time, then the portable loop for the rest. Each step
// loads its elements before it stores them, so e may be x itself.
__attribute__((target("avx,f16c"))) inline void error_by_sign_f16c(const uint16_t* x, uint16_t* e, size_t n,
                                                                   float pos, float neg) {
  // d = pos ^ ((pos ^ neg) where v < 0): bit operations, which GCC keeps as
  // they are (it turns a blendv into a branch per element).
  const __m256 vpos = _mm256_set1_ps(pos), flip = _mm256_xor_ps(vpos, _mm256_set1_ps(neg));
  const __m256 zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    const __m256 d = _mm256_xor_ps(vpos, _mm256_and_ps(flip, _mm256_cmp_ps(v, zero, _CMP_LT_OQ)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(e + i),
                     _mm256_cvtps_ph(_mm256_sub_ps(v, d), _MM_FROUND_TO_NEAREST_INT));
  }
  error_by_sign_portable(x + i, e + i, n - i, pos, neg);
}

__attribute__((target("avx,f16c"))) inline void error_minus_f16c(const uint16_t* x, const float* d, uint16_t* e,
                                                                 size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(e + i),
                     _mm256_cvtps_ph(_mm256_sub_ps(v, _mm256_loadu_ps(d + i)), _MM_FROUND_TO_NEAREST_INT));
  }
  error_minus_portable(x + i, d + i, e + i, n - i);
}
#endif

template <typename S>
void error_by_sign(const S* x, S* e, size_t n, Compute<S> pos, Compute<S> neg) {
#ifdef BYTEPS_ERROR_F16C
  if constexpr (std::is_same_v<S, uint16_t>) {
    if (error_f16c_usable()) return error_by_sign_f16c(x, e, n, pos, neg);
  }
#endif
  error_by_sign_portable(x, e, n, pos, neg);
}

template <typename S>
void error_minus(const S* x, const Compute<S>* d, S* e, size_t n) {
#ifdef BYTEPS_ERROR_F16C
  if constexpr (std::is_same_v<S, uint16_t>) {
    if (error_f16c_usable()) return error_minus_f16c(x, d, e, n);
  }
#endif
  error_minus_portable(x, d, e, n);
}

// 0 in the compute type, as a value the compiler cannot see: x - 0 is not x
// for a signaling NaN (the subtraction quiets it, as numpy's does), but
// GCC, assuming no signaling NaNs, would fold a literal 0 away.
template <typename S>
inline Compute<S> opaque_zero() {
  volatile Compute<S> zero = 0;
  return zero;
}

// ---------------------------------------------------------------------------
// Onebit: one sign bit per element in words as wide as the element, first
// element in the most significant bit, then the float32 scale.

// The value onebit_decompress gives an element: +scale, or -scale (the
// sign bit flipped) for a set bit.
template <typename S>
inline S onebit_value(float scale, bool negative) {
  using W = typename Element<S>::Bits;
  const S pos = Element<S>::store(scale);
  W bits;
  std::memcpy(&bits, &pos, sizeof(pos));
  bits = static_cast<W>(bits ^ (static_cast<W>(negative) << (8 * sizeof(S) - 1)));
  S value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

template <typename S>
float onebit_compress(const S* x, size_t n, uint8_t* dst, bool scaling, S* error = nullptr) {
  using W = typename Element<S>::Bits;
  constexpr size_t kP = 8 * sizeof(S);
  float scale = 1.0f;
  if (scaling) {
    // Eight independent partial sums: one chain of dependent double additions
    // would run at the adder's latency, not its throughput. (BytePS sums in one
    // chain; in double precision the order changes no float32 scale in practice.)
    double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (size_t lane = 0; lane < 8; ++lane) partial[lane] += static_cast<double>(std::fabs(load(x[i + lane])));
    }
    for (; i < n; ++i) partial[i % 8] += static_cast<double>(std::fabs(load(x[i])));
    double sum = 0.0;
    for (double value : partial) sum += value;
    // The mean of no elements is taken as 0 rather than 0/0.
    scale = n ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f;
  }
  // The two values an element decodes to, in the compute type.
  const Compute<S> pos = load(onebit_value<S>(scale, false));
  const Compute<S> neg = load(onebit_value<S>(scale, true));
  const size_t words = (n + kP - 1) / kP;
  // The error follows each block of words, while their elements are cached.
  constexpr size_t kBlockWords = 64;
  for (size_t j0 = 0; j0 < words; j0 += kBlockWords) {
    const size_t j1 = std::min(words, j0 + kBlockWords);
    for (size_t j = j0; j < j1; ++j) {
      const size_t begin = j * kP;
      const size_t len = std::min(kP, n - begin);
      // The sign tests first (vectorisable), then the bits in one pass.
      uint8_t negative[kP] = {};
      for (size_t b = 0; b < len; ++b) negative[b] = load(x[begin + b]) < 0;
      W word = 0;
      for (size_t b = 0; b < kP; ++b) word = static_cast<W>((word << 1) | negative[b]);
      std::memcpy(dst + j * sizeof(W), &word, sizeof(W));
    }
    // After the block's sign tests, so that error may be x itself.
    if (error) error_by_sign(x + j0 * kP, error + j0 * kP, std::min(n, j1 * kP) - j0 * kP, pos, neg);
  }
  std::memcpy(dst + words * sizeof(W), &scale, sizeof(scale));
  return scale;
}

template <typename S>
void onebit_decompress(const uint8_t* src, size_t n, S* out) {
  using W = typename Element<S>::Bits;
  constexpr size_t kP = 8 * sizeof(S);
  const size_t words = (n + kP - 1) / kP;
  float scale;
  std::memcpy(&scale, src + words * sizeof(W), sizeof(scale));
  // -scale is +scale with the sign bit flipped in every element type
  // (float16's rounding is symmetric), so a set bit is a sign flip: integer
  // masks and compares, which SSE2 vectorises, where a per-element shift
  // by a varying count would not.
  const S pos = Element<S>::store(scale);
  W pos_bits;
  std::memcpy(&pos_bits, &pos, sizeof(pos));
  constexpr W kSign = static_cast<W>(W{1} << (kP - 1));
  W masks[kP];
  for (size_t b = 0; b < kP; ++b) masks[b] = static_cast<W>(W{1} << (kP - 1 - b));
  W values[kP];
  for (size_t j = 0; j < words; ++j) {
    W word;
    std::memcpy(&word, src + j * sizeof(W), sizeof(W));
    for (size_t b = 0; b < kP; ++b) {
      values[b] = static_cast<W>(pos_bits ^ (kSign & static_cast<W>(0 - static_cast<W>((word & masks[b]) != 0))));
    }
    std::memcpy(out + j * kP, values, std::min(kP, n - j * kP) * sizeof(W));
  }
}

// ---------------------------------------------------------------------------
// Sparse records {uint32 index, value}, packed: topk and randomk write them,
// sparse_decompress reads them. Values are copied as raw bytes, so a NaN's
// payload and a -0.0 travel unchanged.

constexpr size_t kIndexBytes = 4;

template <typename S>
inline void put_record(uint8_t* dst, size_t t, uint32_t index, const S* x) {
  uint8_t* rec = dst + t * (kIndexBytes + sizeof(S));
  std::memcpy(rec, &index, kIndexBytes);
  std::memcpy(rec + kIndexBytes, x + index, sizeof(S));
}

// error = x - sparse_decompress(the k records in dst): x - 0 everywhere, then
// v - v at each record's index, v the value it carries (x's there, so the
// records may have been taken from error itself, and duplicates agree).
template <typename S>
void sparse_error(const S* x, size_t n, const uint8_t* dst, size_t k, S* error) {
  const Compute<S> zero = opaque_zero<S>();
  error_by_sign(x, error, n, zero, zero);
  for (size_t t = 0; t < k; ++t) {
    const uint8_t* rec = dst + t * (kIndexBytes + sizeof(S));
    uint32_t index;
    S value;
    std::memcpy(&index, rec, kIndexBytes);
    std::memcpy(&value, rec + kIndexBytes, sizeof(S));
    error[index] = store_error<S>(load(value) - load(value));
  }
}

// |x|'s bit pattern, which orders like |x| for IEEE floats, with every NaN
// folded onto one value just above Inf.
template <typename S>
inline typename Element<S>::Bits magnitude_bits(const S* x) {
  using E = Element<S>;
  typename E::Bits bits;
  std::memcpy(&bits, x, sizeof(bits));
  bits &= E::kAbsMask;
  return bits > E::kInf ? E::kInf + 1 : bits;
}

// The k elements of largest |x|, ties to the lower index, NaN above every
// number. Each element's key holds its magnitude_bits high and its
// complemented index in the low 32 bits, so the keys' order is total and
// nth_element's result does not depend on its pivots or on which elements
// it is given, as long as the top k are among them.
template <typename S>
void topk_compress(const S* x, size_t n, size_t k, uint8_t* dst, S* error = nullptr) {
  using Bits = typename Element<S>::Bits;
  using Key = std::conditional_t<sizeof(S) <= 4, uint64_t, unsigned __int128>;
  auto key = [x](size_t i) { return (Key(magnitude_bits(x + i)) << 32) | Key(~static_cast<uint32_t>(i)); };
  std::vector<Key> keys;
  // Where k is a small part of n, a strided sample's order statistic gives a
  // magnitude that about 2k elements reach, and only those are selected
  // from. Should fewer than k reach it (a layout that fooled the sample),
  // all elements are.
  constexpr size_t kStride = 16;
  if (n >= 64 * kStride && k <= n / 16) {
    std::vector<Bits> sample(n / kStride);
    for (size_t j = 0; j < sample.size(); ++j) sample[j] = magnitude_bits(x + j * kStride);
    const size_t rank = std::min(sample.size() - 1, 2 * k / kStride + 8);
    std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<Bits>());
    const Bits threshold = sample[rank];
    keys.reserve(2 * k + 16 * kStride);
    for (size_t i = 0; i < n; ++i) {
      if (magnitude_bits(x + i) >= threshold) keys.push_back(key(i));
    }
    if (keys.size() < k) keys.clear();
  }
  if (keys.empty()) {
    keys.resize(n);
    for (size_t i = 0; i < n; ++i) keys[i] = key(i);
  }
  if (k < keys.size()) std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<Key>());
  std::vector<uint32_t> chosen(k);
  for (size_t t = 0; t < k; ++t) chosen[t] = ~static_cast<uint32_t>(keys[t]);
  std::sort(chosen.begin(), chosen.end());
  for (size_t t = 0; t < k; ++t) put_record(dst, t, chosen[t], x);
  if (error) sparse_error(x, n, dst, k, error);
}

// k draws with replacement, in draw order (duplicates kept), as BytePS.
template <typename S>
void randomk_compress(const S* x, size_t n, size_t k, Xorshift128p& rng, uint8_t* dst, S* error = nullptr) {
  for (size_t t = 0; t < k; ++t) put_record(dst, t, static_cast<uint32_t>(rng.next() % n), x);
  if (error) sparse_error(x, n, dst, k, error);
}

// Index of the first record whose index is >= n, or k when all are valid.
template <typename S>
size_t first_bad_record(const uint8_t* src, size_t k, size_t n, uint32_t* index) {
  for (size_t t = 0; t < k; ++t) {
    std::memcpy(index, src + t * (kIndexBytes + sizeof(S)), kIndexBytes);
    if (*index >= n) return t;
  }
  return k;
}

// Records checked by first_bad_record beforehand; later duplicates win.
template <typename S>
void sparse_decompress(const uint8_t* src, size_t k, size_t n, S* out) {
  std::memset(out, 0, n * sizeof(S));  // all-zero bits are +0.0 in every float type
  for (size_t t = 0; t < k; ++t) {
    const uint8_t* rec = src + t * (kIndexBytes + sizeof(S));
    uint32_t index;
    std::memcpy(&index, rec, kIndexBytes);
    std::memcpy(out + index, rec + kIndexBytes, sizeof(S));
  }
}

// ---------------------------------------------------------------------------
// Error feedback and momentum, in the element's compute type (float for
// float16 and float32, double for float64) with the factor a float, as
// BytePS.

// dst += alpha * src; dst may be src itself.
template <typename S>
void axpy(S* dst, const S* src, size_t n, float alpha) {
  const Compute<S> a = alpha;
  for (size_t i = 0; i < n; ++i) dst[i] = Element<S>::store(load(dst[i]) + a * load(src[i]));
}

// m = g + mu*m, then g = g + mu*m with the stored (rounded) m.
template <typename S>
void nesterov(S* __restrict__ grad, S* __restrict__ momentum, size_t n, float mu) {
  const Compute<S> m_u = mu;
  for (size_t i = 0; i < n; ++i) {
    const Compute<S> g = load(grad[i]);
    const S m = Element<S>::store(g + m_u * load(momentum[i]));
    momentum[i] = m;
    grad[i] = Element<S>::store(g + m_u * load(m));
  }
}

}  // namespace compress
}  // namespace byteps
