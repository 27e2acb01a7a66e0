// CudaBackend: the DeviceBackend that makes real CUDA runtime calls. Built only with CUDA
// (library spdl_cuda).
//
// Every call runs with the backend's device current on the calling thread and gives the thread its
// previous device back when it returns (cuda/device_scope.h: the trainer's threads keep the device
// they chose), then checks the runtime's result: a failure is
// a Status whose message names the call and carries cudaGetErrorName + cudaGetErrorString, with a
// code chosen from the error (out of memory -> kResourceExhausted, no device or driver ->
// kUnavailable, bad value or handle -> kInvalidArgument, anything else -> kInternal). A sticky error
// (IsStickyCudaError: illegal address, launch failure, ECC, ...) poisons the backend: sticky_error()
// returns it and every later call fails with it at once; only a restart recovers. The runtime's
// per-thread "last error" is cleared after a failure, so it cannot leak into someone else's check.
//
// Thread safety: safe to share between threads (the CUDA runtime is).
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "cuda/device_backend.h"

namespace spdl::cuda {

// The oldest NVIDIA driver branch that supports the CUDA 13 runtime spdld is built with.
inline constexpr int kMinDriverMajor = 580;

// Ok when the machine's NVIDIA driver can run this build's CUDA runtime; else kUnavailable naming
// what is there (no driver, or the CUDA version it supports) and the driver needed (>= 580). The
// runtime is linked statically and loads the driver only here, at the first CUDA call, so
// machines without a driver run everything CPU.
Status CheckCudaDriver();

// The number of CUDA devices this process can see; 0 (not an error) when there is no driver or no
// device, so callers can skip GPU work with a clear message. `why_none`, when given, gets the
// reason for 0 (CheckCudaDriver's message when the driver is missing or too old).
int CudaDeviceCount(std::string* why_none = nullptr);

// The ordinal, in this process, of the device with `uuid` (CUDA_VISIBLE_DEVICES may number devices
// differently in the daemon and in a trainer). kNotFound when no visible device has it.
Result<int> FindCudaDevice(const DeviceUuid& uuid);

class CudaBackend final : public DeviceBackend {
 public:
  struct Options {
    int device = 0;  // CUDA ordinal in this process
    // Where teardown failures go (the daemon passes spdlog); empty = stderr.
    std::function<void(const Status&)> report_teardown_error;
    // The daemon's copy: daemon backends: check at creation what CUDA IPC needs of the device
    // (interprocess events supported — not on MIG instances or some platforms — and a compute mode
    // that lets the trainer's process use the GPU too); a device that cannot is refused with
    // kFailedPrecondition naming `output.copy: client`.
    bool require_ipc = false;
  };
  // Checks that the device exists (and, with require_ipc, that CUDA IPC can work on it) and
  // initializes the runtime's context on it (cudaFree(0)); kUnavailable when there is no such device
  // or no usable driver (CheckCudaDriver's message).
  static Result<std::unique_ptr<CudaBackend>> Create(Options options);

  const char* name() const override { return "cuda"; }
  int device() const override { return options_.device; }
  Result<DeviceUuid> Uuid() override;
  Status HostRegister(void* ptr, size_t bytes) override;
  Status HostUnregister(void* ptr) override;
  Result<void*> DeviceAlloc(size_t bytes) override;
  Status DeviceFree(void* ptr) override;
  Result<Stream> CreateStream() override;
  Status DestroyStream(Stream stream) override;
  Result<Event> CreateEvent(bool interprocess) override;
  Status DestroyEvent(Event event) override;
  Status MemcpyH2DAsync(void* dst, const void* src, size_t bytes, Stream stream) override;
  Status MemcpyD2HAsync(void* dst, const void* src, size_t bytes, Stream stream) override;
  Status RecordEvent(Event event, Stream stream) override;
  Status StreamWaitEvent(Stream stream, Event event) override;
  Result<bool> QueryEvent(Event event) override;
  Status SynchronizeEvent(Event event) override;
  Status SynchronizeStream(Stream stream) override;
  Result<IpcMemHandle> ExportMemory(void* base) override;
  Result<IpcEventHandle> ExportEvent(Event event) override;
  Result<void*> OpenMemory(const IpcMemHandle& handle) override;
  Status CloseMemory(void* base) override;
  Result<Event> OpenEvent(const IpcEventHandle& handle) override;
  void ReportTeardownError(const Status& status) override;
  Status sticky_error() const override;

 private:
  explicit CudaBackend(Options options) : options_(std::move(options)) {}
  // Creates the device's primary context (cudaFree(0)) under a ScopedDevice.
  Status InitContext();

  // The Status of a failed call (CudaError); a sticky error is kept: every later call fails with it.
  // (`error` is a cudaError_t; int keeps the CUDA headers out of this one.)
  Status Fail(int error, const char* call);

  const Options options_;
  mutable std::mutex sticky_mu_;
  Status sticky_;  // guarded by sticky_mu_
};

// Whether a cudaError_t (passed as int) leaves the process's context on the device unusable: every
// later call fails with it until the process exits (illegal address, launch failure, ECC, ...).
bool IsStickyCudaError(int error);

}  // namespace spdl::cuda
