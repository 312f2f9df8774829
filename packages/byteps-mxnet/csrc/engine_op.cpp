// See engine_op.h.

#include "engine_op.h"

#include <chrono>
#include <stdexcept>
#include <utility>

namespace py = pybind11;

namespace byteps_mxnet {
namespace {

// Signatures from MXNet's include/mxnet/c_api.h (stable C ABI since 1.6).
using EngineSyncFunc = void (*)(void* run_context, void* param);
using ParamDeleter = void (*)(void* param);
using ToDLPackFn = int (*)(void* ndarray, DLManagedTensor** out);
using PushSyncNDFn = int (*)(EngineSyncFunc fn, void* param, ParamDeleter deleter, const void* context,
                             void** const_nds, int num_const, void** mutable_nds, int num_mutable,
                             const void* property, int priority, const char* name);
using LastErrorFn = const char* (*)();

struct MXNetAPI {
  ToDLPackFn to_dlpack = nullptr;
  PushSyncNDFn push_sync_nd = nullptr;
  LastErrorFn last_error = nullptr;
};
MXNetAPI api;

// mxnet::Context {DeviceType dev_type; int32_t dev_id;} for cpu(0), and
// mxnet::FnProperty values (an int-sized enum class).
struct CPUContext {
  int32_t dev_type = 1;
  int32_t dev_id = 0;
};
const CPUContext kCPU0;
const int kNormal = 0;
const int kCPUPrioritized = 3;

std::mutex push_mutex;  // our two pushes of one op are adjacent in every variable's queue

std::string last_error() {
  const char* text = api.last_error != nullptr ? api.last_error() : nullptr;
  return text != nullptr ? std::string(text) : std::string("unknown MXNet error");
}

void delete_param(void* param) { delete static_cast<std::shared_ptr<EngineOp>*>(param); }

void ready_fn(void* /*run_context*/, void* param) {
  ReadyQueue::instance().accept(*static_cast<std::shared_ptr<EngineOp>*>(param));
}

void end_fn(void* /*run_context*/, void* param) {
  const std::shared_ptr<EngineOp>& op = *static_cast<std::shared_ptr<EngineOp>*>(param);
  op->wait(-1.0);
  const std::string error = op->error();
  // MXNet's engine catches std::exception, marks the op's output variables
  // and rethrows from the next wait on them (wait_to_read, asnumpy, ...).
  if (!error.empty()) throw std::runtime_error(error);
}

void check_bound() {
  if (api.to_dlpack == nullptr || api.push_sync_nd == nullptr || api.last_error == nullptr) {
    throw std::runtime_error("byteps.mxnet._C: bind_mxnet() was not called (import byteps.mxnet first)");
  }
}

std::vector<void*> handles(const py::sequence& seq) {
  std::vector<void*> out;
  out.reserve(seq.size());
  for (py::handle item : seq) out.push_back(reinterpret_cast<void*>(item.cast<uintptr_t>()));
  return out;
}

// MXNet's return code: 0, or -1 with the error in MXGetLastError (which a
// NaiveEngine, running both ops right here, sets to the push_pull's failure).
int push(uint64_t id, const py::sequence& reads, const py::sequence& writes, const py::sequence& tokens,
         int priority, const std::string& name) {
  check_bound();
  std::vector<void*> const_nds = handles(reads);
  std::vector<void*> mutable_nds = handles(writes);
  std::vector<void*> arrays = const_nds;
  arrays.insert(arrays.end(), mutable_nds.begin(), mutable_nds.end());
  for (void* token : handles(tokens)) mutable_nds.push_back(token);
  auto op = std::make_shared<EngineOp>(id, name, std::move(arrays));

  // Without the GIL: a NaiveEngine runs the ops right here, and the end op
  // then waits for the submitter thread, which needs the GIL.
  py::gil_scoped_release no_gil;
  std::lock_guard<std::mutex> lock(push_mutex);
  const auto push_one = [&](EngineSyncFunc fn, const int* property, const char* opr_name) {
    return api.push_sync_nd(fn, new std::shared_ptr<EngineOp>(op), delete_param, &kCPU0, const_nds.data(),
                            static_cast<int>(const_nds.size()), mutable_nds.data(),
                            static_cast<int>(mutable_nds.size()), property, priority, opr_name);
  };
  int rc = push_one(ready_fn, &kNormal, "BytePSPushPullReady");
  if (rc == 0) rc = push_one(end_fn, &kCPUPrioritized, "BytePSPushPull");
  // If MXNet refused an op, the ready op may still have queued it: let the submitter drop it.
  if (rc != 0) op->finish("MXNet refused the push_pull of '" + name + "'");
  return rc;
}

}  // namespace

EngineOp::~EngineOp() {
  for (DLManagedTensor* tensor : tensors_) release(tensor);
}

void EngineOp::acquire_tensors() {
  for (void* array : arrays_) {
    DLManagedTensor* tensor = nullptr;
    if (api.to_dlpack(array, &tensor) != 0 || tensor == nullptr) {
      acquire_error_ = "MXNDArrayToDLPack failed: " + last_error();
      return;
    }
    tensors_.push_back(tensor);
  }
}

py::list EngineOp::views() {
  if (!acquire_error_.empty()) throw std::runtime_error(acquire_error_);
  py::list out;
  for (DLManagedTensor*& tensor : tensors_) {
    if (tensor == nullptr) throw std::runtime_error("views() of an EngineOp were already taken");
    // take_view nulls `tensor` only once its view owns it; a refused one (ValueError) stays
    // ours, released in the destructor, so no error path frees a tensor twice or never.
    out.append(take_view(tensor));
  }
  return out;
}

void EngineOp::finish(const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finished_ = true;
    error_ = error;
  }
  finished_cv_.notify_all();
}

bool EngineOp::wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout_s < 0) {
    finished_cv_.wait(lock, [this] { return finished_; });
    return true;
  }
  return finished_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return finished_; });
}

bool EngineOp::done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

std::string EngineOp::error() {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

ReadyQueue& ReadyQueue::instance() {
  static ReadyQueue* queue = new ReadyQueue();  // never destroyed: engine threads may outlive statics
  return *queue;
}

void ReadyQueue::accept(std::shared_ptr<EngineOp> op) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) {
      op->acquire_tensors();  // MXNDArrayToDLPack only: quick, and never waits on the engine
      ops_.push_back(std::move(op));
      cv_.notify_one();
      return;
    }
    reason = reason_;
  }
  op->finish(reason);
}

std::shared_ptr<EngineOp> ReadyQueue::pop(double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [this] { return closed_ || !ops_.empty(); };
  if (timeout_s < 0) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready)) {
    return nullptr;
  }
  if (closed_ || ops_.empty()) return nullptr;
  std::shared_ptr<EngineOp> op = std::move(ops_.front());
  ops_.pop_front();
  return op;
}

void ReadyQueue::close(const std::string& reason) {
  std::deque<std::shared_ptr<EngineOp>> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    reason_ = reason;
    failed.swap(ops_);
  }
  cv_.notify_all();
  for (auto& op : failed) op->finish(reason);
}

void ReadyQueue::open() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = false;
  reason_.clear();
}

void register_engine_op(py::module_& m) {
  py::class_<EngineOp, std::shared_ptr<EngineOp>>(
      m, "EngineOp", "One push_pull on MXNet's engine: a ready op, then an end op waiting for finish().")
      .def_property_readonly("id", &EngineOp::id)
      .def_property_readonly("name", &EngineOp::name)
      .def_property_readonly("done", &EngineOp::done)
      .def_property_readonly("error", &EngineOp::error)
      .def("views", &EngineOp::views,
           "The arrays' bytes as [(memoryview, byteps dtype code, shape)], inputs first; once only.")
      .def("finish", &EngineOp::finish, py::arg("error") = "",
           "Complete the op: later MXNet ops on its arrays may run; a non-empty error is raised by MXNet "
           "from the next read of an output.")
      .def("wait", &EngineOp::wait, py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>(),
           "Wait for finish() (GIL released); False on timeout.");

  m.def(
      "bind_mxnet",
      [](uintptr_t to_dlpack, uintptr_t push_sync_nd, uintptr_t last_error) {
        if (to_dlpack == 0 || push_sync_nd == 0 || last_error == 0) {
          throw std::invalid_argument("bind_mxnet: null function address");
        }
        api.to_dlpack = reinterpret_cast<ToDLPackFn>(to_dlpack);
        api.push_sync_nd = reinterpret_cast<PushSyncNDFn>(push_sync_nd);
        api.last_error = reinterpret_cast<LastErrorFn>(last_error);
      },
      py::arg("to_dlpack"), py::arg("push_sync_nd"), py::arg("last_error"),
      "Addresses of MXNDArrayToDLPack, MXEnginePushSyncND and MXGetLastError in the loaded libmxnet.");
  m.def("push", &push, py::arg("id"), py::arg("reads"), py::arg("writes"), py::arg("tokens"), py::arg("priority"),
        py::arg("name"),
        "Queue the ready op and the end op of one push_pull on MXNet's engine (NDArrayHandles as ints). "
        "Returns MXNet's return code: 0, or -1 with the error in MXGetLastError (mxnet.base.check_call).");
  m.def(
      "next_ready",
      [](double timeout) { return ReadyQueue::instance().pop(timeout); },
      py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>(),
      "The next op whose arrays are ready (GIL released); None on timeout or once closed.");
  m.def(
      "open_ready_queue", [] { ReadyQueue::instance().open(); }, "Accept ready ops (at init()).");
  m.def(
      "close_ready_queue", [](const std::string& reason) { ReadyQueue::instance().close(reason); },
      py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
      "Fail queued and later ready ops with `reason`; wakes next_ready() (at shutdown()).");
}

}  // namespace byteps_mxnet
