// BytepsForwardOrFail: a TensorFlow op that passes its values through, or fails
// with a chosen error code and message.
//
// Inside graphs byteps runs in a tf.py_function, and TensorFlow turns every
// Python exception but a few builtins into UnknownError. Horovod's ops raise
// FailedPreconditionError when ranks disagree, and scripts (and Horovod's own
// tests) catch that class. So the py_function returns its error as data (a
// code and a UTF-8 message) and this op, placed after it, fails with exactly
// that code and message, or forwards the values unchanged.
//
// The op uses only TensorFlow's stable C API (tensorflow/c/ops.h, kernels.h),
// and not even at link time: the few functions are looked up with dlsym in the
// libtensorflow_framework.so.2 that the running TensorFlow has already loaded.
// The library therefore has no undefined TensorFlow symbol, and a TensorFlow
// upgrade can at worst leave the op unregistered (byteps then falls back to the
// py_function's own UnknownError), never fail to load.
// Loaded with tf.load_op_library by byteps/tensorflow/graph_errors.py.

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

extern "C" {
// Opaque TensorFlow C API types.
struct TF_Status;
struct TF_Tensor;
struct TF_OpDefinitionBuilder;
struct TF_ShapeInferenceContext;
struct TF_ShapeHandle;
struct TF_KernelBuilder;
struct TF_OpKernelConstruction;
struct TF_OpKernelContext;
}

namespace {

constexpr const char* kOpName = "BytepsForwardOrFail";
constexpr int kOk = 0;
constexpr int kLastCode = 16;  // TF_UNAUTHENTICATED, the highest status code

// The C API functions this op needs, resolved once from libtensorflow_framework.
struct TensorFlowApi {
  TF_Status* (*NewStatus)();
  void (*DeleteStatus)(TF_Status*);
  int (*GetCode)(const TF_Status*);
  const char* (*Message)(const TF_Status*);
  void (*SetStatus)(TF_Status*, int, const char*);
  TF_OpDefinitionBuilder* (*NewOpDefinitionBuilder)(const char*);
  void (*AddAttr)(TF_OpDefinitionBuilder*, const char*);
  void (*AddInput)(TF_OpDefinitionBuilder*, const char*);
  void (*AddOutput)(TF_OpDefinitionBuilder*, const char*);
  void (*SetShapeFunction)(TF_OpDefinitionBuilder*, void (*)(TF_ShapeInferenceContext*, TF_Status*));
  void (*RegisterOpDefinition)(TF_OpDefinitionBuilder*, TF_Status*);
  int64_t (*ShapeNumInputs)(TF_ShapeInferenceContext*);
  TF_ShapeHandle* (*NewShapeHandle)();
  void (*ShapeGetInput)(TF_ShapeInferenceContext*, int, TF_ShapeHandle*, TF_Status*);
  void (*ShapeSetOutput)(TF_ShapeInferenceContext*, int, TF_ShapeHandle*, TF_Status*);
  void (*DeleteShapeHandle)(TF_ShapeHandle*);
  TF_KernelBuilder* (*NewKernelBuilder)(const char*, const char*, void* (*)(TF_OpKernelConstruction*),
                                        void (*)(void*, TF_OpKernelContext*), void (*)(void*));
  void (*RegisterKernelBuilder)(const char*, TF_KernelBuilder*, TF_Status*);
  int (*NumInputs)(TF_OpKernelContext*);
  void (*GetInput)(TF_OpKernelContext*, int, TF_Tensor**, TF_Status*);
  void (*SetOutput)(TF_OpKernelContext*, int, const TF_Tensor*, TF_Status*);
  void (*Failure)(TF_OpKernelContext*, TF_Status*);
  void (*DeleteTensor)(TF_Tensor*);
  void* (*TensorData)(const TF_Tensor*);
  size_t (*TensorByteSize)(const TF_Tensor*);
};

TensorFlowApi api;
std::string load_problem;  // empty once the op is registered; read by byteps_graph_error_op_problem()

template <typename F>
bool resolve(void* library, const char* name, F& slot) {
  slot = reinterpret_cast<F>(dlsym(library, name));
  if (slot == nullptr) load_problem = std::string("TensorFlow's C API lacks ") + name;
  return slot != nullptr;
}

bool resolve_api() {
  void* library = dlopen("libtensorflow_framework.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) {
    load_problem = "libtensorflow_framework.so.2 is not loaded in this process";
    return false;
  }
  return resolve(library, "TF_NewStatus", api.NewStatus) && resolve(library, "TF_DeleteStatus", api.DeleteStatus) &&
         resolve(library, "TF_GetCode", api.GetCode) && resolve(library, "TF_Message", api.Message) &&
         resolve(library, "TF_SetStatus", api.SetStatus) &&
         resolve(library, "TF_NewOpDefinitionBuilder", api.NewOpDefinitionBuilder) &&
         resolve(library, "TF_OpDefinitionBuilderAddAttr", api.AddAttr) &&
         resolve(library, "TF_OpDefinitionBuilderAddInput", api.AddInput) &&
         resolve(library, "TF_OpDefinitionBuilderAddOutput", api.AddOutput) &&
         resolve(library, "TF_OpDefinitionBuilderSetShapeInferenceFunction", api.SetShapeFunction) &&
         resolve(library, "TF_RegisterOpDefinition", api.RegisterOpDefinition) &&
         resolve(library, "TF_ShapeInferenceContextNumInputs", api.ShapeNumInputs) &&
         resolve(library, "TF_NewShapeHandle", api.NewShapeHandle) &&
         resolve(library, "TF_ShapeInferenceContextGetInput", api.ShapeGetInput) &&
         resolve(library, "TF_ShapeInferenceContextSetOutput", api.ShapeSetOutput) &&
         resolve(library, "TF_DeleteShapeHandle", api.DeleteShapeHandle) &&
         resolve(library, "TF_NewKernelBuilder", api.NewKernelBuilder) &&
         resolve(library, "TF_RegisterKernelBuilder", api.RegisterKernelBuilder) &&
         resolve(library, "TF_NumInputs", api.NumInputs) && resolve(library, "TF_GetInput", api.GetInput) &&
         resolve(library, "TF_SetOutput", api.SetOutput) &&
         resolve(library, "TF_OpKernelContext_Failure", api.Failure) &&
         resolve(library, "TF_DeleteTensor", api.DeleteTensor) && resolve(library, "TF_TensorData", api.TensorData) &&
         resolve(library, "TF_TensorByteSize", api.TensorByteSize);
}

// Inputs: code (int32 scalar), message (uint8 vector), values (T). Outputs: values.
constexpr int kFirstValue = 2;

void forward_shapes(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* shape = api.NewShapeHandle();
  const int64_t inputs = api.ShapeNumInputs(ctx);
  for (int64_t i = kFirstValue; i < inputs && api.GetCode(status) == kOk; ++i) {
    api.ShapeGetInput(ctx, static_cast<int>(i), shape, status);
    if (api.GetCode(status) == kOk) api.ShapeSetOutput(ctx, static_cast<int>(i - kFirstValue), shape, status);
  }
  api.DeleteShapeHandle(shape);
}

void* no_state(TF_OpKernelConstruction*) { return nullptr; }
void no_delete(void*) {}

// Fails the op with the code and message of inputs 0 and 1; false when the code is OK.
bool fail_if_told(TF_OpKernelContext* ctx, TF_Status* status) {
  TF_Tensor* code_tensor = nullptr;
  TF_Tensor* message_tensor = nullptr;
  api.GetInput(ctx, 0, &code_tensor, status);
  if (api.GetCode(status) == kOk) api.GetInput(ctx, 1, &message_tensor, status);
  bool failed = api.GetCode(status) != kOk;
  if (!failed && api.TensorByteSize(code_tensor) == sizeof(int32_t)) {
    int32_t code = 0;
    std::memcpy(&code, api.TensorData(code_tensor), sizeof code);
    if (code != kOk) {
      std::string message(static_cast<const char*>(api.TensorData(message_tensor)),
                          api.TensorByteSize(message_tensor));
      if (code < 0 || code > kLastCode) code = 2;  // TF_UNKNOWN
      api.SetStatus(status, code, message.c_str());
      failed = true;
    }
  }
  if (code_tensor != nullptr) api.DeleteTensor(code_tensor);
  if (message_tensor != nullptr) api.DeleteTensor(message_tensor);
  return failed;
}

void compute(void*, TF_OpKernelContext* ctx) {
  TF_Status* status = api.NewStatus();
  if (!fail_if_told(ctx, status)) {
    const int inputs = api.NumInputs(ctx);
    for (int i = kFirstValue; i < inputs && api.GetCode(status) == kOk; ++i) {
      TF_Tensor* value = nullptr;
      api.GetInput(ctx, i, &value, status);
      if (api.GetCode(status) == kOk) api.SetOutput(ctx, i - kFirstValue, value, status);
      if (value != nullptr) api.DeleteTensor(value);
    }
  }
  if (api.GetCode(status) != kOk) api.Failure(ctx, status);
  api.DeleteStatus(status);
}

bool register_op() {
  if (!resolve_api()) return false;
  TF_Status* status = api.NewStatus();
  TF_OpDefinitionBuilder* op = api.NewOpDefinitionBuilder(kOpName);
  api.AddAttr(op, "T: list(type) >= 0");
  api.AddInput(op, "code: int32");
  api.AddInput(op, "message: uint8");
  api.AddInput(op, "values: T");
  api.AddOutput(op, "outputs: T");
  api.SetShapeFunction(op, &forward_shapes);
  api.RegisterOpDefinition(op, status);  // takes ownership of the builder
  if (api.GetCode(status) == kOk) {
    TF_KernelBuilder* kernel = api.NewKernelBuilder(kOpName, "CPU", &no_state, &compute, &no_delete);
    api.RegisterKernelBuilder("BytepsForwardOrFailCpu", kernel, status);  // takes ownership
  }
  if (api.GetCode(status) != kOk) load_problem = api.Message(status);
  api.DeleteStatus(status);
  return load_problem.empty();
}

// Registered when tf.load_op_library opens the library, as TensorFlow expects.
const bool registered = register_op();

}  // namespace

extern "C" __attribute__((visibility("default"))) const char* byteps_graph_error_op_problem() {
  return registered ? "" : load_problem.c_str();
}
