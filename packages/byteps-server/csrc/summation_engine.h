// The parameter server's summation engine, free of Python.
//
// Each declared key keeps the results of its last two rounds, one per round
// parity: while round r+1 is being summed, round r's result can still be
// pulled. A result leaves when the caller releases it (every worker has
// pulled it) or, at the latest, when round r+2 starts. Sums are written
// into buffers taken from a pool shared by all keys when a round's second
// push arrives and given back once nothing refers to the result any more
// (the engine released it and the last view of it, e.g. a send queued in
// ZeroMQ, is gone), so the server holds about one buffer per round in
// flight rather than two per key. Pushes are summed by the kernels of
// byteps-common, reached through the C function pointers of its
// kernel_table(), so both extensions agree on every rounding without
// sharing a build. Large pushes are split over a persistent thread pool.
//
// The engine touches each pushed byte once. A round's first push is not
// copied anywhere: the engine keeps the pushed buffer (SharedBytes) and, when
// the second push arrives, sums both into the round's buffer in one pass (a
// float32 accumulator for halves). With one worker there is nothing to sum:
// the push itself is the round's result. Pushes flagged zeros are only
// counted, so a round with one push of bytes (a gather's partition, a
// broadcast) also has that push as its result.
//
// Errors are std::invalid_argument (ValueError in Python).

#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "thread_pool.h"

namespace byteps {
namespace server {

constexpr int kKernelAbi = 1;
using AccumulateFn = void (*)(void* acc, const void* src, size_t count, int dtype, int first);
using FinalizeFn = void (*)(void* out, const void* acc, size_t count, int dtype);

// Dtype wire codes (byteps.common.dtypes.DType) and their sizes.
constexpr int kNumDTypes = 6;
constexpr int kFloat16 = 2;
constexpr int kBFloat16 = 3;
inline const char* dtype_name(int dtype) {
  static const char* const names[kNumDTypes] = {"float32", "float64", "float16",
                                                "bfloat16", "int32", "int64"};
  return dtype >= 0 && dtype < kNumDTypes ? names[dtype] : "unknown";
}
inline size_t itemsize(int dtype) {
  static const size_t sizes[kNumDTypes] = {4, 8, 2, 2, 4, 8};
  return sizes[dtype];
}
inline bool is_half(int dtype) { return dtype == kFloat16 || dtype == kBFloat16; }
inline size_t accumulation_itemsize(int dtype) { return is_half(dtype) ? 4 : itemsize(dtype); }

inline void check_dtype(int dtype) {
  if (dtype < 0 || dtype >= kNumDTypes) {
    throw std::invalid_argument("unknown dtype code " + std::to_string(dtype) +
                                ": expected 0..5 (FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, "
                                "INT64)");
  }
}

// Zeroed memory aligned to a cache line (64 bytes), so pool threads' chunks
// never share a line and vector loads stay aligned.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t nbytes) : nbytes_(nbytes) {
    const size_t rounded = (nbytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, rounded);  // also faults the pages in now, not on the first push
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }

 private:
  void* data_;
  size_t nbytes_;
};

// Read-only bytes and the owner that keeps them valid: one of the engine's
// buffers, or a pushed buffer the engine holds on to, whose owner (made by
// the Python binding) releases a buffer export. Dropping the last owner of
// a push may need the GIL, so the engine never drops one itself: push()
// hands those it lets go of back to its caller.
struct SharedBytes {
  std::shared_ptr<const void> owner;
  const void* data = nullptr;
  size_t nbytes = 0;

  explicit operator bool() const { return owner != nullptr; }
};

// Sum buffers by size, reused across keys and rounds: a buffer comes back
// when the last shared_ptr to it is dropped, whichever thread drops it, and
// stays faulted in, so only the first rounds pay page faults. The pool
// never shrinks: it holds as many buffers of a size as were ever in use at
// once. Its lock is a leaf (taken under the engine's, never the reverse).
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  std::shared_ptr<AlignedBuffer> acquire(size_t nbytes) {
    AlignedBuffer* buffer = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& free = free_[nbytes];
      if (free.empty()) {
        allocated_ += nbytes;
      } else {
        buffer = free.back().release();
        free.pop_back();
      }
    }
    if (buffer == nullptr) buffer = new AlignedBuffer(nbytes);
    std::shared_ptr<BufferPool> self = shared_from_this();
    return std::shared_ptr<AlignedBuffer>(buffer, [self](AlignedBuffer* b) { self->give_back(b); });
  }

  // Bytes of the buffers allocated so far (in use or waiting in the pool).
  size_t allocated_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return allocated_;
  }

 private:
  void give_back(AlignedBuffer* buffer) {
    std::unique_ptr<AlignedBuffer> owned(buffer);
    std::lock_guard<std::mutex> lock(mu_);
    free_[buffer->nbytes()].push_back(std::move(owned));
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<std::unique_ptr<AlignedBuffer>>> free_;
  size_t allocated_ = 0;
};

class SummationEngine {
 public:
  // Pushes of at least this many bytes are split over the pool; below it a
  // wake-up would cost more than the loop.
  static constexpr size_t kParallelBytes = 256 * 1024;
  // Bytes of payload per chunk a pool thread takes at a time.
  static constexpr size_t kChunkBytes = 64 * 1024;
  // Elements per L1-resident block where two kernels run back to back over
  // the same data. Measured best here: 512 (2 KiB of float32); 8 KiB blocks
  // ran ~1.5x and 32 KiB ones several times slower.
  static constexpr size_t kBlockElements = 512;
  // Accumulator bytes per block where a round's first two pushes are summed
  // back to back: memory then sees one read of each push and one write of
  // the sum. Measured here on 100 MiB: 4 KiB; 2 KiB ran up to 2x slower
  // (the first kernel is a memmove there), 8 KiB and more 10-30% slower.
  // Halves, whose first kernel widens, run best with kBlockElements, like
  // the finalizing loop.
  static constexpr size_t kPairBlockBytes = 4096;

  SummationEngine(size_t num_threads, int num_workers, AccumulateFn accumulate,
                  FinalizeFn finalize)
      : pool_(num_threads), buffers_(std::make_shared<BufferPool>()), num_workers_(num_workers),
        accumulate_(accumulate), finalize_(finalize) {}

  size_t num_threads() const { return pool_.size(); }
  int num_workers() const { return num_workers_; }
  // Bytes of sum buffers allocated so far: about the rounds in flight at
  // once, not the keys' total.
  size_t sum_bytes() const { return buffers_->allocated_bytes(); }

  // `contributors` pushes complete a round of this key (0: num_workers); a
  // process set's keys are summed over fewer workers than the job has.
  void declare(uint64_t key, size_t nbytes, int dtype, int contributors = 0);

  // Sums one worker's push for `round`; true when it completed the round.
  // The engine may keep `data` (a copy of its owner) past the call: a
  // round's first push until the second arrives, and with one worker until
  // its result is released. Pushes it no longer needs are appended to
  // `released`.
  // `zeros`: `data` is all zeros (a gather's partition a worker has no
  // bytes in, a broadcast's non-root, a joined worker). It is counted, not
  // summed; a round whose pushes but one are zeros has that push as its
  // sum, held like a single worker's, and a round of zeros alone has `data`.
  bool push(uint64_t key, int64_t round, const SharedBytes& data,
            std::vector<SharedBytes>& released, bool zeros = false);

  // Round `round`'s sum; its owner keeps the bytes alive past the engine.
  SharedBytes result(uint64_t key, int64_t round);

  // Drops round `round`'s result now (every worker has it) rather than when
  // round + 2 starts; its buffer goes back to the pool once the last view
  // of it is gone. A round that is not held is ignored. What the engine let
  // go of is appended to `released`, as in push().
  void release(uint64_t key, int64_t round, std::vector<SharedBytes>& released);

  int64_t completed_round(uint64_t key);

  // dst += src in dtype over the whole pool; halves through float32.
  void reduce_into(void* dst, const void* src, size_t nbytes, int dtype);

 private:
  struct KeyState {
    size_t nbytes = 0;
    int dtype = 0;
    // From the pool while a round is summed: the round's sum, and for halves
    // a wider accumulator (other dtypes sum straight into `out`). With one
    // worker neither is taken: results are the pushes themselves.
    std::shared_ptr<AlignedBuffer> acc;
    std::shared_ptr<AlignedBuffer> out;
    SharedBytes result[2];            // finished sum of round out_round[i]: a pool buffer or a push
    int64_t out_round[2] = {-1, -1};  // -1: slot i holds no finished round
    SharedBytes first;                // the round's first push, until the second arrives
    bool first_zeros = false;         // `first` is a zeros push (replaced by the first with bytes)
    bool summed = false;              // out (or acc) holds this round's partial sum
    int64_t completed = -1;
    int pushes = 0;        // pushes received for round completed + 1
    int contributors = 1;  // pushes that complete a round
  };

  KeyState& state(uint64_t key);

  // Lets go of the result held in slot `parity` (if any), appending it to
  // `released`: by release(), or when round r + 2 starts.
  static void drop_result(KeyState& s, int parity, std::vector<SharedBytes>& released);

  // acc = first + second, and out = narrow(acc) too when `finalize`, block
  // by block so that each block of acc is written once and read back while
  // still in cache.
  void sum_pair(KeyState& s, char* acc, char* out, const char* first, const char* second,
                bool finalize);

  // Calls f(begin, end) over chunks of [0, count), on every pool thread, or
  // once on this thread when the work is small. Threads take chunks from a
  // shared counter rather than one fixed slice each, so a thread that the
  // OS (or a hypervisor) delays does not hold up the others. Chunks are
  // multiples of 64 elements: whole cache lines for every dtype.
  template <typename F>
  void parallel_for(size_t count, size_t bytes, const F& f) {
    if (pool_.size() == 1 || bytes < kParallelBytes) {
      f(size_t{0}, count);
      return;
    }
    const size_t chunk = (kChunkBytes * count / bytes + 63) / 64 * 64;
    const size_t chunks = (count + chunk - 1) / chunk;
    std::atomic<size_t> next{0};
    pool_.run([&](size_t) {
      for (size_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
           c = next.fetch_add(1, std::memory_order_relaxed)) {
        const size_t begin = c * chunk;
        f(begin, begin + chunk < count ? begin + chunk : count);
      }
    });
  }

  std::mutex mu_;
  ThreadPool pool_;
  const std::shared_ptr<BufferPool> buffers_;
  const int num_workers_;
  const AccumulateFn accumulate_;
  const FinalizeFn finalize_;
  std::unordered_map<uint64_t, KeyState> keys_;
};

}  // namespace server
}  // namespace byteps
