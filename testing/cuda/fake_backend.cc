#include "cuda/fake_backend.h"

#include <cstdio>
#include <cstring>
#include <new>
#include <utility>

namespace spdl::cuda {
namespace {

constexpr char kMemMagic[8] = {'F', 'A', 'K', 'E', 'M', 'E', 'M', 0};
constexpr char kEventMagic[8] = {'F', 'A', 'K', 'E', 'E', 'V', 'T', 0};
constexpr uintptr_t kStreamTag = uintptr_t{1} << 40;
constexpr uintptr_t kEventTag = uintptr_t{2} << 40;
constexpr size_t kAllocAlign = 4096;

template <typename H>
H EncodeHandle(const char (&magic)[8], uint64_t id) {
  H h;
  std::memcpy(h.bytes.data(), magic, 8);
  std::memcpy(h.bytes.data() + 8, &id, sizeof(id));
  return h;
}

template <typename H>
uint64_t DecodeHandle(const char (&magic)[8], const H& h) {
  if (std::memcmp(h.bytes.data(), magic, 8) != 0) return 0;
  uint64_t id = 0;
  std::memcpy(&id, h.bytes.data() + 8, sizeof(id));
  return id;
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

struct AlignedDelete {
  void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{kAllocAlign}); }
};

}  // namespace

const char* FakeOpName(FakeOp op) {
  switch (op) {
    case FakeOp::kHostRegister:
      return "host_register";
    case FakeOp::kHostUnregister:
      return "host_unregister";
    case FakeOp::kAlloc:
      return "alloc";
    case FakeOp::kFree:
      return "free";
    case FakeOp::kCreateStream:
      return "create_stream";
    case FakeOp::kDestroyStream:
      return "destroy_stream";
    case FakeOp::kCreateEvent:
      return "create_event";
    case FakeOp::kDestroyEvent:
      return "destroy_event";
    case FakeOp::kCopyH2D:
      return "copy_h2d";
    case FakeOp::kCopyD2H:
      return "copy_d2h";
    case FakeOp::kRecord:
      return "record";
    case FakeOp::kWait:
      return "wait";
    case FakeOp::kQuery:
      return "query";
    case FakeOp::kSyncEvent:
      return "sync_event";
    case FakeOp::kSyncStream:
      return "sync_stream";
    case FakeOp::kExportMemory:
      return "export_memory";
    case FakeOp::kExportEvent:
      return "export_event";
    case FakeOp::kOpenMemory:
      return "open_memory";
    case FakeOp::kCloseMemory:
      return "close_memory";
    case FakeOp::kOpenEvent:
      return "open_event";
  }
  return "unknown";
}

std::string ToString(const FakeCall& c) {
  std::string s = "#" + std::to_string(c.seq) + " " + c.process + " " + FakeOpName(c.op);
  if (c.stream != 0) s += " stream=" + std::to_string(c.stream);
  if (c.event != 0) s += " event=" + std::to_string(c.event);
  if (c.alloc != 0) s += " alloc=" + std::to_string(c.alloc) + "+" + std::to_string(c.offset);
  if (c.bytes != 0) s += " bytes=" + std::to_string(c.bytes);
  if (c.pinned) s += " pinned";
  if (!c.ok) s += " FAILED";
  return s;
}

// ------------------------------------------------------------------------------------ FakeDevice

FakeDevice::FakeDevice(uint64_t capacity_bytes, DeviceUuid uuid, std::chrono::milliseconds block_limit)
    : capacity_bytes_(capacity_bytes), uuid_(uuid), block_limit_(block_limit) {}

FakeDevice::~FakeDevice() {
  for (auto& [base, a] : allocations_) AlignedDelete{}(a.bytes);
}

DeviceUuid FakeDevice::DefaultUuid() {
  DeviceUuid u{};
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<uint8_t>(0xf0 + i);
  return u;
}

std::vector<FakeCall> FakeDevice::calls() const {
  std::lock_guard lock(mu_);
  return calls_;
}

void FakeDevice::ClearCalls() {
  std::lock_guard lock(mu_);
  calls_.clear();
}

FakeDevice::Live FakeDevice::live() const {
  std::lock_guard lock(mu_);
  Live l;
  l.allocations = allocations_.size();
  l.streams = live_streams_;
  l.events = live_local_events_;
  l.registrations = live_registrations_;
  l.mappings = live_mappings_;
  l.device_bytes = used_bytes_;
  return l;
}

std::vector<std::string> FakeDevice::violations() const {
  std::lock_guard lock(mu_);
  return violations_;
}

void FakeDevice::ClearViolations() {
  std::lock_guard lock(mu_);
  violations_.clear();
}

void FakeDevice::ViolationLocked(std::string what) { violations_.push_back(std::move(what)); }

bool FakeDevice::DoneLocked(uint64_t id) {
  // Iterative (a long chain of held work must not overflow the stack).
  std::vector<uint64_t> stack{id};
  while (!stack.empty()) {
    const uint64_t cur = stack.back();
    auto it = works_.find(cur);
    if (cur == 0 || it == works_.end() || it->second.done) {
      stack.pop_back();
      continue;
    }
    Work& w = it->second;
    if (w.held || w.dead) return false;
    bool all = true;
    for (uint64_t d : w.deps) {
      auto dit = works_.find(d);
      if (d == 0 || dit == works_.end() || dit->second.done) continue;
      if (dit->second.held || dit->second.dead) return false;
      stack.push_back(d);
      all = false;
      break;
    }
    if (all) {
      w.done = true;
      w.deps.clear();
      stack.pop_back();
    }
  }
  return true;
}

uint64_t FakeDevice::AddWorkLocked(const std::string& owner, const std::vector<uint64_t>& deps) {
  Work w;
  w.owner = owner;
  for (uint64_t d : deps) {
    if (!DoneLocked(d)) w.deps.push_back(d);
  }
  w.done = w.deps.empty();
  const uint64_t id = next_work_id_++;
  works_.emplace(id, std::move(w));
  return id;
}

template <typename Pred>
Status FakeDevice::BlockLocked(std::unique_lock<std::mutex>& lock, Pred done, const std::string& what) {
  if (cv_.wait_for(lock, block_limit_, done)) return Status::Ok();
  ViolationLocked(what + " would hang: the work it waits for never completes");
  return Unavailable(what + ": would block forever (the work it waits for never completes)");
}

FakeCall& FakeDevice::LogLocked(const std::string& process, FakeOp op) {
  FakeCall& c = calls_.emplace_back();
  c.seq = next_seq_++;
  c.process = process;
  c.op = op;
  c.thread = std::this_thread::get_id();
  return c;
}

FakeDevice::Allocation* FakeDevice::FindLocked(const void* ptr, size_t bytes, uint64_t* offset) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = allocations_.upper_bound(p);
  if (it == allocations_.begin()) return nullptr;
  --it;
  Allocation& a = it->second;
  if (p < it->first || p - it->first > a.size || a.size - (p - it->first) < bytes) return nullptr;
  if (offset) *offset = p - it->first;
  return &a;
}

// ----------------------------------------------------------------------------------- FakeBackend

FakeBackend::FakeBackend(FakeDevice& device, std::string process, int ordinal)
    : device_(device), process_(std::move(process)), ordinal_(ordinal) {}

FakeBackend::~FakeBackend() {
  std::lock_guard lock(device_.mu_);
  DieLocked();
}

void FakeBackend::Die() {
  std::lock_guard lock(device_.mu_);
  DieLocked();
}

void FakeBackend::DieLocked() {
  if (dead_) return;
  dead_ = true;
  for (uint64_t id : works_) {
    if (device_.DoneLocked(id)) continue;
    auto it = device_.works_.find(id);
    if (it != device_.works_.end()) it->second.dead = true;
  }
  for (auto& [id, u] : device_.events_) {
    if (u.owner == process_) u.owner_dead = true;
  }
  // The driver closes what the process had open: its event handles and its IPC mappings.
  for (auto& [handle, local] : events_) {
    auto it = device_.events_.find(local.id);
    if (it != device_.events_.end() && --it->second.refs == 0) device_.events_.erase(it);
    --device_.live_local_events_;
  }
  events_.clear();
  for (auto& [base, m] : mappings_) {
    auto a = device_.allocations_.find(reinterpret_cast<uintptr_t>(base));
    if (a != device_.allocations_.end() && --a->second.open_elsewhere == 0 && a->second.freed) {
      AlignedDelete{}(a->second.bytes);
      device_.allocations_.erase(a);
    }
    --device_.live_mappings_;
  }
  mappings_.clear();
  device_.cv_.notify_all();
}

Status FakeBackend::sticky_error() const {
  std::lock_guard lock(device_.mu_);
  return sticky_ ? *sticky_ : Status::Ok();
}

void FakeBackend::InjectStickyError(Status status) {
  std::lock_guard lock(device_.mu_);
  sticky_ = std::move(status);
}

bool FakeBackend::AllWorkDoneLocked() {
  std::vector<uint64_t> open;
  for (uint64_t id : works_) {
    if (!device_.DoneLocked(id)) open.push_back(id);
  }
  works_.swap(open);
  return works_.empty();
}

uint64_t FakeBackend::EnqueueLocked(Stream stream, uint64_t extra) {
  uint64_t& tail = tails_[stream.handle];
  tail = device_.AddWorkLocked(process_, {tail, extra});
  works_.push_back(tail);
  return tail;
}

void FakeBackend::FailNext(FakeOp op, Status status) {
  std::lock_guard lock(device_.mu_);
  failures_[op] = std::move(status);
}

std::optional<Status> FakeBackend::TakeFailureLocked(FakeOp op) {
  if (dead_ || sticky_) {
    device_.LogLocked(process_, op).ok = false;
    if (dead_) return Unavailable("process " + process_ + " is dead");
    return sticky_;
  }
  auto it = failures_.find(op);
  if (it == failures_.end()) return std::nullopt;
  Status s = std::move(it->second);
  failures_.erase(it);
  device_.LogLocked(process_, op).ok = false;
  return s;
}

void FakeBackend::SetEventPending(Event event, bool pending) {
  std::lock_guard lock(device_.mu_);
  auto it = events_.find(event.handle);
  if (it == events_.end()) return;
  FakeDevice::UnderlyingEvent& u = device_.events_[it->second.id];
  if (u.work == 0) {
    if (!pending) return;
    u.work = device_.AddWorkLocked(process_, {});
  }
  FakeDevice::Work& w = device_.works_[u.work];
  w.held = pending;
  if (pending) w.done = false;
  device_.cv_.notify_all();
}

uint64_t FakeBackend::EventId(Event event) const {
  std::lock_guard lock(device_.mu_);
  auto it = events_.find(event.handle);
  return it == events_.end() ? 0 : it->second.id;
}

uint64_t FakeBackend::StreamId(Stream stream) const {
  std::lock_guard lock(device_.mu_);
  auto it = streams_.find(stream.handle);
  return it == streams_.end() ? 0 : it->second;
}

uint64_t FakeBackend::AllocId(const void* ptr) const {
  std::lock_guard lock(device_.mu_);
  FakeDevice::Allocation* a = device_.FindLocked(ptr, 0, nullptr);
  return a ? a->id : 0;
}

std::vector<Status> FakeBackend::teardown_errors() const {
  std::lock_guard lock(device_.mu_);
  return teardown_errors_;
}

void FakeBackend::ReportTeardownError(const Status& status) {
  std::lock_guard lock(device_.mu_);
  teardown_errors_.push_back(status);
}

Result<DeviceUuid> FakeBackend::Uuid() { return device_.uuid_; }

Status FakeBackend::HostRegister(void* ptr, size_t bytes) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kHostRegister)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kHostRegister);
  c.bytes = bytes;
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  if (ptr == nullptr || bytes == 0) {
    c.ok = false;
    return InvalidArgument("HostRegister: empty range");
  }
  // Overlap with an existing registration?
  auto it = registrations_.upper_bound(p + bytes - 1);
  if (it != registrations_.begin()) {
    --it;
    if (it->first + it->second > p) {
      c.ok = false;
      return FailedPrecondition("HostRegister of " + Hex(ptr) +
                                ": overlaps a registered range (cudaErrorHostMemoryAlreadyRegistered)");
    }
  }
  registrations_[p] = bytes;
  ++device_.live_registrations_;
  return Status::Ok();
}

Status FakeBackend::HostUnregister(void* ptr) {
  std::unique_lock lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kHostUnregister)) return *f;
  // cudaHostUnregister synchronizes: it waits for the queued work of this process.
  SPDL_RETURN_IF_ERROR(device_.BlockLocked(
      lock, [this] { return AllWorkDoneLocked(); }, process_ + " HostUnregister of " + Hex(ptr)));
  FakeCall& c = device_.LogLocked(process_, FakeOp::kHostUnregister);
  auto it = registrations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == registrations_.end()) {
    c.ok = false;
    return FailedPrecondition("HostUnregister of " + Hex(ptr) + ": not registered (cudaErrorHostMemoryNotRegistered)");
  }
  c.bytes = it->second;
  registrations_.erase(it);
  --device_.live_registrations_;
  return Status::Ok();
}

Result<void*> FakeBackend::DeviceAlloc(size_t bytes) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kAlloc)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kAlloc);
  c.bytes = bytes;
  if (bytes == 0) {
    c.ok = false;
    return InvalidArgument("DeviceAlloc of 0 bytes");
  }
  if (bytes > device_.capacity_bytes_ - device_.used_bytes_) {
    c.ok = false;
    return ResourceExhausted("DeviceAlloc of " + std::to_string(bytes) + " bytes: out of memory (" +
                             std::to_string(device_.capacity_bytes_ - device_.used_bytes_) +
                             " bytes free on the fake device)");
  }
  auto* raw = static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{kAllocAlign}));
  FakeDevice::Allocation a;
  a.id = device_.next_alloc_id_++;
  a.owner = process_;
  a.bytes = raw;
  a.size = bytes;
  c.alloc = a.id;
  device_.used_bytes_ += bytes;
  device_.allocations_.emplace(reinterpret_cast<uintptr_t>(raw), std::move(a));
  return static_cast<void*>(raw);
}

Status FakeBackend::DeviceFree(void* ptr) {
  std::unique_lock lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kFree)) return *f;
  // cudaFree synchronizes: it waits for the queued work of this process.
  SPDL_RETURN_IF_ERROR(device_.BlockLocked(
      lock, [this] { return AllWorkDoneLocked(); }, process_ + " DeviceFree of " + Hex(ptr)));
  FakeCall& c = device_.LogLocked(process_, FakeOp::kFree);
  auto it = device_.allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == device_.allocations_.end() || it->second.owner != process_ || it->second.freed) {
    c.ok = false;
    return InvalidArgument("DeviceFree of " + Hex(ptr) + ": not an allocation of this process");
  }
  c.alloc = it->second.id;
  c.bytes = it->second.size;
  if (it->second.open_elsewhere > 0) {
    // Undefined with CUDA: recorded, and the bytes stay until the last importer closes them.
    device_.ViolationLocked(process_ + " freed allocation " + std::to_string(it->second.id) + " while " +
                            std::to_string(it->second.open_elsewhere) +
                            " other process(es) still have it open through IPC");
    it->second.freed = true;
    device_.used_bytes_ -= it->second.size;
    return Status::Ok();
  }
  device_.used_bytes_ -= it->second.size;
  AlignedDelete{}(it->second.bytes);
  device_.allocations_.erase(it);
  return Status::Ok();
}

Result<Stream> FakeBackend::CreateStream() {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kCreateStream)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kCreateStream);
  const uint64_t id = next_stream_id_++;
  void* h = reinterpret_cast<void*>(kStreamTag | id);
  streams_[h] = id;
  c.stream = id;
  ++device_.live_streams_;
  return Stream{h};
}

Status FakeBackend::DestroyStream(Stream stream) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kDestroyStream)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kDestroyStream);
  auto it = streams_.find(stream.handle);
  if (it == streams_.end()) {
    c.ok = false;
    return InvalidArgument("DestroyStream: unknown stream");
  }
  c.stream = it->second;
  streams_.erase(it);
  --device_.live_streams_;
  return Status::Ok();
}

Status FakeBackend::CheckStreamLocked(Stream stream, uint64_t* id) const {
  *id = 0;
  if (stream.handle == nullptr) return Status::Ok();
  auto it = streams_.find(stream.handle);
  if (it == streams_.end()) return InvalidArgument("unknown stream (cudaErrorInvalidResourceHandle)");
  *id = it->second;
  return Status::Ok();
}

Result<Event> FakeBackend::CreateEvent(bool interprocess) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kCreateEvent)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kCreateEvent);
  FakeDevice::UnderlyingEvent u;
  u.id = device_.next_event_id_++;
  u.owner = process_;
  u.interprocess = interprocess;
  u.refs = 1;
  c.event = u.id;
  void* h = reinterpret_cast<void*>(kEventTag | next_local_event_++);
  events_[h] = LocalEvent{u.id, false};
  device_.events_.emplace(u.id, u);
  ++device_.live_local_events_;
  return Event{h};
}

Status FakeBackend::DestroyEvent(Event event) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kDestroyEvent)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kDestroyEvent);
  auto it = events_.find(event.handle);
  if (it == events_.end()) {
    c.ok = false;
    return InvalidArgument("DestroyEvent: unknown event");
  }
  c.event = it->second.id;
  FakeDevice::UnderlyingEvent& u = device_.events_[it->second.id];
  if (!it->second.opened) {  // the exporter's own handle: importers lose it
    u.destroyed = true;
    if (u.refs > 1) {
      device_.ViolationLocked(process_ + " destroyed exported event " + std::to_string(u.id) + " while " +
                              std::to_string(u.refs - 1) + " importer handle(s) still have it open");
    }
  }
  if (--u.refs == 0) device_.events_.erase(u.id);
  events_.erase(it);
  --device_.live_local_events_;
  return Status::Ok();
}

Result<FakeDevice::UnderlyingEvent*> FakeBackend::UsableEventLocked(Event event, const char* op) {
  auto it = events_.find(event.handle);
  if (it == events_.end()) {
    return InvalidArgument(std::string(op) + ": unknown event (cudaErrorInvalidResourceHandle)");
  }
  FakeDevice::UnderlyingEvent& u = device_.events_[it->second.id];
  if (u.destroyed) {
    device_.ViolationLocked(process_ + " used event " + std::to_string(u.id) + " (" + op +
                            ") after its exporter destroyed it");
    return FailedPrecondition(std::string(op) + ": event " + std::to_string(u.id) +
                              " was destroyed by its exporting process " + u.owner +
                              " (undefined behaviour with CUDA)");
  }
  return &u;
}

bool FakeBackend::PinnedLocked(const void* ptr, size_t bytes) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = registrations_.upper_bound(p);
  if (it == registrations_.begin()) return false;
  --it;
  return p >= it->first && p + bytes <= it->first + it->second;
}

Status FakeBackend::CopyLocked(FakeOp op, void* dst, const void* src, size_t bytes, Stream stream) {
  if (auto f = TakeFailureLocked(op)) return *f;
  FakeCall& c = device_.LogLocked(process_, op);
  c.bytes = bytes;
  Status s = CheckStreamLocked(stream, &c.stream);
  if (!s.ok()) {
    c.ok = false;
    return s;
  }
  const void* dev = op == FakeOp::kCopyH2D ? dst : src;
  const void* host = op == FakeOp::kCopyH2D ? src : dst;
  FakeDevice::Allocation* a = device_.FindLocked(dev, bytes, &c.offset);
  if (a == nullptr) {
    c.ok = false;
    return InvalidArgument(std::string(FakeOpName(op)) + ": " + std::to_string(bytes) + " bytes at " + Hex(dev) +
                           " are not inside one device allocation");
  }
  if (a->owner != process_ && mappings_.count(static_cast<void*>(a->bytes)) == 0) {
    c.ok = false;
    return InvalidArgument(std::string(FakeOpName(op)) + ": allocation " + std::to_string(a->id) +
                           " is not mapped in process " + process_);
  }
  c.alloc = a->id;
  c.pinned = PinnedLocked(host, bytes);
  std::memcpy(dst, src, bytes);
  EnqueueLocked(stream);
  return Status::Ok();
}

Status FakeBackend::MemcpyH2DAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  std::lock_guard lock(device_.mu_);
  return CopyLocked(FakeOp::kCopyH2D, dst, src, bytes, stream);
}

Status FakeBackend::MemcpyD2HAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  std::lock_guard lock(device_.mu_);
  return CopyLocked(FakeOp::kCopyD2H, dst, src, bytes, stream);
}

Status FakeBackend::RecordEvent(Event event, Stream stream) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kRecord)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kRecord);
  Status s = CheckStreamLocked(stream, &c.stream);
  auto u = UsableEventLocked(event, "RecordEvent");
  if (!s.ok() || !u.ok()) {
    c.ok = false;
    return s.ok() ? u.status() : s;
  }
  c.event = (*u)->id;
  ++(*u)->records;
  (*u)->work = EnqueueLocked(stream);
  return Status::Ok();
}

Status FakeBackend::StreamWaitEvent(Stream stream, Event event) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kWait)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kWait);
  Status s = CheckStreamLocked(stream, &c.stream);
  auto u = UsableEventLocked(event, "StreamWaitEvent");
  if (!s.ok() || !u.ok()) {
    c.ok = false;
    return s.ok() ? u.status() : s;
  }
  c.event = (*u)->id;
  // Later work on the stream waits for the event's latest record (never for a later one).
  const uint64_t w = EnqueueLocked(stream, (*u)->work);
  if ((*u)->owner_dead && (*u)->owner != process_) {  // its exporter died: this wait never ends
    FakeDevice::Work& work = device_.works_[w];
    work.dead = true;
    work.done = false;
  }
  return Status::Ok();
}

Result<bool> FakeBackend::QueryEvent(Event event) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kQuery)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kQuery);
  auto u = UsableEventLocked(event, "QueryEvent");
  if (!u.ok()) {
    c.ok = false;
    return u.status();
  }
  c.event = (*u)->id;
  if ((*u)->owner_dead && (*u)->owner != process_) return false;  // its exporter died: never
  return device_.DoneLocked((*u)->work);
}

Status FakeBackend::SynchronizeEvent(Event event) {
  std::unique_lock lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kSyncEvent)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kSyncEvent);
  auto u = UsableEventLocked(event, "SynchronizeEvent");
  if (!u.ok()) {
    c.ok = false;
    return u.status();
  }
  const uint64_t id = (*u)->id;
  c.event = id;
  const bool never = (*u)->owner_dead && (*u)->owner != process_;
  const uint64_t work = (*u)->work;
  Status s = device_.BlockLocked(
      lock, [&] { return !never && device_.DoneLocked(work); },
      process_ + " SynchronizeEvent of event " + std::to_string(id));
  if (!s.ok()) device_.LogLocked(process_, FakeOp::kSyncEvent).ok = false;
  return s;
}

Status FakeBackend::SynchronizeStream(Stream stream) {
  std::unique_lock lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kSyncStream)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kSyncStream);
  Status s = CheckStreamLocked(stream, &c.stream);
  if (!s.ok()) {
    c.ok = false;
    return s;
  }
  const uint64_t work = tails_[stream.handle];
  return device_.BlockLocked(
      lock, [&] { return device_.DoneLocked(work); }, process_ + " SynchronizeStream");
}

Result<IpcMemHandle> FakeBackend::ExportMemory(void* base) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kExportMemory)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kExportMemory);
  auto it = device_.allocations_.find(reinterpret_cast<uintptr_t>(base));
  if (it == device_.allocations_.end() || it->second.owner != process_ || it->second.freed) {
    c.ok = false;
    return InvalidArgument("ExportMemory of " + Hex(base) + ": not the base of an allocation of this process");
  }
  c.alloc = it->second.id;
  return EncodeHandle<IpcMemHandle>(kMemMagic, it->second.id);
}

Result<IpcEventHandle> FakeBackend::ExportEvent(Event event) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kExportEvent)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kExportEvent);
  auto u = UsableEventLocked(event, "ExportEvent");
  if (!u.ok()) {
    c.ok = false;
    return u.status();
  }
  c.event = (*u)->id;
  if (!(*u)->interprocess || events_[event.handle].opened) {
    c.ok = false;
    return InvalidArgument("ExportEvent: event " + std::to_string(c.event) +
                           " was not created with cudaEventInterprocess in this process");
  }
  return EncodeHandle<IpcEventHandle>(kEventMagic, (*u)->id);
}

Result<void*> FakeBackend::OpenMemory(const IpcMemHandle& handle) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kOpenMemory)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kOpenMemory);
  const uint64_t id = DecodeHandle(kMemMagic, handle);
  for (auto& [base, a] : device_.allocations_) {
    if (a.id != id || id == 0 || a.freed) continue;
    c.alloc = id;
    if (a.owner == process_) {
      c.ok = false;
      return InvalidArgument("OpenMemory: allocation " + std::to_string(id) +
                             " was exported by this process (cudaErrorInvalidContext)");
    }
    void* p = reinterpret_cast<void*>(base);
    auto& m = mappings_[p];
    if (m.second++ == 0) {
      m.first = id;
      ++a.open_elsewhere;
      ++device_.live_mappings_;
    }
    return p;
  }
  c.ok = false;
  return InvalidArgument("OpenMemory: the handle names no live allocation");
}

Status FakeBackend::CloseMemory(void* base) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kCloseMemory)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kCloseMemory);
  auto it = mappings_.find(base);
  if (it == mappings_.end()) {
    c.ok = false;
    return InvalidArgument("CloseMemory of " + Hex(base) + ": not opened in this process");
  }
  c.alloc = it->second.first;
  if (--it->second.second == 0) {
    auto a = device_.allocations_.find(reinterpret_cast<uintptr_t>(base));
    if (a != device_.allocations_.end() && --a->second.open_elsewhere == 0 && a->second.freed) {
      AlignedDelete{}(a->second.bytes);  // freed under the importer (a violation): gone only now
      device_.allocations_.erase(a);
    }
    mappings_.erase(it);
    --device_.live_mappings_;
  }
  return Status::Ok();
}

Result<Event> FakeBackend::OpenEvent(const IpcEventHandle& handle) {
  std::lock_guard lock(device_.mu_);
  if (auto f = TakeFailureLocked(FakeOp::kOpenEvent)) return *f;
  FakeCall& c = device_.LogLocked(process_, FakeOp::kOpenEvent);
  const uint64_t id = DecodeHandle(kEventMagic, handle);
  auto it = device_.events_.find(id);
  if (id == 0 || it == device_.events_.end() || it->second.destroyed || !it->second.interprocess) {
    c.ok = false;
    return InvalidArgument("OpenEvent: the handle names no live interprocess event");
  }
  c.event = id;
  if (it->second.owner == process_) {
    c.ok = false;
    return InvalidArgument("OpenEvent: event " + std::to_string(id) +
                           " was exported by this process (cudaErrorInvalidContext)");
  }
  ++it->second.refs;
  void* h = reinterpret_cast<void*>(kEventTag | next_local_event_++);
  events_[h] = LocalEvent{id, true};
  ++device_.live_local_events_;
  return Event{h};
}

}  // namespace spdl::cuda
