// Dithering's element loops (see compress_loops.h for the element types and
// the generator): stochastic rounding to `levels` levels of a scale, one
// draw per element, in BytePS's arithmetic, written as fixed-width fields
// where BytePS writes an Elias-delta stream of the nonzero levels. Both
// decode to the same values.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "compress_loops.h"

namespace byteps {
namespace compress {

// One fixed-width field per element, bit 0 the sign, the level code above
// it, packed least significant bit first into a byte stream.

inline unsigned bit_length(uint64_t v) { return v ? 64u - static_cast<unsigned>(__builtin_clzll(v)) : 0u; }

// Bits per element: a sign and a code up to `levels` (linear: q itself;
// natural: log2(q) + 1, at most levels).
inline unsigned dithering_field_bits(uint32_t levels) { return 1 + bit_length(levels); }

inline size_t dithering_stream_bytes(size_t n, uint32_t levels) {
  return (n * dithering_field_bits(levels) + 7) / 8;
}

inline uint32_t round_next_pow2(uint32_t v) {
  v -= 1;
  v |= v >> 1;
  v |= v >> 2;
  v |= v >> 4;
  v |= v >> 8;
  v |= v >> 16;
  return v + 1;
}

class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}
  // width <= 26 (levels <= 2^24) and bits_ < 32 between calls, so acc_ never
  // holds more than 57 bits.
  void put(uint32_t value, unsigned width) {
    acc_ |= static_cast<uint64_t>(value) << bits_;
    bits_ += width;
    if (bits_ >= 32) {
      const auto low = static_cast<uint32_t>(acc_);
      std::memcpy(out_, &low, 4);
      out_ += 4;
      acc_ >>= 32;
      bits_ -= 32;
    }
  }
  void flush() {
    for (; bits_ > 0; bits_ = bits_ > 8 ? bits_ - 8 : 0, acc_ >>= 8) *out_++ = static_cast<uint8_t>(acc_);
  }

 private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  unsigned bits_ = 0;
};

// Reads the fields back. Refills 4 bytes at a time: it only refills while
// fields remain, so the read stays inside the stream plus the 4 scale bytes
// that follow it.
class BitReader {
 public:
  explicit BitReader(const uint8_t* in) : in_(in) {}
  uint32_t get(unsigned width) {
    if (bits_ < width) {
      uint32_t next;
      std::memcpy(&next, in_, 4);
      in_ += 4;
      acc_ |= static_cast<uint64_t>(next) << bits_;
      bits_ += 32;
    }
    const auto value = static_cast<uint32_t>(acc_ & ((uint64_t{1} << width) - 1));
    acc_ >>= width;
    bits_ -= width;
    return value;
  }

 private:
  const uint8_t* in_;
  uint64_t acc_ = 0;
  unsigned bits_ = 0;
};

// max |x| (NaN if any element is NaN) or the l2 norm, squares in the
// element's compute type summed in double, as BytePS.
template <typename S>
double dithering_scale(const S* x, size_t n, bool l2) {
  if (l2) {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const Compute<S> v = load(x[i]);
      sum += static_cast<double>(v * v);
    }
    return std::sqrt(sum);
  }
  double max = 0.0;
  bool nan = false;
  for (size_t i = 0; i < n; ++i) {
    const double a = std::fabs(static_cast<double>(load(x[i])));
    nan |= a != a;
    max = a > max ? a : max;
  }
  return nan ? NAN : max;
}

// The value dithering_decode gives a field whose code is at most `levels`:
// +-(q * scale / divisor) in float32, a zero level +0.
template <bool kNatural, typename S>
inline S dithering_value(uint32_t field, float scale, float divisor) {
  const uint32_t code = field >> 1;
  const uint32_t q = kNatural ? (uint32_t{1} << code) >> 1 : code;  // natural: 0 or 2^(code-1)
  const float value = static_cast<float>(1 - 2 * static_cast<int>(field & 1)) *
                      (static_cast<float>(q) * scale / divisor);
  // A zero level decodes to +0 even when the scale is Inf or NaN, as
  // BytePS leaves unsent elements at zero.
  return Element<S>::store(half::bits_to_float(half::float_to_bits(value) & (0u - (q != 0))));
}

inline float dithering_divisor(uint32_t levels, bool natural) {
  return static_cast<float>(natural ? uint32_t{1} << (levels - 1) : levels);
}

// Where dithering_encode's fields go: the stream alone...
class FieldWriter {
 public:
  FieldWriter(uint8_t* dst, uint32_t levels) : out_(dst), width_(dithering_field_bits(levels)) {}
  void put(uint32_t field) { out_.put(field, width_); }
  void flush() { out_.flush(); }

 private:
  BitWriter out_;
  unsigned width_;
};

// ... or the stream and error = x - the fields' decoded values, a block of
// elements at a time (error_minus, compress_loops.h) once encode has read
// them, so that error may be x itself. Where fields are at most 10 bits
// wide (all natural ones are), the values come from a table of every field's.
template <bool kNatural, typename S>
class FieldAndErrorWriter {
 public:
  static constexpr unsigned kTableBits = 10;
  static constexpr size_t kBlock = 256;

  FieldAndErrorWriter(const S* x, uint8_t* dst, uint32_t levels, float scale, S* error)
      : fields_(dst, levels), x_(x), error_(error), scale_(scale), divisor_(dithering_divisor(levels, kNatural)) {
    if (dithering_field_bits(levels) <= kTableBits) {
      table_.resize(size_t{1} << dithering_field_bits(levels));
      for (uint32_t field = 0; field < table_.size(); ++field) table_[field] = decoded(field);
    }
  }
  void put(uint32_t field) {
    fields_.put(field);
    block_[filled_] = table_.empty() ? decoded(field) : table_[field];
    if (++filled_ == kBlock) drain();
  }
  void flush() {
    fields_.flush();
    drain();
  }

 private:
  Compute<S> decoded(uint32_t field) const { return load(dithering_value<kNatural, S>(field, scale_, divisor_)); }
  void drain() {
    error_minus(x_ + done_, block_, error_ + done_, filled_);
    done_ += filled_;
    filled_ = 0;
  }

  FieldWriter fields_;
  const S* x_;
  S* error_;
  float scale_;
  float divisor_;
  std::vector<Compute<S>> table_;
  Compute<S> block_[kBlock];
  size_t filled_ = 0;
  size_t done_ = 0;
};

// The fields of x for a scale (see dithering_compress), one draw each, into
// a Writer (FieldWriter or FieldAndErrorWriter) made from `args`, a local
// object so that its state can live in registers.
template <bool kNatural, typename Writer, typename S, typename... Args>
void dithering_encode(const S* x, size_t n, uint32_t levels, double scale, Xorshift128p& rng, Args... args) {
  Writer out(args...);
  if (!(scale > 0.0 && std::isfinite(scale))) {
    // Nothing to normalise by (all zeros, Inf or NaN): every level is 0.
    for (size_t i = 0; i < n; ++i) {
      rng.next();
      out.put(0);
    }
  } else if (!kNatural) {
    const double s = levels;
    const auto top = static_cast<float>(levels);  // exact: levels <= 2^24
    for (size_t i = 0; i < n; ++i) {
      const Compute<S> v = load(x[i]);
      const auto a = static_cast<float>(std::fabs(v));
      const auto u = static_cast<float>((static_cast<double>(a) / scale) * s);
      // floorf(u) for u >= 0, without the libm call that baseline x86-64
      // (no SSE4.1 round) makes of it: floats from 2^23 up are integers.
      const float fl = u < 8388608.0f ? static_cast<float>(static_cast<int32_t>(u)) : u;
      const float q = fl + static_cast<float>(rng.bernoulli(static_cast<double>(u - fl)));  // in [0, +Inf]
      const auto code = static_cast<uint32_t>(std::min(q, top));
      out.put((code << 1) | (static_cast<uint32_t>(code != 0) & std::signbit(v)));
    }
  } else {
    const uint32_t top = uint32_t{1} << (levels - 1);
    for (size_t i = 0; i < n; ++i) {
      const Compute<S> v = load(x[i]);
      const auto a = static_cast<float>(std::fabs(v));
      const double u = (static_cast<double>(a) / scale) * top;
      // Largest power of two below u (0 if u <= 1). Past the top level it is
      // the top level, as BytePS's arithmetic gives just past it; u is capped
      // first so that ceil() fits a uint32 even for an Inf.
      const double capped = std::min(u, top + 1.0);
      const auto whole = static_cast<uint32_t>(capped);  // ceil() below, without a libm call
      const uint32_t fl = round_next_pow2(whole + (static_cast<double>(whole) < capped)) >> 1;
      const uint32_t len = fl ? fl : 1;
      const uint64_t q = std::min<uint64_t>(fl + uint64_t{len} * rng.bernoulli((u - fl) / len), top);
      const uint32_t code = bit_length(q);  // q = 2^(code-1), or 0
      out.put((code << 1) | (static_cast<uint32_t>(code != 0) & std::signbit(v)));
    }
  }
  out.flush();
}

// Quantizes x with one Bernoulli draw per element (n draws whatever the
// data) and writes the fields and the float32 scale. A level that rounding
// pushes past the top one (|x| rounded up to float32 above a float64 scale,
// say) is clamped to the top level, which the field can hold. With `error`
// (which may be x itself), also error_i = x_i - the decoded field, which
// uses the float32 scale as dithering_decompress does.
template <typename S>
void dithering_compress(const S* x, size_t n, uint32_t levels, bool natural, bool l2,
                        Xorshift128p& rng, uint8_t* dst, S* error = nullptr) {
  const double scale = dithering_scale(x, n, l2);
  const auto scale32 = static_cast<float>(scale);
  if (!error) {
    if (natural) {
      dithering_encode<true, FieldWriter>(x, n, levels, scale, rng, dst, levels);
    } else {
      dithering_encode<false, FieldWriter>(x, n, levels, scale, rng, dst, levels);
    }
  } else if (natural) {
    dithering_encode<true, FieldAndErrorWriter<true, S>>(x, n, levels, scale, rng, x, dst, levels, scale32, error);
  } else {
    dithering_encode<false, FieldAndErrorWriter<false, S>>(x, n, levels, scale, rng, x, dst, levels, scale32, error);
  }
  std::memcpy(dst + dithering_stream_bytes(n, levels), &scale32, sizeof(scale32));
}

template <bool kNatural, typename S>
size_t dithering_decode(const uint8_t* src, size_t n, uint32_t levels, S* out, uint32_t* bad_code) {
  const unsigned width = dithering_field_bits(levels);
  float scale;
  std::memcpy(&scale, src + dithering_stream_bytes(n, levels), sizeof(scale));
  const float divisor = dithering_divisor(levels, kNatural);
  BitReader in(src);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t field = in.get(width);
    const uint32_t code = field >> 1;
    if (code > levels) {
      *bad_code = code;
      return i;
    }
    out[i] = dithering_value<kNatural, S>(field, scale, divisor);
  }
  return n;
}

// out_i = +-(q * scale / S) in float32, S = levels (linear) or 2^(levels-1)
// (natural). Returns n, or the index of the first field whose code is above
// `levels` (not produced by dithering_compress with these levels); that
// element and the rest are left unspecified.
template <typename S>
size_t dithering_decompress(const uint8_t* src, size_t n, uint32_t levels, bool natural, S* out,
                            uint32_t* bad_code) {
  return natural ? dithering_decode<true>(src, n, levels, out, bad_code)
                 : dithering_decode<false>(src, n, levels, out, bad_code);
}

}  // namespace compress
}  // namespace byteps
