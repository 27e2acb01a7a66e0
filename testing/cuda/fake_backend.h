// FakeBackend: a DeviceBackend without a GPU, for testing the host-side logic everywhere.
//
// A FakeDevice is the "GPU": its memory is host memory, and every backend made on it is one
// simulated process (give each a name: "daemon", "client"). IPC handles exported by one FakeBackend
// open in another FakeBackend of the same FakeDevice, referring to the same memory and the same
// events, and fail in the exporting one, as with CUDA.
//
// Work runs at once: a copy is done before MemcpyH2DAsync returns, an event completes when recorded,
// unless the test holds it (SetEventPending) to stand for GPU work still in flight. Every call is
// appended to the device's call log with a global sequence number, so a test can check the order
// of calls across processes (e.g. "the daemon waited on the consumer's event before it copied into
// the slot again").
//
// The fake checks the rules CUDA leaves undefined or reports late, and fails the call with
// kFailedPrecondition instead: freeing memory another process still has open, using an imported
// event after its exporter destroyed it, overlapping host registrations, copies outside an
// allocation, exporting a non-interprocess event or a pointer that is not an allocation's base.
// It counts live objects (for leak checks) and can fail the next call of a kind (fault injection).
//
// Deterministic: ids are counters; nothing depends on addresses or time.
// Thread safety: FakeDevice and its backends are safe to share between threads (one mutex, held for
// every call).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuda/device_backend.h"

namespace spdl::cuda {

enum class FakeOp {
  kHostRegister,
  kHostUnregister,
  kAlloc,
  kFree,
  kCreateStream,
  kDestroyStream,
  kCreateEvent,
  kDestroyEvent,
  kCopyH2D,
  kCopyD2H,
  kRecord,
  kWait,
  kQuery,
  kSyncEvent,
  kSyncStream,
  kExportMemory,
  kExportEvent,
  kOpenMemory,
  kCloseMemory,
  kOpenEvent,
};
// "host_register", "copy_h2d", "wait", ...
const char* FakeOpName(FakeOp op);

// One call, as the fake saw it. Ids: `stream` is the calling process's stream id (0 = the default
// stream), `event` the device-wide id of the underlying event (the same in the exporting and the
// importing process), `alloc` the device-wide id of an allocation.
struct FakeCall {
  uint64_t seq = 0;      // order on the FakeDevice, across all processes
  std::string process;   // the FakeBackend's name
  FakeOp op = FakeOp::kAlloc;
  uint64_t stream = 0;
  uint64_t event = 0;
  uint64_t alloc = 0;
  uint64_t offset = 0;   // copies: offset of the device side within the allocation
  uint64_t bytes = 0;
  bool pinned = false;   // kCopyH2D / kCopyD2H: the host side lies in a registered range
  bool ok = true;        // false when the call failed
};
// "daemon copy_h2d stream=1 alloc=1+8192 bytes=4096 pinned", for failure messages.
std::string ToString(const FakeCall& call);

class FakeBackend;

class FakeDevice {
 public:
  // capacity_bytes: device memory; a DeviceAlloc past it fails with kResourceExhausted.
  explicit FakeDevice(uint64_t capacity_bytes = uint64_t{1} << 32, DeviceUuid uuid = DefaultUuid());
  ~FakeDevice();
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  static DeviceUuid DefaultUuid();

  // The whole call log, in order.
  std::vector<FakeCall> calls() const;
  void ClearCalls();

  struct Live {
    size_t allocations = 0, streams = 0, events = 0, registrations = 0, mappings = 0;
    uint64_t device_bytes = 0;
    bool empty() const { return allocations + streams + events + registrations + mappings == 0; }
  };
  // Objects made and not yet undone, over every process.
  Live live() const;

  // "Device memory" is host memory here: a DeviceAlloc or OpenMemory pointer may be read on the
  // host to check what a copy wrote.

 private:
  friend class FakeBackend;

  struct Allocation {
    uint64_t id = 0;
    std::string owner;
    uint8_t* bytes = nullptr;  // owned: aligned new[], freed by DeviceFree or ~FakeDevice
    size_t size = 0;
    int open_elsewhere = 0;  // processes that have it mapped through IPC
  };
  struct UnderlyingEvent {
    uint64_t id = 0;
    std::string owner;
    bool interprocess = false;
    bool pending = false;    // the latest record stands for work not yet run
    bool destroyed = false;  // the exporter destroyed it (importers must not use it any more)
    uint64_t records = 0;
    int refs = 0;            // local handles (created + opened) still alive
  };

  // REQUIRES: mu_ held. Appends to the log and returns the entry (to fill in).
  FakeCall& LogLocked(const std::string& process, FakeOp op);
  // REQUIRES: mu_ held. The allocation containing [ptr, ptr + bytes), or nullptr.
  Allocation* FindLocked(const void* ptr, size_t bytes, uint64_t* offset);

  const uint64_t capacity_bytes_;
  const DeviceUuid uuid_;

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::vector<FakeCall> calls_;
  uint64_t next_seq_ = 1;
  uint64_t next_alloc_id_ = 1;
  uint64_t next_event_id_ = 1;
  uint64_t used_bytes_ = 0;
  std::map<uintptr_t, Allocation> allocations_;  // by base address
  std::map<uint64_t, UnderlyingEvent> events_;   // by id
  size_t live_streams_ = 0;
  size_t live_registrations_ = 0;
  size_t live_mappings_ = 0;
  size_t live_local_events_ = 0;
};

class FakeBackend final : public DeviceBackend {
 public:
  // One simulated process on `device` (borrowed: must outlive the backend), seen as CUDA ordinal
  // `ordinal`. `process` names it in the call log.
  FakeBackend(FakeDevice& device, std::string process, int ordinal = 0);
  ~FakeBackend() override;

  // Makes the next call of kind `op` fail with `status` (once), without doing anything.
  void FailNext(FakeOp op, Status status);
  // Holds (or lets go) the work captured by `event`'s latest record, in every process: QueryEvent
  // says false and SynchronizeEvent fails with kUnavailable ("would block forever") while held.
  void SetEventPending(Event event, bool pending);
  // The device-wide id of a local event handle (0 if unknown), to match FakeCall::event.
  uint64_t EventId(Event event) const;
  // The process-local id of a stream (0 for the default stream or unknown), to match FakeCall::stream.
  uint64_t StreamId(Stream stream) const;
  // The device-wide id of the allocation holding `ptr` (0 if none), to match FakeCall::alloc.
  uint64_t AllocId(const void* ptr) const;
  // Teardown errors reported through ReportTeardownError, in order.
  std::vector<Status> teardown_errors() const;
  const std::string& process() const { return process_; }

  // DeviceBackend.
  const char* name() const override { return "fake"; }
  int device() const override { return ordinal_; }
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
  struct LocalEvent {
    uint64_t id = 0;  // FakeDevice::UnderlyingEvent id
    bool opened = false;
  };

  // REQUIRES: device_.mu_ held. A failure injected for `op`, consumed.
  std::optional<Status> TakeFailureLocked(FakeOp op);
  // REQUIRES: device_.mu_ held. Checks a stream handle; fills *id (0 = default).
  Status CheckStreamLocked(Stream stream, uint64_t* id) const;
  // REQUIRES: device_.mu_ held. The usable underlying event for a local handle.
  Result<FakeDevice::UnderlyingEvent*> UsableEventLocked(Event event, const char* op);
  // REQUIRES: device_.mu_ held. Whether [ptr, ptr + bytes) lies in a registered host range.
  bool PinnedLocked(const void* ptr, size_t bytes) const;
  Status CopyLocked(FakeOp op, void* dst, const void* src, size_t bytes, Stream stream);

  FakeDevice& device_;
  const std::string process_;
  const int ordinal_;

  // Guarded by device_.mu_.
  std::map<FakeOp, Status> failures_;
  std::map<uintptr_t, size_t> registrations_;    // host base -> bytes
  std::map<void*, uint64_t> streams_;            // handle -> local id
  uint64_t next_stream_id_ = 1;
  std::map<void*, LocalEvent> events_;           // handle -> event
  uint64_t next_local_event_ = 1;
  std::map<void*, std::pair<uint64_t, int>> mappings_;  // opened base -> (allocation id, opens)
  std::vector<Status> teardown_errors_;
};

}  // namespace spdl::cuda
