// FakeBackend: a DeviceBackend without a GPU, for testing the host-side logic everywhere.
//
// A FakeDevice is the "GPU": its memory is host memory, and every backend made on it is one
// simulated process (give each a name: "daemon", "client"). IPC handles exported by one FakeBackend
// open in another FakeBackend of the same FakeDevice, referring to the same memory and the same
// events, and fail in the exporting one, as with CUDA.
//
// Work and completion follow CUDA's rules (CODING.md, "CUDA rules"), not kinder ones:
//   - Data moves at once (a copy is done before MemcpyH2DAsync returns), but *completion* is
//     tracked as on a GPU: every copy, record and wait is a work item on its stream, after the
//     stream's previous item; a wait adds the waited event's latest record as a dependency. The
//     test holds work (SetEventPending) to stand for GPU work still in flight; everything queued
//     behind held work (on the same stream, or through a wait, in any process) is not complete
//     either.
//   - SynchronizeEvent / SynchronizeStream, DeviceFree and HostUnregister (which synchronize, as
//     cudaFree and cudaHostUnregister do) BLOCK until that work is complete. A wait that would
//     never end (nothing completes it within block_limit) is recorded as a violation ("would hang")
//     and the call fails with kUnavailable instead of hanging the test.
//   - A process that dies (Die(), or the FakeBackend destroyed) never completes its queued work; an
//     event it exported never completes in its importers, and neither does anything queued behind a
//     wait on it.
//   - What CUDA leaves undefined is recorded as a violation (violations(); tests assert none), not
//     refused: freeing memory another process still has open (the bytes stay valid until the last
//     importer closes, so a test reading them does not crash), destroying an exported event while
//     an importer has it open, using an imported event after its exporter destroyed it (this one
//     also fails the call).
//   - A sticky error (InjectStickyError) poisons the process: every later call fails with it.
// Refused at once, as CUDA does: overlapping host registrations, copies outside an allocation,
// exporting a non-interprocess event or a pointer that is not an allocation's base.
// It counts live objects (for leak checks) and can fail the next call of a kind (fault injection).
//
// Deterministic apart from block_limit: ids are counters; nothing depends on addresses.
// Thread safety: FakeDevice and its backends are safe to share between threads (one mutex, held for
// every call, released while a call blocks).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
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
  uint64_t seq = 0;     // order on the FakeDevice, across all processes
  std::string process;  // the FakeBackend's name
  FakeOp op = FakeOp::kAlloc;
  uint64_t stream = 0;
  uint64_t event = 0;
  uint64_t alloc = 0;
  uint64_t offset = 0;  // copies: offset of the device side within the allocation
  uint64_t bytes = 0;
  bool pinned = false;     // kCopyH2D / kCopyD2H: the host side lies in a registered range
  bool ok = true;          // false when the call failed
  std::thread::id thread;  // the calling thread
};
// "daemon copy_h2d stream=1 alloc=1+8192 bytes=4096 pinned", for failure messages.
std::string ToString(const FakeCall& call);

class FakeBackend;

class FakeDevice {
 public:
  // capacity_bytes: device memory; a DeviceAlloc past it fails with kResourceExhausted.
  // block_limit: how long a blocking call waits for held work before it is recorded as a hang.
  explicit FakeDevice(uint64_t capacity_bytes = uint64_t{1} << 32, DeviceUuid uuid = DefaultUuid(),
                      std::chrono::milliseconds block_limit = std::chrono::milliseconds(300));
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

  // What CUDA leaves undefined (or would hang on) that happened so far, one line each, in order.
  std::vector<std::string> violations() const;
  void ClearViolations();

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
    bool freed = false;      // freed by its owner while still open elsewhere (a violation)
  };
  struct UnderlyingEvent {
    uint64_t id = 0;
    std::string owner;
    bool interprocess = false;
    uint64_t work = 0;        // the work item of the latest record; 0 = never recorded (complete)
    bool destroyed = false;   // the exporter destroyed it (importers must not use it any more)
    bool owner_dead = false;  // the exporting process died: never completes for its importers
    uint64_t records = 0;
    int refs = 0;  // local handles (created + opened) still alive
  };
  // One copy, record or wait on a stream: complete when not held, not of a dead process, and
  // every dependency (the stream's previous item, a waited event's record) is complete.
  struct Work {
    std::string owner;
    bool held = false;
    bool dead = false;
    bool done = false;  // found complete (its deps then dropped)
    std::vector<uint64_t> deps;
  };

  // REQUIRES: mu_ held. Appends to the log and returns the entry (to fill in).
  FakeCall& LogLocked(const std::string& process, FakeOp op);
  // REQUIRES: mu_ held. The allocation containing [ptr, ptr + bytes), or nullptr.
  Allocation* FindLocked(const void* ptr, size_t bytes, uint64_t* offset);
  // REQUIRES: mu_ held. Whether work item `id` (0: none) is complete.
  bool DoneLocked(uint64_t id);
  // REQUIRES: mu_ held. A new work item of `owner` after `deps` (complete ones left out).
  uint64_t AddWorkLocked(const std::string& owner, const std::vector<uint64_t>& deps);
  // REQUIRES: lock holds mu_. Waits (releasing mu_) until done() or block_limit; on timeout records
  // the hang as a violation and returns kUnavailable naming `what`.
  template <typename Pred>
  Status BlockLocked(std::unique_lock<std::mutex>& lock, Pred done, const std::string& what);
  void ViolationLocked(std::string what);

  const uint64_t capacity_bytes_;
  const DeviceUuid uuid_;
  const std::chrono::milliseconds block_limit_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // work may have completed (SetEventPending)
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
  uint64_t next_work_id_ = 1;
  std::map<uint64_t, Work> works_;
  std::vector<std::string> violations_;
};

class FakeBackend final : public DeviceBackend {
 public:
  // One simulated process on `device` (borrowed: must outlive the backend), seen as CUDA ordinal
  // `ordinal`. `process` names it in the call log.
  FakeBackend(FakeDevice& device, std::string process, int ordinal = 0);
  ~FakeBackend() override;

  // Makes the next call of kind `op` fail with `status` (once), without doing anything.
  void FailNext(FakeOp op, Status status);
  // Holds (or lets go) the work captured by `event`'s latest record, in every process (a
  // never-recorded event gets a held record): QueryEvent says false while held, and so for every
  // event recorded behind it; blocking calls wait for it (see above).
  void SetEventPending(Event event, bool pending);
  // Every later call of this process fails with `status` (a sticky CUDA error: the context is
  // unusable until the process exits).
  void InjectStickyError(Status status);
  // The process dies: its queued work never completes, its exported events never complete in
  // their importers, every later call fails. The destructor does the same.
  void Die();
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
  Status sticky_error() const override;

 private:
  struct LocalEvent {
    uint64_t id = 0;  // FakeDevice::UnderlyingEvent id
    bool opened = false;
  };

  // REQUIRES: device_.mu_ held. A failure injected for `op`, consumed; the sticky error or death.
  std::optional<Status> TakeFailureLocked(FakeOp op);
  // REQUIRES: device_.mu_ held. Checks a stream handle; fills *id (0 = default).
  Status CheckStreamLocked(Stream stream, uint64_t* id) const;
  // REQUIRES: device_.mu_ held. The usable underlying event for a local handle.
  Result<FakeDevice::UnderlyingEvent*> UsableEventLocked(Event event, const char* op);
  // REQUIRES: device_.mu_ held. Whether [ptr, ptr + bytes) lies in a registered host range.
  bool PinnedLocked(const void* ptr, size_t bytes) const;
  Status CopyLocked(FakeOp op, void* dst, const void* src, size_t bytes, Stream stream);
  // REQUIRES: device_.mu_ held. Appends a work item to `stream` (checked), after its tail and `extra`.
  uint64_t EnqueueLocked(Stream stream, uint64_t extra = 0);
  // REQUIRES: device_.mu_ held. Whether every work item this process queued is complete.
  bool AllWorkDoneLocked();
  void DieLocked();

  FakeDevice& device_;
  const std::string process_;
  const int ordinal_;

  // Guarded by device_.mu_.
  std::map<FakeOp, Status> failures_;
  std::map<uintptr_t, size_t> registrations_;  // host base -> bytes
  std::map<void*, uint64_t> streams_;          // handle -> local id
  uint64_t next_stream_id_ = 1;
  std::map<void*, LocalEvent> events_;  // handle -> event
  uint64_t next_local_event_ = 1;
  std::map<void*, std::pair<uint64_t, int>> mappings_;  // opened base -> (allocation id, opens)
  std::vector<Status> teardown_errors_;
  std::map<void*, uint64_t> tails_;  // stream handle (nullptr: default) -> its latest work item
  std::vector<uint64_t> works_;      // work items queued by this process, maybe not complete
  std::optional<Status> sticky_;
  bool dead_ = false;
};

}  // namespace spdl::cuda
