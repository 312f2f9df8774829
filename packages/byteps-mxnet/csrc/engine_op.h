// A push_pull's passage through MXNet's dependency engine, through MXNet's C API only.
//
// push() puts two operations on the engine, both reading the input arrays
// and writing the output arrays (plus a per-name token array, so that ops of
// one name run in the order they were issued):
//
//   1. the ready op (FnProperty::kNormal) runs once every earlier write to
//      the inputs and every earlier read or write of the outputs is done. It
//      takes each array's DLManagedTensor (MXNDArrayToDLPack, which does not
//      wait: waiting here would wait on ourselves; and only now is the
//      memory of a lazily allocated output certain), queues the EngineOp on
//      the ReadyQueue and returns at once;
//   2. the end op (FnProperty::kCPUPrioritized, on MXNet's CPU priority
//      threads) waits until finish() is called and throws the op's error, if
//      any, which MXNet then raises from whatever reads an output.
//
// Between the two, Python's submitter thread pops the op, hands the arrays'
// bytes to byteps-common, and calls finish() from the push_pull's
// done-callback. Later MXNet operations on the arrays wait for the end op, so
// the result is visible to them in order, and the calling thread never
// blocks. The ready op never blocks, so it cannot starve the engine threads
// that compute the inputs of other ranks' push_pulls.
//
// libmxnet is not linked: Python looks up the C functions in the libmxnet
// that mxnet loaded and passes their addresses to bind_mxnet().

#pragma once

#include <pybind11/pybind11.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dlpack_view.h"

namespace byteps_mxnet {

class EngineOp {
 public:
  EngineOp(uint64_t id, std::string name, std::vector<void*> arrays)
      : id_(id), name_(std::move(name)), arrays_(std::move(arrays)) {}
  ~EngineOp();
  EngineOp(const EngineOp&) = delete;
  EngineOp& operator=(const EngineOp&) = delete;

  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }

  // On the engine thread (ready op): take every array's DLManagedTensor.
  void acquire_tensors();
  // Under the GIL: the arrays' bytes as (memoryview, dtype code, shape), inputs first.
  pybind11::list views();

  // Complete the op; the end op returns, or throws `error` into MXNet if not empty. Idempotent.
  void finish(const std::string& error);
  // Wait for finish(); false on timeout (negative: no limit). Call without the GIL.
  bool wait(double timeout_s);
  bool done();
  std::string error();

 private:
  const uint64_t id_;
  const std::string name_;
  const std::vector<void*> arrays_;  // NDArrayHandles; Python keeps them alive until views()
  std::vector<DLManagedTensor*> tensors_;
  std::string acquire_error_;

  std::mutex mutex_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
  std::string error_;
};

// Ops whose arrays are ready, waiting for Python's submitter thread.
class ReadyQueue {
 public:
  static ReadyQueue& instance();
  // On the engine thread: take the op's tensors and queue it, or fail it if
  // closed. Under the queue's lock, so that once close() has returned no
  // op touches its NDArrayHandles again and Python may let them go.
  void accept(std::shared_ptr<EngineOp> op);
  // Next ready op; nullptr on timeout or once closed. Call without the GIL.
  std::shared_ptr<EngineOp> pop(double timeout_s);
  // Fail every queued op and every later one; wake pop().
  void close(const std::string& reason);
  void open();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<EngineOp>> ops_;
  bool closed_ = true;
  std::string reason_;
};

void register_engine_op(pybind11::module_& m);

}  // namespace byteps_mxnet
