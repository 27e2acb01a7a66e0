// RAII owners of the objects a DeviceBackend makes: streams, events, device buffers, host
// registrations and IPC memory mappings.
//
// Each owner is move-only, holds the backend it came from (borrowed: the backend must outlive every
// owner made from it) and undoes its object exactly once on destruction or reset(). Destructors never
// throw: a failure is reported through DeviceBackend::ReportTeardownError and otherwise ignored.
// release() gives the object up without undoing it (a deliberate leak, e.g. when undoing it could
// corrupt memory a stuck copy is still using).
//
// Teardown order, for whoever holds several of these (declare members in the reverse of it, since
// C++ destroys members last-declared first):
//   1. let the work on every stream finish (SynchronizeStream / the last event; never free memory
//      that a queued copy or kernel still uses),
//   2. events (created and opened),
//   3. streams,
//   4. IPC memory mappings (importer side), then device buffers (exporter side, only after every
//      importer has closed its mapping),
//   5. host registrations (after the last copy from the host memory has run).
//
// Thread safety: like any value: one owner at a time.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "cuda/device_backend.h"

namespace spdl::cuda {

namespace internal {

// Kind: `using Handle`, `static Handle Empty()`, `static bool IsEmpty(const Handle&)`,
// `static Status Destroy(DeviceBackend&, const Handle&)`, `static constexpr const char* kWhat`.
template <typename Kind>
class Owned {
 public:
  using Handle = typename Kind::Handle;

  Owned() = default;
  Owned(DeviceBackend* backend, Handle handle) : backend_(backend), handle_(handle) {}
  ~Owned() { reset(); }
  Owned(Owned&& o) noexcept : backend_(o.backend_), handle_(std::exchange(o.handle_, Kind::Empty())) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      handle_ = std::exchange(o.handle_, Kind::Empty());
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;

  const Handle& get() const { return handle_; }
  bool valid() const { return !Kind::IsEmpty(handle_); }
  explicit operator bool() const { return valid(); }
  DeviceBackend* backend() const { return backend_; }

  // Undoes the object now (if any); failures are reported, not returned.
  void reset() noexcept {
    if (Kind::IsEmpty(handle_)) return;
    const Handle h = std::exchange(handle_, Kind::Empty());
    Status s = Kind::Destroy(*backend_, h);
    if (!s.ok()) backend_->ReportTeardownError(s.WithPrefix(Kind::kWhat));
  }
  // Undoes the object now and returns how that went (for teardown paths that want the Status).
  Status Close() {
    if (Kind::IsEmpty(handle_)) return Status::Ok();
    const Handle h = std::exchange(handle_, Kind::Empty());
    return Kind::Destroy(*backend_, h).WithPrefix(Kind::kWhat);
  }
  // Gives the object up without undoing it.
  Handle release() { return std::exchange(handle_, Kind::Empty()); }

 private:
  DeviceBackend* backend_ = nullptr;
  Handle handle_ = Kind::Empty();
};

struct StreamKind {
  using Handle = Stream;
  // A null handle is the default stream, which is never owned; "empty" therefore means null.
  static Handle Empty() { return Stream{}; }
  static bool IsEmpty(const Handle& h) { return h.handle == nullptr; }
  static Status Destroy(DeviceBackend& b, const Handle& h) { return b.DestroyStream(h); }
  static constexpr const char* kWhat = "destroying a stream";
};

struct EventKind {
  using Handle = Event;
  static Handle Empty() { return Event{}; }
  static bool IsEmpty(const Handle& h) { return h.handle == nullptr; }
  static Status Destroy(DeviceBackend& b, const Handle& h) { return b.DestroyEvent(h); }
  static constexpr const char* kWhat = "destroying an event";
};

struct Span {
  void* ptr = nullptr;
  size_t bytes = 0;
};

struct DeviceBufferKind {
  using Handle = Span;
  static Handle Empty() { return Span{}; }
  static bool IsEmpty(const Handle& h) { return h.ptr == nullptr; }
  static Status Destroy(DeviceBackend& b, const Handle& h) { return b.DeviceFree(h.ptr); }
  static constexpr const char* kWhat = "freeing device memory";
};

struct HostRegistrationKind {
  using Handle = Span;
  static Handle Empty() { return Span{}; }
  static bool IsEmpty(const Handle& h) { return h.ptr == nullptr; }
  static Status Destroy(DeviceBackend& b, const Handle& h) { return b.HostUnregister(h.ptr); }
  static constexpr const char* kWhat = "unregistering host memory";
};

struct IpcMappingKind {
  using Handle = void*;
  static Handle Empty() { return nullptr; }
  static bool IsEmpty(const Handle& h) { return h == nullptr; }
  static Status Destroy(DeviceBackend& b, const Handle& h) { return b.CloseMemory(h); }
  static constexpr const char* kWhat = "closing an IPC memory mapping";
};

}  // namespace internal

// A stream made by DeviceBackend::CreateStream. Never the default stream.
using StreamHandle = internal::Owned<internal::StreamKind>;
// An event made by CreateEvent or opened by OpenEvent.
using EventHandle = internal::Owned<internal::EventKind>;
// Device memory from DeviceAlloc: get().ptr, get().bytes.
using DeviceBuffer = internal::Owned<internal::DeviceBufferKind>;
// A page-locked host range from HostRegister: get().ptr, get().bytes.
using HostRegistration = internal::Owned<internal::HostRegistrationKind>;
// Another process's allocation mapped by OpenMemory: get() is its base in this process.
using IpcMemMapping = internal::Owned<internal::IpcMappingKind>;

// Factories: make the object and wrap it, or return the backend's error.
Result<StreamHandle> MakeStream(DeviceBackend& backend);
Result<EventHandle> MakeEvent(DeviceBackend& backend, bool interprocess);
Result<EventHandle> OpenIpcEvent(DeviceBackend& backend, const IpcEventHandle& handle);
Result<DeviceBuffer> AllocDevice(DeviceBackend& backend, size_t bytes);
Result<HostRegistration> RegisterHost(DeviceBackend& backend, void* ptr, size_t bytes);
Result<IpcMemMapping> OpenIpcMemory(DeviceBackend& backend, const IpcMemHandle& handle);

// Makes `into` wait (on the GPU) for the work queued so far on every stream of `from` (one
// temporary event each; `into` itself and repeats are skipped), so that one event recorded on
// `into` afterwards covers the work of all of them (a batch used on several streams).
Status JoinStreams(DeviceBackend& backend, const std::vector<Stream>& from, Stream into);

}  // namespace spdl::cuda
