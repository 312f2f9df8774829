// byteps.server._C: ServerEngine, the parameter server's summation hot path.
//
// Python receives pushes from the network and hands each frame to the
// engine, which keeps a round's first frame (a buffer export holding it
// alive) and sums it with the second in one pass, with the GIL released, on
// a persistent pool for large buffers; later pushes accumulate, and the
// round is finalized once every worker has pushed. With one worker the
// frame is the result. See summation_engine.h for the buffer scheme.

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "byteps/buffer_arg.h"
#include "summation_engine.h"

namespace py = pybind11;

namespace byteps {
namespace server {

namespace {

std::string pair_str(size_t nbytes, int dtype) {
  return "(nbytes=" + std::to_string(nbytes) + ", dtype=" + dtype_name(dtype) + ")";
}

}  // namespace

SummationEngine::KeyState& SummationEngine::state(uint64_t key) {
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    throw std::invalid_argument("key " + std::to_string(key) +
                                " is not declared; call declare(key, nbytes, dtype) first");
  }
  return it->second;
}

void SummationEngine::declare(uint64_t key, size_t nbytes, int dtype, int contributors) {
  check_dtype(dtype);
  if (contributors == 0) contributors = num_workers_;
  if (contributors < 1 || contributors > num_workers_) {
    throw std::invalid_argument("key " + std::to_string(key) + ": " + std::to_string(contributors) +
                                " contributors, but the engine sums for 1.." +
                                std::to_string(num_workers_) + " workers");
  }
  if (nbytes == 0 || nbytes % itemsize(dtype) != 0) {
    throw std::invalid_argument("key " + std::to_string(key) + ": nbytes " +
                                std::to_string(nbytes) + " must be a positive multiple of the " +
                                dtype_name(dtype) + " itemsize " +
                                std::to_string(itemsize(dtype)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = keys_.find(key);
  if (it != keys_.end()) {
    const KeyState& s = it->second;
    if (s.nbytes == nbytes && s.dtype == dtype && s.contributors == contributors) return;
    throw std::invalid_argument("key " + std::to_string(key) + " is already declared as " +
                                pair_str(s.nbytes, s.dtype) + ", cannot redeclare it as " +
                                pair_str(nbytes, dtype));
  }
  KeyState s;
  s.nbytes = nbytes;
  s.dtype = dtype;
  s.contributors = contributors;
  keys_.emplace(key, std::move(s));
}

bool SummationEngine::push(uint64_t key, int64_t round, const SharedBytes& data,
                           std::vector<SharedBytes>& released, bool zeros) {
  std::lock_guard<std::mutex> lock(mu_);
  KeyState& s = state(key);
  if (data.nbytes != s.nbytes) {
    throw std::invalid_argument("push for key " + std::to_string(key) + " has " +
                                std::to_string(data.nbytes) +
                                " bytes, but the key is declared with " +
                                std::to_string(s.nbytes) + " bytes");
  }
  const int64_t expected = s.completed + 1;
  if (round != expected) {
    throw std::invalid_argument("push for key " + std::to_string(key) + " round " +
                                std::to_string(round) + ", but the key is accumulating round " +
                                std::to_string(expected) + " (completed_round " +
                                std::to_string(s.completed) + ")");
  }
  const int parity = static_cast<int>(round & 1);
  if (s.pushes == 0) {
    // Round - 2's result leaves now if it was not released yet, so that at
    // most two rounds are held per key.
    drop_result(s, parity, released);
    s.summed = false;
    if (s.contributors == 1) {
      // The sum of one push is the push, bit for bit, halves included.
      s.result[parity] = data;
      s.out_round[parity] = round;
      s.completed = round;
      return true;
    }
  }

  const bool half = is_half(s.dtype);
  bool finalized = false;
  if (zeros) {
    // Adds nothing: only counted. Held as the round's first push when no
    // other comes, so that a round of zeros alone has zeros as its sum.
    if (!s.first && !s.summed) {
      s.first = data;
      s.first_zeros = true;
    }
  } else if (!s.summed && (!s.first || s.first_zeros)) {
    // The round's first push with bytes in it is held, not copied.
    if (s.first) released.push_back(std::exchange(s.first, SharedBytes{}));
    s.first = data;
    s.first_zeros = false;
  } else {
    const auto* src = static_cast<const char*>(data.data);
    if (!s.summed) {  // the round's second push with bytes: its sum needs a buffer now
      s.out = buffers_->acquire(s.nbytes);
      if (half) {
        s.acc = buffers_->acquire(s.nbytes / itemsize(s.dtype) * accumulation_itemsize(s.dtype));
      }
    }
    char* out = static_cast<char*>(s.out->data());
    char* acc = half ? static_cast<char*>(s.acc->data()) : out;
    // The round's last push into a wider accumulator finalizes block by block,
    // while each block is still in L1, instead of re-reading the whole
    // accumulator from memory afterwards.
    finalized = s.pushes + 1 == s.contributors && half;
    if (!s.summed) {
      sum_pair(s, acc, out, static_cast<const char*>(s.first.data), src, finalized);
      released.push_back(std::exchange(s.first, SharedBytes{}));
      s.summed = true;
    } else {
      const size_t isz = itemsize(s.dtype);
      const size_t acc_isz = accumulation_itemsize(s.dtype);
      const int dtype = s.dtype;
      parallel_for(s.nbytes / isz, s.nbytes, [&](size_t begin, size_t end) {
        if (!finalized) {
          accumulate_(acc + begin * acc_isz, src + begin * isz, end - begin, dtype, 0);
          return;
        }
        for (size_t i = begin; i < end; i += kBlockElements) {
          const size_t n = std::min(kBlockElements, end - i);
          accumulate_(acc + i * acc_isz, src + i * isz, n, dtype, 0);
          finalize_(out + i * isz, acc + i * acc_isz, n, dtype);
        }
      });
    }
  }
  ++s.pushes;
  if (s.pushes < s.contributors) return false;

  if (s.summed) {
    char* out = static_cast<char*>(s.out->data());
    if (half && !finalized) {  // the round ended with zeros: narrow the accumulator now
      const char* acc = static_cast<const char*>(s.acc->data());
      const size_t isz = itemsize(s.dtype);
      const size_t acc_isz = accumulation_itemsize(s.dtype);
      const int dtype = s.dtype;
      parallel_for(s.nbytes / isz, s.nbytes, [&](size_t begin, size_t end) {
        finalize_(out + begin * isz, acc + begin * acc_isz, end - begin, dtype);
      });
    }
    s.acc.reset();  // scratch: straight back to the pool
    s.result[parity] = SharedBytes{std::move(s.out), out, s.nbytes};
  } else {
    // One push had bytes (or none did): it is the sum, bit for bit, as with one worker.
    s.result[parity] = std::exchange(s.first, SharedBytes{});
  }
  s.out_round[parity] = round;
  s.completed = round;
  s.pushes = 0;
  return true;
}

void SummationEngine::sum_pair(KeyState& s, char* acc, char* out, const char* first,
                               const char* second, bool finalize) {
  const size_t isz = itemsize(s.dtype);
  const size_t acc_isz = accumulation_itemsize(s.dtype);
  const int dtype = s.dtype;
  const size_t block = is_half(dtype) ? kBlockElements : kPairBlockBytes / acc_isz;
  parallel_for(s.nbytes / isz, s.nbytes, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i += block) {
      const size_t n = std::min(block, end - i);
      char* a = acc + i * acc_isz;
      accumulate_(a, first + i * isz, n, dtype, 1);
      accumulate_(a, second + i * isz, n, dtype, 0);
      if (finalize) finalize_(out + i * isz, a, n, dtype);
    }
  });
}

SharedBytes SummationEngine::result(uint64_t key, int64_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  KeyState& s = state(key);
  if (round < 0 || round > s.completed) {
    throw std::invalid_argument("round " + std::to_string(round) + " of key " +
                                std::to_string(key) + " is not completed (completed_round " +
                                std::to_string(s.completed) + ")");
  }
  const int parity = static_cast<int>(round & 1);
  if (s.out_round[parity] != round) {
    throw std::invalid_argument("round " + std::to_string(round) + " of key " +
                                std::to_string(key) +
                                " is no longer held: it was released, or round r + 2 started "
                                "(only the last two completed rounds are kept; completed_round " +
                                std::to_string(s.completed) + ")");
  }
  return s.result[parity];
}

void SummationEngine::release(uint64_t key, int64_t round, std::vector<SharedBytes>& released) {
  std::lock_guard<std::mutex> lock(mu_);
  KeyState& s = state(key);
  const int parity = static_cast<int>(round & 1);
  if (round >= 0 && s.out_round[parity] == round) drop_result(s, parity, released);
}

void SummationEngine::drop_result(KeyState& s, int parity, std::vector<SharedBytes>& released) {
  s.out_round[parity] = -1;
  if (s.result[parity]) released.push_back(std::exchange(s.result[parity], SharedBytes{}));
}

int64_t SummationEngine::completed_round(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  return state(key).completed;
}

void SummationEngine::reduce_into(void* dst, const void* src, size_t nbytes, int dtype) {
  check_dtype(dtype);
  const size_t count = nbytes / itemsize(dtype);
  std::lock_guard<std::mutex> lock(mu_);
  if (!is_half(dtype)) {
    // With the accumulation type equal to dtype, accumulate is dst += src.
    parallel_for(count, nbytes, [&](size_t begin, size_t end) {
      const size_t isz = itemsize(dtype);
      accumulate_(static_cast<char*>(dst) + begin * isz,
                  static_cast<const char*>(src) + begin * isz, end - begin, dtype, 0);
    });
    return;
  }
  // Halves: widen both into a float32 block that stays in L1, add, round
  // back once, block by block; the same arithmetic as common's sum_into,
  // through the two entry points of kernel ABI 1.
  parallel_for(count, nbytes, [&](size_t begin, size_t end) {
    constexpr size_t kBlock = kBlockElements;
    alignas(64) float block[kBlock];
    auto* d = static_cast<uint16_t*>(dst);
    const auto* s = static_cast<const uint16_t*>(src);
    for (size_t i = begin; i < end; i += kBlock) {
      const size_t n = std::min(kBlock, end - i);
      accumulate_(block, d + i, n, dtype, 1);
      accumulate_(block, s + i, n, dtype, 0);
      finalize_(d + i, block, n, dtype);
    }
  });
}

namespace {

// What result() hands out: memoryview's exporter, holding the bytes' owner
// (an engine buffer or a held push), so a view stays valid after the engine
// (or its Python object) is gone.
struct ResultBuffer {
  SharedBytes bytes;
};

uintptr_t table_address(const py::dict& table, const char* name) {
  if (!table.contains(name)) {
    throw py::value_error(std::string("kernel_table has no '") + name +
                          "' entry; pass byteps.common._C.kernel_table()");
  }
  const auto address = table[name].cast<uintptr_t>();
  if (address == 0) throw py::value_error(std::string("kernel_table['") + name + "'] is null");
  return address;
}

std::unique_ptr<SummationEngine> make_engine(int num_threads, int num_workers,
                                             const py::dict& table) {
  if (num_threads < 1 || num_threads > 1024) {
    throw py::value_error("num_threads must be in 1..1024, got " + std::to_string(num_threads));
  }
  if (num_workers < 1) {
    throw py::value_error("num_workers must be at least 1, got " + std::to_string(num_workers));
  }
  if (!table.contains("abi")) {
    throw py::value_error("kernel_table has no 'abi' entry; pass byteps.common._C.kernel_table()");
  }
  const int abi = table["abi"].cast<int>();
  if (abi != kKernelAbi) {
    throw py::value_error("kernel table ABI " + std::to_string(abi) +
                          " is not supported: this byteps-server engine needs kernel ABI " +
                          std::to_string(kKernelAbi) +
                          "; install byteps-common and byteps-server versions that match");
  }
  auto accumulate = reinterpret_cast<AccumulateFn>(table_address(table, "accumulate"));
  auto finalize = reinterpret_cast<FinalizeFn>(table_address(table, "finalize"));
  return std::make_unique<SummationEngine>(static_cast<size_t>(num_threads), num_workers,
                                           accumulate, finalize);
}

bool py_push(SummationEngine& engine, uint64_t key, int64_t round, py::handle data, bool zeros) {
  const std::shared_ptr<const Py_buffer> view = hold_buffer(data, "data");
  const SharedBytes push{view, view->buf, static_cast<size_t>(view->len)};
  // Declared before the GIL is released, so destroyed after it is taken
  // back: releasing a buffer export needs the GIL. Reserved, so that the
  // engine's push_back cannot fail with a push in hand.
  std::vector<SharedBytes> released;
  released.reserve(2);
  py::gil_scoped_release release;
  return engine.push(key, round, push, released, zeros);
}

void py_release(SummationEngine& engine, uint64_t key, int64_t round) {
  std::vector<SharedBytes> released;  // dropped with the GIL held, as in py_push
  released.reserve(1);
  py::gil_scoped_release release;
  engine.release(key, round, released);
}

py::memoryview py_result(SummationEngine& engine, uint64_t key, int64_t round) {
  SharedBytes bytes;
  {
    py::gil_scoped_release release;
    bytes = engine.result(key, round);
  }
  return py::memoryview(py::cast(ResultBuffer{std::move(bytes)}));
}

void py_reduce_into(SummationEngine& engine, py::handle dst_obj, py::handle src_obj, int dtype) {
  check_dtype(dtype);
  BufferArg dst(dst_obj, "dst", true);
  BufferArg src(src_obj, "src", false);
  const size_t isz = itemsize(dtype);
  if (dst.nbytes() % isz != 0 || dst.nbytes() != src.nbytes()) {
    throw py::value_error("dst has " + std::to_string(dst.nbytes()) + " bytes and src has " +
                          std::to_string(src.nbytes()) + " bytes; they must be equal and a " +
                          "multiple of the " + dtype_name(dtype) + " itemsize " +
                          std::to_string(isz));
  }
  const auto* d = static_cast<const char*>(dst.data());
  const auto* s = static_cast<const char*>(src.data());
  if (d != s && d < s + src.nbytes() && s < d + dst.nbytes()) {
    throw py::value_error("dst and src overlap in memory without being the same buffer");
  }
  py::gil_scoped_release release;
  engine.reduce_into(dst.data(), src.data(), dst.nbytes(), dtype);
}

}  // namespace
}  // namespace server
}  // namespace byteps

using byteps::server::SummationEngine;

PYBIND11_MODULE(_C, m) {
  using namespace byteps::server;
  m.doc() = "byteps parameter-server summation engine";
  m.attr("KERNEL_ABI") = kKernelAbi;
  m.attr("PARALLEL_BYTES") = SummationEngine::kParallelBytes;

  py::class_<ResultBuffer>(m, "_ResultBuffer", py::buffer_protocol())
      .def_buffer([](ResultBuffer& r) {
        return py::buffer_info(const_cast<void*>(r.bytes.data), 1, "B", 1,
                               {static_cast<py::ssize_t>(r.bytes.nbytes)}, {1},
                               /*readonly=*/true);
      });

  py::class_<SummationEngine>(m, "ServerEngine", R"doc(
Per-key summation store, sum-buffer pool and thread pool of a byteps server.

    engine = ServerEngine(num_threads=4, num_workers=2,
                          kernel_table=byteps.common._C.kernel_table())
    engine.declare(key, nbytes, DType.FLOAT16)
    engine.push(key, 0, frame_from_worker_0)       # False
    if engine.push(key, 0, frame_from_worker_1):   # True: round 0 complete
        reply(engine.result(key, 0))               # read-only memoryview
    engine.release(key, 0)                         # once every worker has it
)doc")
      .def(py::init(&make_engine), py::arg("num_threads"), py::arg("num_workers"),
           py::arg("kernel_table"))
      .def_property_readonly("num_threads", &SummationEngine::num_threads)
      .def_property_readonly("num_workers", &SummationEngine::num_workers)
      .def_property_readonly("sum_bytes", &SummationEngine::sum_bytes,
                             "Bytes of sum buffers allocated so far (the pool's size).")
      .def("declare",
           [](SummationEngine& e, uint64_t key, size_t nbytes, int dtype, int contributors) {
             py::gil_scoped_release release;
             e.declare(key, nbytes, dtype, contributors);
           },
           py::arg("key"), py::arg("nbytes"), py::arg("dtype"), py::arg("contributors") = 0,
           "Declare a key (sum buffers come from the pool as rounds are summed); idempotent "
           "for the same (nbytes, dtype, contributors). `contributors` pushes complete a "
           "round (0: num_workers).")
      .def("push", &py_push, py::arg("key"), py::arg("round"), py::arg("data"),
           py::arg("zeros") = false,
           "Sum one worker's push (the engine may keep a reference to it); True when it "
           "was the round's last. zeros=True: `data` is all zeros and is only counted "
           "(kept as the sum when no push of the round has other bytes).")
      .def("result", &py_result, py::arg("key"), py::arg("round"),
           "Read-only memoryview of a completed round's sum (last two rounds kept).")
      .def("release", &py_release, py::arg("key"), py::arg("round"),
           "Drop a completed round's result now (every worker has it); its buffer returns to "
           "the pool once no view of it is left. A round not held is ignored.")
      .def("completed_round",
           [](SummationEngine& e, uint64_t key) {
             py::gil_scoped_release release;
             return e.completed_round(key);
           },
           py::arg("key"), "Last completed round of key, -1 before the first.")
      .def("reduce_into", &py_reduce_into, py::arg("dst"), py::arg("src"), py::arg("dtype"),
           "dst += src in dtype, split over the pool.");
}
