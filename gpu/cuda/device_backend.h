// DeviceBackend: the seam between spdld's GPU-delivery logic and the CUDA runtime.
//
// Everything the device slot pool (daemon side) and the device slot view (client side) do to a GPU
// goes through this small interface, so the logic is plain C++ and is tested everywhere against
// FakeBackend (fake_backend.h), while CudaBackend (cuda_backend.h, built only with CUDA) makes the
// real runtime calls. One conformance rule for both: every call returns a Status (never throws), and
// the asynchronous calls (copy, record, wait) only enqueue work on a stream.
//
// A backend is bound to ONE device (the CUDA runtime ordinal it was made for): every call that
// creates or uses a device object runs against that device.
//
// Handles (Stream, Event) are opaque pointers; for CudaBackend they are the cudaStream_t /
// cudaEvent_t themselves, so a caller may pass its own stream (e.g. PyTorch's current stream) with
// Stream{reinterpret_cast<void*>(cuda_stream)}. Stream{nullptr} is the legacy default stream.
// Device memory is a plain `void*` in the backend's device address space (never dereference it on
// the host; FakeBackend's happens to be host memory).
//
// Thread safety: a backend is safe to share between threads (the CUDA runtime is; FakeBackend locks).
// Objects it creates are used by one owner at a time (see device_handles.h for RAII owners).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace spdl::cuda {

// Bytes of a cudaIpcMemHandle_t / cudaIpcEventHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr size_t kIpcHandleBytes = 64;
// Bytes of a device UUID (cudaDeviceProp::uuid).
inline constexpr size_t kDeviceUuidBytes = 16;

struct Stream {
  void* handle = nullptr;  // cudaStream_t for CudaBackend; nullptr = the default stream
  friend bool operator==(Stream a, Stream b) { return a.handle == b.handle; }
};

struct Event {
  void* handle = nullptr;  // cudaEvent_t for CudaBackend; nullptr = none
  explicit operator bool() const { return handle != nullptr; }
  friend bool operator==(Event a, Event b) { return a.handle == b.handle; }
};

// The exported, process-independent names of a device allocation and of an interprocess event:
// opaque bytes that may be sent to another process (over the control socket) and opened there.
struct IpcMemHandle {
  std::array<uint8_t, kIpcHandleBytes> bytes{};
  friend bool operator==(const IpcMemHandle&, const IpcMemHandle&) = default;
};
struct IpcEventHandle {
  std::array<uint8_t, kIpcHandleBytes> bytes{};
  friend bool operator==(const IpcEventHandle&, const IpcEventHandle&) = default;
};
using DeviceUuid = std::array<uint8_t, kDeviceUuidBytes>;

// `uuid` as nvidia-smi -L writes it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string FormatUuid(const DeviceUuid& uuid);

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // "cuda" or "fake", for logs.
  virtual const char* name() const = 0;
  // The CUDA runtime ordinal this backend is bound to (the N of cuda:N in this process).
  virtual int device() const = 0;
  // The device's UUID: the same in every process, whatever CUDA_VISIBLE_DEVICES says, so the
  // client can find its own ordinal for the daemon's device.
  virtual Result<DeviceUuid> Uuid() = 0;

  // ---- host memory ----
  // Page-locks [ptr, ptr + bytes) for DMA (cudaHostRegister, portable: pinned for every context of
  // this process). The range must not overlap a registered one.
  virtual Status HostRegister(void* ptr, size_t bytes) = 0;
  // Undoes HostRegister. REQUIRES: ptr was registered and no copy from it is in flight.
  virtual Status HostUnregister(void* ptr) = 0;

  // ---- device memory ----
  // cudaMalloc: `bytes` of device memory, aligned to at least 256 bytes.
  virtual Result<void*> DeviceAlloc(size_t bytes) = 0;
  // cudaFree. REQUIRES: no work in flight uses it, and no other process has it open (IPC).
  virtual Status DeviceFree(void* ptr) = 0;

  // ---- streams and events ----
  // A non-blocking stream (cudaStreamNonBlocking: never serialized with the legacy default stream).
  virtual Result<Stream> CreateStream() = 0;
  virtual Status DestroyStream(Stream stream) = 0;
  // An event, always cudaEventDisableTiming; `interprocess` adds cudaEventInterprocess (exportable).
  virtual Result<Event> CreateEvent(bool interprocess) = 0;
  // cudaEventDestroy; also for events opened from an IPC handle.
  virtual Status DestroyEvent(Event event) = 0;

  // Enqueues a copy of `bytes` from host `src` to device `dst` on `stream` (cudaMemcpyAsync). Truly
  // asynchronous only when `src` is page-locked. REQUIRES: src stays valid and unchanged until the
  // copy has run (record an event after it and query it).
  virtual Status MemcpyH2DAsync(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  // Enqueues a copy from device `src` to host `dst` (tests, the bandwidth tool).
  virtual Status MemcpyD2HAsync(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  // Enqueues "signal `event`" on `stream`, after everything enqueued on it so far.
  virtual Status RecordEvent(Event event, Stream stream) = 0;
  // Makes later work on `stream` wait (on the GPU, the host does not block) until the work captured
  // by the most recent RecordEvent of `event` (at the time of this call) has run.
  virtual Status StreamWaitEvent(Stream stream, Event event) = 0;
  // Whether the work captured by `event` has run (true also for a never-recorded event). Never
  // blocks.
  virtual Result<bool> QueryEvent(Event event) = 0;
  // Blocks the calling thread until `event` has completed. For teardown and fences, not hot paths.
  virtual Status SynchronizeEvent(Event event) = 0;
  // Blocks the calling thread until all work on `stream` has run.
  virtual Status SynchronizeStream(Stream stream) = 0;

  // ---- CUDA IPC ----
  // The IPC name of the allocation that starts at `base` (which must be a DeviceAlloc result).
  virtual Result<IpcMemHandle> ExportMemory(void* base) = 0;
  // The IPC name of an event made with CreateEvent(/*interprocess=*/true).
  virtual Result<IpcEventHandle> ExportEvent(Event event) = 0;
  // Maps another process's allocation into this process (cudaIpcOpenMemHandle); returns its base.
  // Fails in the process that exported it. Undo with CloseMemory before that process frees it.
  virtual Result<void*> OpenMemory(const IpcMemHandle& handle) = 0;
  virtual Status CloseMemory(void* base) = 0;
  // Opens another process's interprocess event (cudaIpcOpenEventHandle); destroy with DestroyEvent.
  // Using it after the exporter destroyed the event is undefined behaviour.
  virtual Result<Event> OpenEvent(const IpcEventHandle& handle) = 0;

  // Where RAII owners (device_handles.h) report a failure while tearing down, since destructors
  // never throw and return nothing. The default writes one line to stderr.
  virtual void ReportTeardownError(const Status& status);

  // Ok, or the sticky error that left this process's context on the device unusable (CUDA's
  // illegal address, launch failure, ECC error, ...): every later call fails with it, and only a
  // restart of the process recovers. Users refuse new work on a poisoned backend, naming it.
  virtual Status sticky_error() const { return Status::Ok(); }
};

}  // namespace spdl::cuda
