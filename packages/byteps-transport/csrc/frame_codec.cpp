// Frame header codec for the byteps wire protocol.
//
// Every message on the wire starts with one fixed 40-byte little-endian
// header frame. Encoding and, above all, validating it happens for every
// message a scheduler, server or worker handles, so it lives here: one
// bounds-checked pass over the bytes, and an error that says what was wrong
// (truncated, foreign magic, other protocol version, a payload size that
// lies) before anything is allocated for the payload.
//
// Layout (offsets in bytes):
//    0 u32 magic            "BPS1"
//    4 u16 protocol version
//    6 u16 command
//    8 i32 sender node id
//   12 u32 round
//   16 u64 key
//   24 u64 payload bytes
//   32 u8  dtype code
//   33 u8  flags
//   34 u16 reserved (zero)
//   36 u32 aux
//
// Magic and version sit first and never move, so that a peer of any later
// version can still read them and refuse the connection clearly.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace py = pybind11;

namespace {

constexpr uint32_t kMagic = 0x31535042u;  // bytes "BPS1" read little-endian
constexpr uint16_t kProtocolVersion = 6;  // 2: PUSH_ACK after every accepted PUSH; 3: a PUSH may carry its PULL;
                                          // 4: BARRIER_ARRIVED (a join's arrival counted before its zeros);
                                          // 5: a row-sparse round is one push per machine (its ranks' sum);
                                          // 6: tables held by the servers (FLAG_LOOKUP, held INIT_KEYs)
constexpr size_t kHeaderBytes = 40;

template <typename T>
void store(uint8_t* dst, T value) {
  // The wire is little-endian; so is every host we build for (x86-64,
  // aarch64). A static_assert keeps a big-endian build from compiling.
  static_assert(sizeof(T) <= 8, "scalar");
  std::memcpy(dst, &value, sizeof(T));
}

template <typename T>
T load(const uint8_t* src) {
  T value;
  std::memcpy(&value, src, sizeof(T));
  return value;
}

struct FrameError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ProtocolVersionError : public FrameError {
  using FrameError::FrameError;
};

py::bytes encode(uint16_t command, int32_t sender, uint64_t key,
                 uint32_t round, uint64_t payload_bytes, uint8_t dtype,
                 uint8_t flags, uint32_t aux, uint16_t version) {
  uint8_t buf[kHeaderBytes];
  store<uint32_t>(buf + 0, kMagic);
  store<uint16_t>(buf + 4, version);
  store<uint16_t>(buf + 6, command);
  store<int32_t>(buf + 8, sender);
  store<uint32_t>(buf + 12, round);
  store<uint64_t>(buf + 16, key);
  store<uint64_t>(buf + 24, payload_bytes);
  store<uint8_t>(buf + 32, dtype);
  store<uint8_t>(buf + 33, flags);
  store<uint16_t>(buf + 34, 0);
  store<uint32_t>(buf + 36, aux);
  return py::bytes(reinterpret_cast<const char*>(buf), kHeaderBytes);
}

// Returns (command, sender, key, round, payload_bytes, dtype, flags, aux).
py::tuple decode(py::buffer frame, uint64_t max_payload_bytes) {
  py::buffer_info info = frame.request();
  const size_t size = static_cast<size_t>(info.size * info.itemsize);
  if (size < 6) {
    throw FrameError("truncated frame: " + std::to_string(size) +
                     " bytes, a byteps header has " +
                     std::to_string(kHeaderBytes));
  }
  const auto* p = static_cast<const uint8_t*>(info.ptr);
  const uint32_t magic = load<uint32_t>(p);
  if (magic != kMagic) {
    throw FrameError("bad magic 0x" + [&] {
      char hex[9];
      std::snprintf(hex, sizeof(hex), "%08x", magic);
      return std::string(hex);
    }() + ": the peer is not speaking the byteps protocol");
  }
  const uint16_t version = load<uint16_t>(p + 4);
  if (version != kProtocolVersion) {
    throw ProtocolVersionError(
        "protocol version mismatch: peer speaks byteps wire protocol v" +
        std::to_string(version) + ", this process speaks v" +
        std::to_string(kProtocolVersion) +
        "; install the same byteps-transport version on every node");
  }
  if (size != kHeaderBytes) {
    throw FrameError("malformed header: " + std::to_string(size) +
                     " bytes, expected " + std::to_string(kHeaderBytes));
  }
  if (load<uint16_t>(p + 34) != 0) {
    throw FrameError("malformed header: reserved field is not zero");
  }
  const uint64_t payload_bytes = load<uint64_t>(p + 24);
  if (payload_bytes > max_payload_bytes) {
    throw FrameError("oversized payload: header announces " +
                     std::to_string(payload_bytes) + " bytes, limit is " +
                     std::to_string(max_payload_bytes));
  }
  return py::make_tuple(load<uint16_t>(p + 6), load<int32_t>(p + 8),
                        load<uint64_t>(p + 16), load<uint32_t>(p + 12),
                        payload_bytes, load<uint8_t>(p + 32),
                        load<uint8_t>(p + 33), load<uint32_t>(p + 36));
}

}  // namespace

void add_completion_wait(py::module_& m);  // completion_wait.cpp

PYBIND11_MODULE(_C, m) {
  m.doc() = "byteps wire-frame header codec";
  m.attr("MAGIC") = kMagic;
  m.attr("PROTOCOL_VERSION") = kProtocolVersion;
  m.attr("HEADER_BYTES") = kHeaderBytes;

  auto frame_error =
      py::register_exception<FrameError>(m, "FrameError", PyExc_ValueError);
  py::register_exception<ProtocolVersionError>(m, "ProtocolVersionError",
                                               frame_error.ptr());

  m.def("encode", &encode, py::arg("command"), py::arg("sender"),
        py::arg("key"), py::arg("round"), py::arg("payload_bytes"),
        py::arg("dtype") = 0, py::arg("flags") = 0, py::arg("aux") = 0,
        py::arg("version") = kProtocolVersion,
        "Pack one header frame (40 bytes).");
  m.def("decode", &decode, py::arg("frame"), py::arg("max_payload_bytes"),
        "Validate and unpack one header frame; raises FrameError.");
  add_completion_wait(m);
}

