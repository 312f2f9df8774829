// Scalar float16 / bfloat16 <-> float32 conversions.
//
// These are the portable reference the vector paths must agree with: they
// run on every CPU (aarch64 included), handle the vector loops' tails, and
// are written branch-free so that GCC can still auto-vectorise them with
// plain SSE2 on machines without F16C.
//
// Both narrowing conversions round to nearest, ties to even, keep NaN a NaN
// (quiet) and Inf an Inf, and overflow to Inf exactly like numpy's float16
// cast and ml_dtypes' bfloat16 cast.

#pragma once

#include <cstdint>
#include <cstring>

namespace byteps {
namespace half {

inline float bits_to_float(uint32_t w) {
  float f;
  std::memcpy(&f, &w, sizeof(f));
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t w;
  std::memcpy(&w, &f, sizeof(w));
  return w;
}

// IEEE binary16 -> binary32, exact. The trick (from Maratyszcza's FP16
// library): shift the half's exponent+mantissa into a float's position and
// rescale by 2^-112 for normals; build subnormals as (magic + m) - magic.
inline float f16_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result =
      sign | (two_w < (1u << 27) ? float_to_bits(denormalized) : float_to_bits(normalized));
  return bits_to_float(result);
}

// IEEE binary32 -> binary16, round to nearest even. The float adder does the
// rounding: adding a power of two chosen from the input's exponent leaves
// exactly the half's 10 mantissa bits, rounded by the hardware's default
// (nearest-even) mode. Large inputs are pushed to Inf by the 2^112 scale.
inline uint16_t float_to_f16(float f) {
  const uint32_t w = float_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  float base = (bits_to_float(w & 0x7FFFFFFFu) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = bits_to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// bfloat16 is the top half of a float32: widening is a shift.
inline float bf16_to_float(uint16_t b) {
  return bits_to_float(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even by adding 0x7FFF plus the lowest kept bit; a NaN
// gets its quiet bit set so that truncation cannot turn it into an Inf.
inline uint16_t float_to_bf16(float f) {
  const uint32_t w = float_to_bits(f);
  const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (w >> 16) | 0x0040u;
  const bool is_nan = (w & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

// Codecs used to instantiate the generic half loops.
struct F16Codec {
  static float to_float(uint16_t h) { return f16_to_float(h); }
  static uint16_t from_float(float f) { return float_to_f16(f); }
};

struct BF16Codec {
  static float to_float(uint16_t b) { return bf16_to_float(b); }
  static uint16_t from_float(float f) { return float_to_bf16(f); }
};

}  // namespace half
}  // namespace byteps
