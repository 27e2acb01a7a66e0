#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "cuda/device_scope.h"

namespace spdl::cuda {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaUUID_t) == kDeviceUuidBytes);

StatusCode CodeFor(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation:
      return StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
      return StatusCode::kUnavailable;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevicePointer:
      return StatusCode::kInvalidArgument;
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered:
    case cudaErrorNotSupported:
      return StatusCode::kFailedPrecondition;
    default:
      return StatusCode::kInternal;
  }
}

// The Status for a failed runtime call; clears the thread's last error.
Status CudaError(cudaError_t e, const char* call) {
  (void)cudaGetLastError();
  return Status(CodeFor(e), std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// The thread's current device, for ScopedDevice.
struct CudaRuntime {
  Status GetDevice(int* device) {
    const cudaError_t e = cudaGetDevice(device);
    return e == cudaSuccess ? Status::Ok() : CudaError(e, "cudaGetDevice");
  }
  Status SetDevice(int device) {
    const cudaError_t e = cudaSetDevice(device);
    return e == cudaSuccess ? Status::Ok() : CudaError(e, "cudaSetDevice");
  }
};

cudaStream_t S(Stream s) { return static_cast<cudaStream_t>(s.handle); }
cudaEvent_t E(Event e) { return static_cast<cudaEvent_t>(e.handle); }

}  // namespace

// Returns the Status of a failed CUDA runtime call from the enclosing function.
#define SPDL_CUDA_CHECK(call)                                                   \
  do {                                                                          \
    const cudaError_t spdl_cuda_err_ = (call);                                  \
    if (spdl_cuda_err_ != cudaSuccess) return CudaError(spdl_cuda_err_, #call); \
  } while (0)

// Runs the rest of the enclosing backend call with the backend's device current on this thread,
// and gives the thread its own device back when the call returns (cuda/device_scope.h).
#define SPDL_CUDA_ACTIVATE(op)                                                     \
  CudaRuntime spdl_cuda_runtime_;                                                  \
  ScopedDevice<CudaRuntime> spdl_cuda_scope_(spdl_cuda_runtime_, options_.device); \
  SPDL_RETURN_IF_ERROR(spdl_cuda_scope_.status().WithPrefix(op))

Status CheckCudaDriver() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  (void)cudaGetLastError();
  const int needed = CUDART_VERSION / 1000 * 1000;  // the runtime's major version (13000)
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  const std::string need = "GPU jobs need an NVIDIA driver supporting CUDA " + version(needed) + " (driver " +
                           std::to_string(kMinDriverMajor) + " or newer)";
  if (driver == 0) return Unavailable("no NVIDIA driver (libcuda.so.1) on this machine: " + need);
  if (driver < needed) {
    return Unavailable("the NVIDIA driver supports CUDA " + version(driver) + " only: " + need);
  }
  return Status::Ok();
}

// In a CudaBackend member: as SPDL_CUDA_CHECK, and a sticky error poisons the backend (Fail).
#define SPDL_CUDA_CHECK_STICKY(call)                                       \
  do {                                                                     \
    const cudaError_t spdl_cuda_err_ = (call);                             \
    if (spdl_cuda_err_ != cudaSuccess) return Fail(spdl_cuda_err_, #call); \
  } while (0)

bool IsStickyCudaError(int error) {
  switch (static_cast<cudaError_t>(error)) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

Status CudaBackend::Fail(int error, const char* call) {
  Status s = CudaError(static_cast<cudaError_t>(error), call);
  if (!IsStickyCudaError(error)) return s;
  Status sticky(StatusCode::kUnavailable, "CUDA device " + std::to_string(options_.device) +
                                              " is unusable in this process after a sticky error (" + s.message() +
                                              "); only a restart of the process recovers");
  std::lock_guard lock(sticky_mu_);
  if (sticky_.ok()) sticky_ = std::move(sticky);
  return sticky_;
}

Status CudaBackend::sticky_error() const {
  std::lock_guard lock(sticky_mu_);
  return sticky_;
}

int CudaDeviceCount(std::string* why_none) {
  if (Status d = CheckCudaDriver(); !d.ok()) {
    if (why_none) *why_none = d.message();
    return 0;
  }
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why_none) *why_none = CudaError(e, "cudaGetDeviceCount").message();
    (void)cudaGetLastError();
    return 0;
  }
  if (n == 0 && why_none) *why_none = "cudaGetDeviceCount: 0 devices";
  return n;
}

Result<int> FindCudaDevice(const DeviceUuid& uuid) {
  std::string why;
  const int n = CudaDeviceCount(&why);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    SPDL_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    if (std::memcmp(prop.uuid.bytes, uuid.data(), uuid.size()) == 0) return i;
  }
  return NotFound("no CUDA device this process sees has UUID " + FormatUuid(uuid) + " (" + std::to_string(n) +
                  " visible" + (n == 0 ? ": " + why : std::string()) + "); check CUDA_VISIBLE_DEVICES");
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(Options options) {
  std::string why;
  const int n = CudaDeviceCount(&why);
  if (options.device < 0 || options.device >= n) {
    return Unavailable("CUDA device " + std::to_string(options.device) + " does not exist (" + std::to_string(n) +
                       " visible" + (n == 0 ? ": " + why : std::string()) + ")");
  }
  if (options.require_ipc) {
    const std::string use_client = " CUDA IPC (output.copy: daemon) cannot work on it; use output.copy: client";
    int ipc_events = 0, mode = 0;
    SPDL_CUDA_CHECK(cudaDeviceGetAttribute(&ipc_events, cudaDevAttrIpcEventSupport, options.device));
    SPDL_CUDA_CHECK(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, options.device));
    if (ipc_events == 0) {
      return FailedPrecondition(
          "CUDA device " + std::to_string(options.device) +
          " does not support interprocess events (a MIG instance, or an unsupported platform):" + use_client);
    }
    if (mode == cudaComputeModeProhibited || mode == cudaComputeModeExclusiveProcess) {
      return FailedPrecondition("CUDA device " + std::to_string(options.device) + " is in compute mode " +
                                (mode == cudaComputeModeProhibited ? "Prohibited" : "Exclusive_Process") +
                                " (only one process may use it, and the trainer must):" + use_client);
    }
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(std::move(options)));
  SPDL_RETURN_IF_ERROR(b->InitContext());
  return b;
}

Status CudaBackend::InitContext() {
  SPDL_CUDA_ACTIVATE("initializing the CUDA context");
  SPDL_CUDA_CHECK_STICKY(cudaFree(nullptr));  // creates the primary context now, not on the hot path
  return Status::Ok();
}

void CudaBackend::ReportTeardownError(const Status& status) {
  if (options_.report_teardown_error) {
    options_.report_teardown_error(status);
  } else {
    DeviceBackend::ReportTeardownError(status);
  }
}

Result<DeviceUuid> CudaBackend::Uuid() {
  cudaDeviceProp prop{};
  SPDL_CUDA_CHECK_STICKY(cudaGetDeviceProperties(&prop, options_.device));
  DeviceUuid u{};
  std::memcpy(u.data(), prop.uuid.bytes, u.size());
  return u;
}

Status CudaBackend::HostRegister(void* ptr, size_t bytes) {
  SPDL_CUDA_ACTIVATE("HostRegister");
  SPDL_CUDA_CHECK_STICKY(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
  return Status::Ok();
}

Status CudaBackend::HostUnregister(void* ptr) {
  SPDL_CUDA_ACTIVATE("HostUnregister");
  SPDL_CUDA_CHECK_STICKY(cudaHostUnregister(ptr));
  return Status::Ok();
}

Result<void*> CudaBackend::DeviceAlloc(size_t bytes) {
  SPDL_CUDA_ACTIVATE("DeviceAlloc");
  void* p = nullptr;
  SPDL_CUDA_CHECK_STICKY(cudaMalloc(&p, bytes));
  return p;
}

Status CudaBackend::DeviceFree(void* ptr) {
  SPDL_CUDA_ACTIVATE("DeviceFree");
  SPDL_CUDA_CHECK_STICKY(cudaFree(ptr));
  return Status::Ok();
}

Result<Stream> CudaBackend::CreateStream() {
  SPDL_CUDA_ACTIVATE("CreateStream");
  cudaStream_t s = nullptr;
  SPDL_CUDA_CHECK_STICKY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream{s};
}

Status CudaBackend::DestroyStream(Stream stream) {
  SPDL_CUDA_ACTIVATE("DestroyStream");
  SPDL_CUDA_CHECK_STICKY(cudaStreamDestroy(S(stream)));
  return Status::Ok();
}

Result<Event> CudaBackend::CreateEvent(bool interprocess) {
  SPDL_CUDA_ACTIVATE("CreateEvent");
  cudaEvent_t e = nullptr;
  const unsigned flags = cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0u);
  SPDL_CUDA_CHECK_STICKY(cudaEventCreateWithFlags(&e, flags));
  return Event{e};
}

Status CudaBackend::DestroyEvent(Event event) {
  SPDL_CUDA_ACTIVATE("DestroyEvent");
  SPDL_CUDA_CHECK_STICKY(cudaEventDestroy(E(event)));
  return Status::Ok();
}

Status CudaBackend::MemcpyH2DAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  SPDL_CUDA_ACTIVATE("MemcpyH2DAsync");
  SPDL_CUDA_CHECK_STICKY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, S(stream)));
  return Status::Ok();
}

Status CudaBackend::MemcpyD2HAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  SPDL_CUDA_ACTIVATE("MemcpyD2HAsync");
  SPDL_CUDA_CHECK_STICKY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S(stream)));
  return Status::Ok();
}

Status CudaBackend::RecordEvent(Event event, Stream stream) {
  SPDL_CUDA_ACTIVATE("RecordEvent");
  SPDL_CUDA_CHECK_STICKY(cudaEventRecord(E(event), S(stream)));
  return Status::Ok();
}

Status CudaBackend::StreamWaitEvent(Stream stream, Event event) {
  SPDL_CUDA_ACTIVATE("StreamWaitEvent");
  SPDL_CUDA_CHECK_STICKY(cudaStreamWaitEvent(S(stream), E(event), 0));
  return Status::Ok();
}

Result<bool> CudaBackend::QueryEvent(Event event) {
  SPDL_CUDA_ACTIVATE("QueryEvent");
  const cudaError_t e = cudaEventQuery(E(event));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  return Fail(e, "cudaEventQuery");
}

Status CudaBackend::SynchronizeEvent(Event event) {
  SPDL_CUDA_ACTIVATE("SynchronizeEvent");
  SPDL_CUDA_CHECK_STICKY(cudaEventSynchronize(E(event)));
  return Status::Ok();
}

Status CudaBackend::SynchronizeStream(Stream stream) {
  SPDL_CUDA_ACTIVATE("SynchronizeStream");
  SPDL_CUDA_CHECK_STICKY(cudaStreamSynchronize(S(stream)));
  return Status::Ok();
}

Result<IpcMemHandle> CudaBackend::ExportMemory(void* base) {
  SPDL_CUDA_ACTIVATE("ExportMemory");
  cudaIpcMemHandle_t h;
  SPDL_CUDA_CHECK_STICKY(cudaIpcGetMemHandle(&h, base));
  IpcMemHandle out;
  std::memcpy(out.bytes.data(), &h, sizeof(h));
  return out;
}

Result<IpcEventHandle> CudaBackend::ExportEvent(Event event) {
  SPDL_CUDA_ACTIVATE("ExportEvent");
  cudaIpcEventHandle_t h;
  SPDL_CUDA_CHECK_STICKY(cudaIpcGetEventHandle(&h, E(event)));
  IpcEventHandle out;
  std::memcpy(out.bytes.data(), &h, sizeof(h));
  return out;
}

Result<void*> CudaBackend::OpenMemory(const IpcMemHandle& handle) {
  SPDL_CUDA_ACTIVATE("OpenMemory");
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes.data(), sizeof(h));
  void* p = nullptr;
  SPDL_CUDA_CHECK_STICKY(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return p;
}

Status CudaBackend::CloseMemory(void* base) {
  SPDL_CUDA_ACTIVATE("CloseMemory");
  SPDL_CUDA_CHECK_STICKY(cudaIpcCloseMemHandle(base));
  return Status::Ok();
}

Result<Event> CudaBackend::OpenEvent(const IpcEventHandle& handle) {
  SPDL_CUDA_ACTIVATE("OpenEvent");
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle.bytes.data(), sizeof(h));
  cudaEvent_t e = nullptr;
  SPDL_CUDA_CHECK_STICKY(cudaIpcOpenEventHandle(&e, h));
  return Event{e};
}

}  // namespace spdl::cuda
