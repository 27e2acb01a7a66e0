// CudaBackend: the DeviceBackend that makes real CUDA runtime calls. Built only with CUDA
// (library spdl_cuda).
//
// Every call first makes the backend's device current on the calling thread (cudaSetDevice is a
// thread-local switch, cheap when already current), then checks the runtime's result: a failure is
// a Status whose message names the call and carries cudaGetErrorName + cudaGetErrorString, with a
// code chosen from the error (out of memory -> kResourceExhausted, no device or driver ->
// kUnavailable, bad value or handle -> kInvalidArgument, anything else -> kInternal). The runtime's
// per-thread "last error" is cleared after a failure, so it cannot leak into someone else's check.
//
// Thread safety: safe to share between threads (the CUDA runtime is).
#pragma once

#include <functional>
#include <memory>

#include "cuda/device_backend.h"

namespace spdl::cuda {

// The number of CUDA devices this process can see; 0 (not an error) when there is no driver or no
// device, so callers can skip GPU work with a clear message. `why_none`, when given, gets the
// runtime's reason for 0.
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
  };
  // Checks that the device exists and initializes the runtime's context on it (cudaSetDevice +
  // cudaFree(0)); kUnavailable when there is no such device.
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

 private:
  explicit CudaBackend(Options options) : options_(std::move(options)) {}
  // Makes the device current on this thread.
  Status Activate(const char* op);

  const Options options_;
};

}  // namespace spdl::cuda
