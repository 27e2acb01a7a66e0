#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

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
  return Status(CodeFor(e), std::string(call) + ": " + cudaGetErrorName(e) + ": " +
                                cudaGetErrorString(e));
}

cudaStream_t S(Stream s) { return static_cast<cudaStream_t>(s.handle); }
cudaEvent_t E(Event e) { return static_cast<cudaEvent_t>(e.handle); }

}  // namespace

// Returns the Status of a failed CUDA runtime call from the enclosing function.
#define SPDL_CUDA_CHECK(call)                                 \
  do {                                                        \
    const cudaError_t spdl_cuda_err_ = (call);                \
    if (spdl_cuda_err_ != cudaSuccess) return CudaError(spdl_cuda_err_, #call); \
  } while (0)

int CudaDeviceCount(std::string* why_none) {
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
  return NotFound("no visible CUDA device has the daemon's device UUID (" + std::to_string(n) +
                  " visible" + (n == 0 ? ": " + why : std::string()) +
                  "); check CUDA_VISIBLE_DEVICES of the trainer");
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(Options options) {
  std::string why;
  const int n = CudaDeviceCount(&why);
  if (options.device < 0 || options.device >= n) {
    return Unavailable("CUDA device " + std::to_string(options.device) + " does not exist (" +
                       std::to_string(n) + " visible" + (n == 0 ? ": " + why : std::string()) +
                       ")");
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(std::move(options)));
  SPDL_RETURN_IF_ERROR(b->Activate("initializing the CUDA context"));
  SPDL_CUDA_CHECK(cudaFree(nullptr));  // creates the primary context now, not on the hot path
  return b;
}

Status CudaBackend::Activate(const char* op) {
  const cudaError_t e = cudaSetDevice(options_.device);
  if (e != cudaSuccess) return CudaError(e, "cudaSetDevice").WithPrefix(op);
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
  SPDL_CUDA_CHECK(cudaGetDeviceProperties(&prop, options_.device));
  DeviceUuid u{};
  std::memcpy(u.data(), prop.uuid.bytes, u.size());
  return u;
}

Status CudaBackend::HostRegister(void* ptr, size_t bytes) {
  SPDL_RETURN_IF_ERROR(Activate("HostRegister"));
  SPDL_CUDA_CHECK(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
  return Status::Ok();
}

Status CudaBackend::HostUnregister(void* ptr) {
  SPDL_RETURN_IF_ERROR(Activate("HostUnregister"));
  SPDL_CUDA_CHECK(cudaHostUnregister(ptr));
  return Status::Ok();
}

Result<void*> CudaBackend::DeviceAlloc(size_t bytes) {
  SPDL_RETURN_IF_ERROR(Activate("DeviceAlloc"));
  void* p = nullptr;
  SPDL_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

Status CudaBackend::DeviceFree(void* ptr) {
  SPDL_RETURN_IF_ERROR(Activate("DeviceFree"));
  SPDL_CUDA_CHECK(cudaFree(ptr));
  return Status::Ok();
}

Result<Stream> CudaBackend::CreateStream() {
  SPDL_RETURN_IF_ERROR(Activate("CreateStream"));
  cudaStream_t s = nullptr;
  SPDL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream{s};
}

Status CudaBackend::DestroyStream(Stream stream) {
  SPDL_RETURN_IF_ERROR(Activate("DestroyStream"));
  SPDL_CUDA_CHECK(cudaStreamDestroy(S(stream)));
  return Status::Ok();
}

Result<Event> CudaBackend::CreateEvent(bool interprocess) {
  SPDL_RETURN_IF_ERROR(Activate("CreateEvent"));
  cudaEvent_t e = nullptr;
  const unsigned flags = cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0u);
  SPDL_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
  return Event{e};
}

Status CudaBackend::DestroyEvent(Event event) {
  SPDL_RETURN_IF_ERROR(Activate("DestroyEvent"));
  SPDL_CUDA_CHECK(cudaEventDestroy(E(event)));
  return Status::Ok();
}

Status CudaBackend::MemcpyH2DAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  SPDL_RETURN_IF_ERROR(Activate("MemcpyH2DAsync"));
  SPDL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, S(stream)));
  return Status::Ok();
}

Status CudaBackend::MemcpyD2HAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  SPDL_RETURN_IF_ERROR(Activate("MemcpyD2HAsync"));
  SPDL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S(stream)));
  return Status::Ok();
}

Status CudaBackend::RecordEvent(Event event, Stream stream) {
  SPDL_RETURN_IF_ERROR(Activate("RecordEvent"));
  SPDL_CUDA_CHECK(cudaEventRecord(E(event), S(stream)));
  return Status::Ok();
}

Status CudaBackend::StreamWaitEvent(Stream stream, Event event) {
  SPDL_RETURN_IF_ERROR(Activate("StreamWaitEvent"));
  SPDL_CUDA_CHECK(cudaStreamWaitEvent(S(stream), E(event), 0));
  return Status::Ok();
}

Result<bool> CudaBackend::QueryEvent(Event event) {
  SPDL_RETURN_IF_ERROR(Activate("QueryEvent"));
  const cudaError_t e = cudaEventQuery(E(event));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  return CudaError(e, "cudaEventQuery");
}

Status CudaBackend::SynchronizeEvent(Event event) {
  SPDL_RETURN_IF_ERROR(Activate("SynchronizeEvent"));
  SPDL_CUDA_CHECK(cudaEventSynchronize(E(event)));
  return Status::Ok();
}

Status CudaBackend::SynchronizeStream(Stream stream) {
  SPDL_RETURN_IF_ERROR(Activate("SynchronizeStream"));
  SPDL_CUDA_CHECK(cudaStreamSynchronize(S(stream)));
  return Status::Ok();
}

Result<IpcMemHandle> CudaBackend::ExportMemory(void* base) {
  SPDL_RETURN_IF_ERROR(Activate("ExportMemory"));
  cudaIpcMemHandle_t h;
  SPDL_CUDA_CHECK(cudaIpcGetMemHandle(&h, base));
  IpcMemHandle out;
  std::memcpy(out.bytes.data(), &h, sizeof(h));
  return out;
}

Result<IpcEventHandle> CudaBackend::ExportEvent(Event event) {
  SPDL_RETURN_IF_ERROR(Activate("ExportEvent"));
  cudaIpcEventHandle_t h;
  SPDL_CUDA_CHECK(cudaIpcGetEventHandle(&h, E(event)));
  IpcEventHandle out;
  std::memcpy(out.bytes.data(), &h, sizeof(h));
  return out;
}

Result<void*> CudaBackend::OpenMemory(const IpcMemHandle& handle) {
  SPDL_RETURN_IF_ERROR(Activate("OpenMemory"));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes.data(), sizeof(h));
  void* p = nullptr;
  SPDL_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return p;
}

Status CudaBackend::CloseMemory(void* base) {
  SPDL_RETURN_IF_ERROR(Activate("CloseMemory"));
  SPDL_CUDA_CHECK(cudaIpcCloseMemHandle(base));
  return Status::Ok();
}

Result<Event> CudaBackend::OpenEvent(const IpcEventHandle& handle) {
  SPDL_RETURN_IF_ERROR(Activate("OpenEvent"));
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle.bytes.data(), sizeof(h));
  cudaEvent_t e = nullptr;
  SPDL_CUDA_CHECK(cudaIpcOpenEventHandle(&e, h));
  return Event{e};
}

}  // namespace spdl::cuda
