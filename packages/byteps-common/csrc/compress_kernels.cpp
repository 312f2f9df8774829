// byteps.common._C: the gradient compressors' kernels, BytePS's math over
// our own byte layouts (all little-endian; es = the element's itemsize):
//
//   onebit     ceil(n / (8*es)) words of es bytes, element 8*es*j in the most
//              significant bit of word j (1 = negative), then a float32 scale.
//   topk,      k packed records {uint32 index, value as the element type}:
//   randomk    k * (4 + es) bytes; topk in ascending index order, randomk in
//              draw order.
//   dithering  one field of b = 1 + bit_length(levels) bits per element, field
//              i at stream bits [i*b, (i+1)*b), stream bit t being bit t % 8 of
//              byte t / 8; bit 0 of a field is the sign, bits 1.. the level code
//              (linear: q; natural: 0 or log2(q) + 1). Then a float32 scale.
//
// randomk and dithering draw from a caller-held xorshift128+ state (a uint64
// array [a, b]) that they update in place, so a Python codec keeps BytePS's
// one-generator-per-partition stream across rounds.
//
// Every compress function takes an optional `error` (src's element count,
// writable, sharing no byte with dst, but possibly src itself): error
// feedback's error = src - decompress(dst), written in the compressing pass,
// bit for bit what the decompress function into error followed by numpy's
// np.subtract(src, error, out=error) gives.
//
// Every function validates its buffers (sizes, writability, dtype) with the
// GIL held, then releases it for the loops in compress_loops.h and
// dithering_loops.h.

#include "compress_kernels.h"

#include <pybind11/numpy.h>

#include <cstdint>
#include <optional>
#include <string>

#include "byteps/buffer_arg.h"
#include "compress_loops.h"
#include "dithering_loops.h"
#include "reduce_loops.h"

namespace py = pybind11;
namespace bc = byteps::compress;
using byteps::BufferArg;
using namespace byteps::kernels;

namespace {

const char* const kNames[kNumDTypes] = {"float32", "float64", "float16",
                                        "bfloat16", "int32", "int64"};

// Linear levels must be exact in float32, where BytePS computes them; natural
// levels are powers of two up to 2^30 in a uint32.
constexpr int64_t kMaxLinearLevels = int64_t{1} << 24;
constexpr int64_t kMaxNaturalLevels = 31;
// Sparse records hold uint32 indices.
constexpr size_t kMaxSparseCount = size_t{1} << 32;

int check_dtype(int dtype) {
  if (dtype == kFloat32 || dtype == kFloat64 || dtype == kFloat16) return dtype;
  if (dtype >= 0 && dtype < kNumDTypes) {
    throw py::value_error(std::string("dtype ") + kNames[dtype] + " (code " + std::to_string(dtype) +
                          ") cannot be compressed: the compressors take float16, float32 or float64");
  }
  throw py::value_error("unknown dtype code " + std::to_string(dtype) +
                        ": the compressors take float32 (0), float64 (1) or float16 (2)");
}

size_t itemsize(int dtype) { return dtype == kFloat64 ? 8 : dtype == kFloat32 ? 4 : 2; }

// Calls f with a value of the storage type of a checked dtype.
template <typename F>
void with_type(int dtype, F&& f) {
  switch (dtype) {
    case kFloat32: f(float{}); break;
    case kFloat64: f(double{}); break;
    default: f(uint16_t{}); break;  // float16
  }
}

size_t non_negative(int64_t value, const char* name) {
  if (value < 0) throw py::value_error(std::string(name) + " must be >= 0, got " + std::to_string(value));
  return static_cast<size_t>(value);
}

uint32_t check_levels(int64_t levels, bool natural) {
  const int64_t top = natural ? kMaxNaturalLevels : kMaxLinearLevels;
  if (levels < 1 || levels > top) {
    throw py::value_error("levels must be in 1.." + std::to_string(top) + " for " +
                          (natural ? "natural" : "linear") + " dithering, got " + std::to_string(levels));
  }
  return static_cast<uint32_t>(levels);
}

// The encodings change layout, so no output may share bytes with an input.
void check_disjoint(const BufferArg& a, const BufferArg& b) {
  const auto* pa = static_cast<const char*>(a.data());
  const auto* pb = static_cast<const char*>(b.data());
  if (pa < pb + b.nbytes() && pb < pa + a.nbytes()) {
    throw py::value_error(a.name() + " and " + b.name() + " must not overlap in memory");
  }
}

void check_nbytes(const BufferArg& buf, size_t expected, const std::string& why) {
  if (buf.nbytes() != expected) {
    throw py::value_error(buf.name() + " has " + std::to_string(buf.nbytes()) + " bytes, but " + why +
                          " takes " + std::to_string(expected) + " bytes");
  }
}

std::string elements(size_t n, int dtype) { return std::to_string(n) + " " + kNames[dtype] + " elements"; }

size_t onebit_nbytes(size_t n, int dtype) {
  const size_t es = itemsize(dtype);
  return (n + 8 * es - 1) / (8 * es) * es + 4;
}

size_t sparse_nbytes(size_t k, int dtype) { return k * (bc::kIndexBytes + itemsize(dtype)); }

size_t dithering_nbytes(size_t n, uint32_t levels) {
  if (n > SIZE_MAX / 64) throw py::value_error("count " + std::to_string(n) + " is too large");
  return bc::dithering_stream_bytes(n, levels) + 4;
}

// The caller's generator state [a, b]: read at construction, written back
// by save() (which needs no GIL).
class RngState {
 public:
  explicit RngState(py::handle obj) : buf_(obj, "state", true) {
    if (py::isinstance<py::array>(obj) && !py::dtype::of<uint64_t>().equal(obj.attr("dtype"))) {
      throw py::type_error("state must be a uint64 array [a, b], got dtype " +
                           py::str(obj.attr("dtype")).cast<std::string>());
    }
    if (buf_.nbytes() != 16) {
      throw py::value_error("state must hold two uint64 [a, b] (16 bytes), got " +
                            std::to_string(buf_.nbytes()) + " bytes");
    }
    std::memcpy(&rng.a, buf_.data(), 8);
    std::memcpy(&rng.b, static_cast<char*>(buf_.data()) + 8, 8);
  }
  void save() const {
    std::memcpy(buf_.data(), &rng.a, 8);
    std::memcpy(static_cast<char*>(buf_.data()) + 8, &rng.b, 8);
  }
  const BufferArg& buffer() const { return buf_; }

  bc::Xorshift128p rng{};

 private:
  BufferArg buf_;
};

uint8_t* bytes(const BufferArg& buf) { return static_cast<uint8_t*>(buf.data()); }

// dst and src of the same element count; in place (the very same buffer)
// is allowed only where `same_ok`.
size_t same_count(const BufferArg& dst, const BufferArg& src, int dtype, bool same_ok) {
  const size_t n_dst = dst.count(itemsize(dtype), kNames[dtype]);
  const size_t n_src = src.count(itemsize(dtype), kNames[dtype]);
  if (n_dst != n_src) {
    throw py::value_error(dst.name() + " has " + elements(n_dst, dtype) + " but " + src.name() + " has " +
                          std::to_string(n_src));
  }
  if (!(same_ok && dst.data() == src.data())) check_disjoint(dst, src);
  return n_dst;
}

// A compress function's optional `error` output (None: absent), checked
// against src (same element count; src itself allowed) and the outputs.
class ErrorArg {
 public:
  ErrorArg(py::handle obj, const BufferArg& src, int dtype, const BufferArg& dst, const RngState* state = nullptr) {
    if (obj.is_none()) return;
    const BufferArg& error = buf_.emplace(obj, "error", true);
    same_count(error, src, dtype, true);
    check_disjoint(error, dst);
    if (state) check_disjoint(error, state->buffer());
  }
  // The output as the element type, or nullptr when absent.
  template <typename S>
  S* get() const {
    return buf_ ? static_cast<S*>(buf_->data()) : nullptr;
  }

 private:
  std::optional<BufferArg> buf_;
};

// ---------------------------------------------------------------------------

py::array_t<uint64_t> py_xorshift_next(py::handle state_obj, int64_t count) {
  const size_t n = non_negative(count, "count");
  RngState state(state_obj);
  py::array_t<uint64_t> out(static_cast<py::ssize_t>(n));
  uint64_t* p = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (size_t i = 0; i < n; ++i) p[i] = state.rng.next();
    state.save();
  }
  return out;
}

void py_onebit_compress(py::handle src_obj, py::handle dst_obj, int dtype, bool scaling, py::handle error_obj) {
  check_dtype(dtype);
  BufferArg src(src_obj, "src", false);
  BufferArg dst(dst_obj, "dst", true);
  const size_t n = src.count(itemsize(dtype), kNames[dtype]);
  check_nbytes(dst, onebit_nbytes(n, dtype), "onebit of " + elements(n, dtype));
  check_disjoint(src, dst);
  const ErrorArg error(error_obj, src, dtype, dst);
  py::gil_scoped_release release;
  with_type(dtype, [&](auto tag) {
    using S = decltype(tag);
    bc::onebit_compress(static_cast<const S*>(src.data()), n, bytes(dst), scaling, error.get<S>());
  });
}

void py_onebit_decompress(py::handle src_obj, py::handle dst_obj, int dtype) {
  check_dtype(dtype);
  BufferArg src(src_obj, "src", false);
  BufferArg dst(dst_obj, "dst", true);
  const size_t n = dst.count(itemsize(dtype), kNames[dtype]);
  check_nbytes(src, onebit_nbytes(n, dtype), "onebit of dst's " + elements(n, dtype));
  check_disjoint(src, dst);
  py::gil_scoped_release release;
  with_type(dtype, [&](auto tag) {
    using S = decltype(tag);
    bc::onebit_decompress(bytes(src), n, static_cast<S*>(dst.data()));
  });
}

// src's element count, which uint32 record indices must be able to address.
size_t sparse_source_count(const BufferArg& src, int dtype) {
  const size_t n = src.count(itemsize(dtype), kNames[dtype]);
  if (n > kMaxSparseCount) {
    throw py::value_error("src has " + elements(n, dtype) + "; sparse records index at most 2^32");
  }
  return n;
}

void py_topk_compress(py::handle src_obj, py::handle dst_obj, int dtype, int64_t k, py::handle error_obj) {
  check_dtype(dtype);
  BufferArg src(src_obj, "src", false);
  BufferArg dst(dst_obj, "dst", true);
  const size_t n = sparse_source_count(src, dtype);
  if (k < 1 || static_cast<uint64_t>(k) > n) {
    throw py::value_error("k must be in 1..n = " + std::to_string(n) + " (src's elements), got " +
                          std::to_string(k));
  }
  const auto kk = static_cast<size_t>(k);
  check_nbytes(dst, sparse_nbytes(kk, dtype), std::to_string(k) + " " + kNames[dtype] + " records");
  check_disjoint(src, dst);
  const ErrorArg error(error_obj, src, dtype, dst);
  py::gil_scoped_release release;
  with_type(dtype, [&](auto tag) {
    using S = decltype(tag);
    bc::topk_compress(static_cast<const S*>(src.data()), n, kk, bytes(dst), error.get<S>());
  });
}

void py_randomk_compress(py::handle src_obj, py::handle dst_obj, int dtype, int64_t k,
                         py::handle state_obj, py::handle error_obj) {
  check_dtype(dtype);
  BufferArg src(src_obj, "src", false);
  BufferArg dst(dst_obj, "dst", true);
  RngState state(state_obj);
  const size_t n = sparse_source_count(src, dtype);
  if (n == 0) throw py::value_error("src is empty: randomk needs at least one element to draw");
  if (k < 1) throw py::value_error("k must be >= 1, got " + std::to_string(k));
  const auto kk = static_cast<size_t>(k);
  check_nbytes(dst, sparse_nbytes(kk, dtype), std::to_string(k) + " " + kNames[dtype] + " records");
  check_disjoint(src, dst);
  check_disjoint(state.buffer(), dst);
  const ErrorArg error(error_obj, src, dtype, dst, &state);
  py::gil_scoped_release release;
  with_type(dtype, [&](auto tag) {
    using S = decltype(tag);
    bc::randomk_compress(static_cast<const S*>(src.data()), n, kk, state.rng, bytes(dst), error.get<S>());
  });
  state.save();
}

void py_sparse_decompress(py::handle src_obj, py::handle dst_obj, int dtype) {
  check_dtype(dtype);
  BufferArg src(src_obj, "src", false);
  BufferArg dst(dst_obj, "dst", true);
  const size_t n = dst.count(itemsize(dtype), kNames[dtype]);
  const size_t record = bc::kIndexBytes + itemsize(dtype);
  if (src.nbytes() % record != 0) {
    throw py::value_error("src has " + std::to_string(src.nbytes()) + " bytes, not a whole number of " +
                          std::to_string(record) + "-byte {uint32 index, " + kNames[dtype] + "} records");
  }
  const size_t k = src.nbytes() / record;
  check_disjoint(src, dst);
  size_t bad = k;
  uint32_t index = 0;
  {
    py::gil_scoped_release release;
    with_type(dtype, [&](auto tag) {
      using S = decltype(tag);
      bad = bc::first_bad_record<S>(bytes(src), k, n, &index);
      if (bad == k) bc::sparse_decompress(bytes(src), k, n, static_cast<S*>(dst.data()));
    });
  }
  if (bad != k) {
    throw py::value_error("src record " + std::to_string(bad) + " has index " + std::to_string(index) +
                          ", outside dst's " + elements(n, dtype) + " (dst left unchanged)");
  }
}

void py_dithering_compress(py::handle src_obj, py::handle dst_obj, int dtype, int64_t levels,
                           bool natural, bool l2, py::handle state_obj, py::handle error_obj) {
  check_dtype(dtype);
  const uint32_t s = check_levels(levels, natural);
  BufferArg src(src_obj, "src", false);
  BufferArg dst(dst_obj, "dst", true);
  RngState state(state_obj);
  const size_t n = src.count(itemsize(dtype), kNames[dtype]);
  check_nbytes(dst, dithering_nbytes(n, s), "dithering of " + elements(n, dtype));
  check_disjoint(src, dst);
  check_disjoint(state.buffer(), dst);
  const ErrorArg error(error_obj, src, dtype, dst, &state);
  py::gil_scoped_release release;
  with_type(dtype, [&](auto tag) {
    using S = decltype(tag);
    bc::dithering_compress(static_cast<const S*>(src.data()), n, s, natural, l2, state.rng, bytes(dst),
                           error.get<S>());
  });
  state.save();
}

void py_dithering_decompress(py::handle src_obj, py::handle dst_obj, int dtype, int64_t levels,
                             bool natural) {
  check_dtype(dtype);
  const uint32_t s = check_levels(levels, natural);
  BufferArg src(src_obj, "src", false);
  BufferArg dst(dst_obj, "dst", true);
  const size_t n = dst.count(itemsize(dtype), kNames[dtype]);
  check_nbytes(src, dithering_nbytes(n, s), "dithering of dst's " + elements(n, dtype));
  check_disjoint(src, dst);
  size_t decoded = n;
  uint32_t code = 0;
  {
    py::gil_scoped_release release;
    with_type(dtype, [&](auto tag) {
      using S = decltype(tag);
      decoded = bc::dithering_decompress(bytes(src), n, s, natural, static_cast<S*>(dst.data()), &code);
    });
  }
  if (decoded != n) {
    throw py::value_error("src element " + std::to_string(decoded) + " has level code " + std::to_string(code) +
                          " above levels = " + std::to_string(s) + ": not a dithering encoding with these levels");
  }
}

void py_axpy(py::handle dst_obj, py::handle src_obj, int dtype, float alpha) {
  check_dtype(dtype);
  BufferArg dst(dst_obj, "dst", true);
  BufferArg src(src_obj, "src", false);
  const size_t n = same_count(dst, src, dtype, true);
  py::gil_scoped_release release;
  with_type(dtype, [&](auto tag) {
    using S = decltype(tag);
    bc::axpy(static_cast<S*>(dst.data()), static_cast<const S*>(src.data()), n, alpha);
  });
}

void py_nesterov(py::handle grad_obj, py::handle momentum_obj, int dtype, float mu) {
  check_dtype(dtype);
  BufferArg grad(grad_obj, "grad", true);
  BufferArg momentum(momentum_obj, "momentum", true);
  const size_t n = same_count(grad, momentum, dtype, false);
  py::gil_scoped_release release;
  with_type(dtype, [&](auto tag) {
    using S = decltype(tag);
    bc::nesterov(static_cast<S*>(grad.data()), static_cast<S*>(momentum.data()), n, mu);
  });
}

}  // namespace

namespace byteps {

void register_compression(py::module_& m) {
#define ERROR_DOC                                                                                  \
  " With error (src's element count; src itself allowed), also error = src - decompress(dst) "   \
  "in the same pass, as decompressing into error and np.subtract(src, error, out=error) would."
  m.def("xorshift_next", &py_xorshift_next, py::arg("state"), py::arg("count"),
        "The next count outputs (uint64 array) of BytePS's xorshift128+ from state [a, b], "
        "updated in place. Seed as state = [seed, seed].");
  m.def("onebit_compressed_nbytes",
        [](int64_t count, int dtype) { return onebit_nbytes(non_negative(count, "count"), check_dtype(dtype)); },
        py::arg("count"), py::arg("dtype"),
        "ceil(count / (8*itemsize)) * itemsize + 4: onebit's sign words and float32 scale.");
  m.def("onebit_compress", &py_onebit_compress, py::arg("src"), py::arg("dst"), py::arg("dtype"),
        py::arg("scaling"), py::arg("error") = py::none(),
        "dst = sign bits of src (1 where x < 0), most significant first, then the float32 scale: "
        "1.0, or mean |x| with scaling." ERROR_DOC);
  m.def("onebit_decompress", &py_onebit_decompress, py::arg("src"), py::arg("dst"), py::arg("dtype"),
        "dst[i] = -scale where bit i is set, else +scale.");
  m.def("sparse_compressed_nbytes",
        [](int64_t k, int dtype) { return sparse_nbytes(non_negative(k, "k"), check_dtype(dtype)); },
        py::arg("k"), py::arg("dtype"), "k * (4 + itemsize): k {uint32 index, value} records.");
  m.def("topk_compress", &py_topk_compress, py::arg("src"), py::arg("dst"), py::arg("dtype"), py::arg("k"),
        py::arg("error") = py::none(),
        "dst = records of the k elements of largest |x| (ties: lower index; NaN first), by index." ERROR_DOC);
  m.def("randomk_compress", &py_randomk_compress, py::arg("src"), py::arg("dst"), py::arg("dtype"),
        py::arg("k"), py::arg("state"), py::arg("error") = py::none(),
        "dst = records of k elements drawn with replacement (index = next() % n), in draw order." ERROR_DOC);
  m.def("sparse_decompress", &py_sparse_decompress, py::arg("src"), py::arg("dst"), py::arg("dtype"),
        "dst = 0, then dst[index] = value for each record of src in order.");
  m.def("dithering_compressed_nbytes",
        [](int64_t count, int64_t levels) {
          return dithering_nbytes(non_negative(count, "count"), check_levels(levels, false));
        },
        py::arg("count"), py::arg("levels"),
        "ceil(count * (1 + bit_length(levels)) / 8) + 4: one field per element and a float32 scale.");
  m.def("dithering_compress", &py_dithering_compress, py::arg("src"), py::arg("dst"), py::arg("dtype"),
        py::arg("levels"), py::arg("natural"), py::arg("l2"), py::arg("state"), py::arg("error") = py::none(),
        "dst = src stochastically rounded to levels of max |x| (or the l2 norm), one draw per element."
        ERROR_DOC);
  m.def("dithering_decompress", &py_dithering_decompress, py::arg("src"), py::arg("dst"), py::arg("dtype"),
        py::arg("levels"), py::arg("natural"),
        "dst[i] = +-(q * scale / S) in float32, S = levels (linear) or 2^(levels-1) (natural).");
  m.def("axpy", &py_axpy, py::arg("dst"), py::arg("src"), py::arg("dtype"), py::arg("alpha"),
        "dst += float32(alpha) * src elementwise (float16 through float32; float64 in double).");
  m.def("nesterov", &py_nesterov, py::arg("grad"), py::arg("momentum"), py::arg("dtype"), py::arg("mu"),
        "momentum = grad + mu*momentum; grad = grad + mu*momentum, in place (mu a float32).");
#undef ERROR_DOC
}

}  // namespace byteps
