// ShmFakeBackend: a TEST-ONLY DeviceBackend whose "GPU" spans processes, so the whole GPU protocol
// (CudaHandles, CudaConsumerEvents, BatchReady / Release on device slots) runs end to end through
// the real spdld process and real client processes on a machine without a GPU.
//
// NEVER used unless a test asks for it explicitly: the daemon's hidden flag
// `--test-only-fake-gpu DIR` (it logs a warning at start and for every device it fakes) and, in a
// client (built with SPDL_TEST_HOOKS), the environment variable SPDL_TEST_FAKE_GPU_DIR (the client
// prints a warning on stderr). Both sides must name the same directory: it is the "device".
//
// What stands for what:
//   device memory   a file DIR/mem-PID-N (size = the allocation), mapped MAP_SHARED. Its IPC
//                   handle is the file's name; OpenMemory maps the same file in another process,
//                   so a copy by the daemon is seen by the client, as through cudaIpcOpenMemHandle.
//                   DeviceFree unmaps and unlinks (a mapping in another process keeps the pages).
//   events          a one-page file DIR/ev-PID-N holding a record counter; its IPC handle is the
//                   file's name. Work is synchronous, so a recorded event is complete at once:
//                   QueryEvent is true, SynchronizeEvent returns at once — except an opened event
//                   whose exporting process died: as in CUDA it never completes (QueryEvent false,
//                   SynchronizeEvent records a "would hang" violation and fails, a stream that
//                   waited on it is blocked for ever and every later copy on it is a violation).
//   streams         opaque tokens; any handle is accepted as a stream (PyTorch passes 1 and 2 for
//                   the legacy and per-thread default streams), since work is synchronous.
//   copies          memcpy, done before MemcpyH2DAsync returns. The device side must lie inside an
//                   allocation or an opened mapping of this process (else kInvalidArgument).
// Like CUDA: OpenMemory / OpenEvent of a handle exported by the same process fails, handles of
// another directory fail, a non-interprocess event cannot be exported.
// Undefined behaviour is recorded, not refused (as FakeBackend does): freeing memory or destroying
// an exported event while a live importer still has it open happens (the importer's pages stay
// valid), and a line goes to DIR/violations (Violations(dir)), which tests assert empty. An
// importer marks what it holds open with a file DIR/open.NAME.PID (removed on close; a dead
// importer's marks do not count, nor do an exiting one's or one's exited and not yet reaped: the
// driver closes a process's mappings as it exits; nor do a poisoned one's: its context can no
// longer touch them, and it cannot close them either).
// Sticky errors: a file DIR/sticky-error-<physical> poisons that device for every process,
// DIR/sticky-error-<physical>-<PID> for that process only (CUDA's contexts are per process). A
// poisoned backend fails EVERY call with the error (sticky_error() returns it), as CUDA does; only
// its destructor still cleans up the files (Uuid() keeps answering: the device is still there).
//
// The device UUID is derived from (DIR, physical device), so every process of one test agrees on it.
// Like CUDA_VISIBLE_DEVICES, kFakeGpuVisibleEnv ("1,0") numbers the fake devices differently in one
// process: its ordinal i is the physical fake device of the list's i-th entry (default: i, with
// kFakeDevices devices).
// Thread safety: safe to share between threads (one mutex).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda/device_backend.h"

namespace spdl::cuda {

// The environment variable a client reads to use this backend (test-only).
inline constexpr const char* kFakeGpuDirEnv = "SPDL_TEST_FAKE_GPU_DIR";
// The test-only CUDA_VISIBLE_DEVICES of the fake: a comma-separated list of physical fake devices.
inline constexpr const char* kFakeGpuVisibleEnv = "SPDL_TEST_FAKE_GPU_VISIBLE";
// The file (+ the physical device's number) that poisons a fake device: see sticky_error().
inline constexpr const char* kStickyErrorFile = "sticky-error-";
// Physical fake devices there are (without kFakeGpuVisibleEnv, this process sees them all).
inline constexpr int kFakeDevices = 4;

class ShmFakeBackend final : public DeviceBackend {
 public:
  // `dir` must be an existing, writable directory shared by the processes of the test.
  // `physical` >= 0: the physical fake device behind `ordinal` (ignoring kFakeGpuVisibleEnv); -1: as
  // that variable says. Fails for an ordinal this process does not see.
  static Result<std::unique_ptr<ShmFakeBackend>> Create(std::string dir, int ordinal = 0, int physical = -1);
  // How many fake devices this process sees (kFakeGpuVisibleEnv, else kFakeDevices).
  static int VisibleCount();
  ~ShmFakeBackend() override;

  // Objects made by this process and not yet undone (for leak checks in tests).
  struct Live {
    size_t allocations = 0, mappings = 0, events = 0, streams = 0, registrations = 0;
  };
  Live live() const;
  const std::string& dir() const { return dir_; }

  const char* name() const override { return "shmfake"; }
  int device() const override { return ordinal_; }
  Result<DeviceUuid> Uuid() override;
  // A test poisons the fake device by writing the error's text to DIR/sticky-error-<physical>
  // (kStickyErrorFile + the number; every process) or DIR/sticky-error-<physical>-<PID> (one
  // process): then this is that error, and every other call fails with it.
  Status sticky_error() const override;
  // The undefined-behaviour and would-hang violations any process of `dir` recorded, one per line
  // of DIR/violations (empty when there were none).
  static std::vector<std::string> Violations(const std::string& dir);
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

 private:
  struct Region {
    std::string name;  // file name in dir_
    size_t bytes = 0;
    bool owned = false;  // made here (DeviceAlloc): unlinked on free
  };
  struct LocalEvent {
    std::string name;
    void* page = nullptr;  // the mapped counter page
    bool owned = false;
    bool interprocess = false;
  };

  ShmFakeBackend(std::string dir, int ordinal, int physical);
  // REQUIRES: mu_ held. Whether [p, p + n) lies inside an allocation or mapping.
  bool DeviceRangeLocked(const void* p, size_t n) const;
  Result<LocalEvent*> EventLocked(Event event, const char* op);
  Result<void*> MapFile(const std::string& name, size_t bytes, bool create);
  // DIR/open.NAME.PID: this process holds `name` open (an importer's mark).
  std::string OpenMark(const std::string& name) const;
  // The live processes other than this one that hold `name` open (their marks).
  std::vector<int> LiveImporters(const std::string& name) const;
  // Appends one line to DIR/violations (and stderr).
  void RecordViolation(const std::string& what) const;
  // Whether the process that made the file `name` (mem-PID-N / ev-PID-N) is gone.
  static bool ExporterDead(const std::string& name);

  const std::string dir_;
  const int ordinal_;
  const int physical_;  // the physical fake device (its UUID)

  mutable std::mutex mu_;
  // Guarded by mu_.
  uint64_t next_id_ = 1;
  std::map<uintptr_t, Region> regions_;        // base -> allocation (owned) or mapping
  std::map<uintptr_t, size_t> registrations_;  // host base -> bytes
  std::set<void*> streams_;
  std::set<void*> blocked_streams_;  // waited on an event that never completes: blocked for ever
  std::map<void*, std::unique_ptr<LocalEvent>> events_;
};

}  // namespace spdl::cuda
