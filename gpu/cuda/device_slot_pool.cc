#include "cuda/device_slot_pool.h"

#include <string>
#include <thread>

namespace spdl::cuda {
namespace {

std::string SlotName(uint32_t slot) { return "device slot " + std::to_string(slot); }

}  // namespace

const char* DeviceSlotStateName(DeviceSlotState state) {
  switch (state) {
    case DeviceSlotState::kFree:
      return "free";
    case DeviceSlotState::kCopying:
      return "copying";
    case DeviceSlotState::kReady:
      return "ready";
    case DeviceSlotState::kLeased:
      return "leased";
    case DeviceSlotState::kReleased:
      return "released";
  }
  return "unknown";
}

uint64_t DeviceSlotPool::DeviceBytes(uint64_t slot_stride, uint32_t num_slots) {
  const uint64_t total = slot_stride * num_slots;
  return (total + kDeviceSlotAlign - 1) / kDeviceSlotAlign * kDeviceSlotAlign;
}

DeviceSlotPool::DeviceSlotPool(DeviceBackend& backend, const DeviceSlotPoolOptions& options)
    : backend_(backend), options_(options), slots_(options.num_slots) {}

Result<std::unique_ptr<DeviceSlotPool>> DeviceSlotPool::Create(DeviceBackend& backend, const DeviceSlotPoolOptions& o) {
  if (o.host_base == nullptr || o.num_slots == 0 || o.slot_stride == 0) {
    return InvalidArgument("device slot pool: no host region, no slots or an empty slot");
  }
  if (o.copy_offset >= o.slot_stride) {
    return InvalidArgument("device slot pool: copy offset " + std::to_string(o.copy_offset) +
                           " is not inside the slot of " + std::to_string(o.slot_stride) + " bytes");
  }
  if (o.slot_stride % kDeviceSlotAlign != 0) {
    return InvalidArgument("device slot pool: slot stride " + std::to_string(o.slot_stride) +
                           " is not a multiple of 256");
  }
  if (o.slots_offset > o.host_bytes || (o.host_bytes - o.slots_offset) / o.slot_stride < o.num_slots) {
    return InvalidArgument("device slot pool: " + std::to_string(o.num_slots) + " slots of " +
                           std::to_string(o.slot_stride) + " bytes from offset " + std::to_string(o.slots_offset) +
                           " do not fit the host region of " + std::to_string(o.host_bytes) + " bytes");
  }
  std::unique_ptr<DeviceSlotPool> pool(new DeviceSlotPool(backend, o));
  const std::string where =
      "device slot pool on " + std::string(backend.name()) + " device " + std::to_string(backend.device());

  // In teardown order's reverse; on failure `pool` is destroyed and undoes what was made.
  if (o.register_host) {
    auto reg = RegisterHost(backend, o.host_base, o.host_bytes);
    if (!reg.ok()) return reg.status().WithPrefix(where + ": page-locking the host region");
    pool->host_registration_ = std::move(reg).value();
  }
  const uint64_t device_bytes = DeviceBytes(o.slot_stride, o.num_slots);
  auto buf = AllocDevice(backend, device_bytes);
  if (!buf.ok()) {
    return buf.status().WithPrefix(where + ": allocating " + std::to_string(device_bytes) + " bytes for " +
                                   std::to_string(o.num_slots) + " device slots");
  }
  pool->device_ = std::move(buf).value();
  auto stream = MakeStream(backend);
  if (!stream.ok()) return stream.status().WithPrefix(where + ": creating the copy stream");
  pool->stream_ = std::move(stream).value();
  for (uint32_t i = 0; i < o.num_slots; ++i) {
    auto ev = MakeEvent(backend, /*interprocess=*/true);
    if (!ev.ok()) return ev.status().WithPrefix(where + ": creating the ready event of slot " + std::to_string(i));
    pool->ready_events_.push_back(std::move(ev).value());
  }

  // Export once.
  CudaJobHandles& h = pool->handles_;
  h.device_index = backend.device();
  auto uuid = backend.Uuid();
  if (!uuid.ok()) return uuid.status().WithPrefix(where + ": reading the device UUID");
  h.device_uuid = *uuid;
  auto mem = backend.ExportMemory(pool->device_.get().ptr);
  if (!mem.ok()) return mem.status().WithPrefix(where + ": exporting the device slots");
  h.memory.push_back({*mem, device_bytes});
  h.slot_bytes = o.slot_stride;
  for (uint32_t i = 0; i < o.num_slots; ++i) {
    h.slots.push_back({0, uint64_t{i} * o.slot_stride});
    auto ev = backend.ExportEvent(pool->ready_events_[i].get());
    if (!ev.ok()) return ev.status().WithPrefix(where + ": exporting the ready event of slot " + std::to_string(i));
    h.ready_events.push_back(*ev);
  }
  return pool;
}

DeviceSlotPool::~DeviceSlotPool() { (void)Shutdown(); }

Status DeviceSlotPool::Shutdown() {
  if (shut_down_) return leaked_bytes_ ? Internal("device memory leaked") : Status::Ok();
  shut_down_ = true;
  Stop();
  Status result;
  Status query;
  if (!Drain(&query)) {
    leaked_bytes_ = device_.get().bytes;
    // Say what happened: a query that failed gave up at once; only a timeout waited drain_timeout.
    const std::string why =
        query.ok() ? "copies still queued after " + std::to_string(options_.drain_timeout.count()) + " ms (a hung GPU?)"
                   : "could not tell whether the queued copies have run (" + query.message() + ")";
    result = Internal("device slot pool on device " + std::to_string(backend_.device()) + ": " + why + "; leaking " +
                      std::to_string(leaked_bytes_) +
                      " bytes of device memory and the host registration rather than freeing them under a copy");
    backend_.ReportTeardownError(result);
    device_.release();
    host_registration_.release();
  }
  // In teardown order: consumer events (opened), ready events, stream, device memory, host
  // registration.
  {
    std::lock_guard lock(mu_);
    consumer_events_.clear();
  }
  ready_events_.clear();
  stream_.reset();
  device_.reset();
  host_registration_.reset();
  return result;
}

bool DeviceSlotPool::Drain(Status* query) {
  const auto deadline = std::chrono::steady_clock::now() + options_.drain_timeout;
  for (;;) {
    bool pending = false;
    {
      std::lock_guard lock(mu_);
      for (uint32_t i = 0; i < slots_.size(); ++i) {
        if (!slots_[i].copy_pending) continue;
        auto done = backend_.QueryEvent(ready_events_[i].get());
        if (done.ok() && *done) {
          slots_[i].copy_pending = false;
        } else {
          pending = true;
          if (!done.ok()) {
            // A failed query will not get better: stop waiting, and say why.
            *query = done.status().WithPrefix("querying the copy of " + SlotName(i));
            return false;
          }
        }
      }
    }
    if (!pending) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status DeviceSlotPool::CheckRange(uint32_t slot, const char* op) const {
  if (slot < options_.num_slots) return Status::Ok();
  return InvalidArgument(std::string(op) + " of " + SlotName(slot) + ": out of range (the pool has " +
                         std::to_string(options_.num_slots) + " slots)");
}

Status DeviceSlotPool::ImportConsumerEvents(const std::vector<IpcEventHandle>& done_events) {
  if (done_events.size() != options_.num_slots) {
    return InvalidArgument("consumer-done events: " + std::to_string(done_events.size()) + " for a pool of " +
                           std::to_string(options_.num_slots) + " slots");
  }
  std::lock_guard lock(mu_);
  if (imported_) return FailedPrecondition("consumer-done events were already imported for this job");
  if (stopped_) return FailedPrecondition("consumer-done events for a stopped pool");
  std::vector<EventHandle> opened;
  for (uint32_t i = 0; i < done_events.size(); ++i) {
    auto ev = OpenIpcEvent(backend_, done_events[i]);
    if (!ev.ok()) return ev.status().WithPrefix("opening the consumer-done event of " + SlotName(i));
    opened.push_back(std::move(ev).value());
  }
  consumer_events_ = std::move(opened);
  imported_ = true;
  return Status::Ok();
}

Status DeviceSlotPool::Submit(uint32_t slot, uint64_t bytes) {
  SPDL_RETURN_IF_ERROR(CheckRange(slot, "Submit"));
  if (bytes == 0) bytes = options_.slot_stride;
  if (bytes > options_.slot_stride) {
    return InvalidArgument("Submit of " + SlotName(slot) + ": " + std::to_string(bytes) + " bytes, the slot holds " +
                           std::to_string(options_.slot_stride));
  }
  std::lock_guard lock(mu_);
  if (stopped_) return FailedPrecondition("Submit of " + SlotName(slot) + ": the pool is stopped");
  Slot& s = slots_[slot];
  if (s.state != DeviceSlotState::kFree && s.state != DeviceSlotState::kReleased) {
    return FailedPrecondition("Submit of " + SlotName(slot) + ": the slot is " + DeviceSlotStateName(s.state) +
                              ", not free or released");
  }
  const Stream stream = stream_.get();
  if (s.state == DeviceSlotState::kReleased) {
    // The reuse rule: only once the client's last use of this slot has run (a host query; the
    // copy stream never waits on the client's event).
    SPDL_ASSIGN_OR_RETURN(bool done, ConsumerDoneLocked(slot));
    if (!done) {
      return FailedPrecondition("Submit of " + SlotName(slot) +
                                ": the client's consumer-done event for it has not completed yet");
    }
  }
  const auto* src =
      static_cast<const uint8_t*>(options_.host_base) + options_.slots_offset + uint64_t{slot} * options_.slot_stride;
  if (bytes > options_.copy_offset) {
    const uint64_t skip = options_.copy_offset;
    SPDL_RETURN_IF_ERROR(
        backend_.MemcpyH2DAsync(static_cast<uint8_t*>(device_slot(slot)) + skip, src + skip, bytes - skip, stream)
            .WithPrefix("Submit of " + SlotName(slot) + ": copying to the device"));
  }
  SPDL_RETURN_IF_ERROR(backend_.RecordEvent(ready_events_[slot].get(), stream)
                           .WithPrefix("Submit of " + SlotName(slot) + ": recording its ready event"));
  s.state = DeviceSlotState::kCopying;
  s.copy_pending = true;
  ++s.copies;
  return Status::Ok();
}

Status DeviceSlotPool::Lease(uint32_t slot, uint64_t generation) {
  SPDL_RETURN_IF_ERROR(CheckRange(slot, "Lease"));
  std::lock_guard lock(mu_);
  Slot& s = slots_[slot];
  if (s.state != DeviceSlotState::kCopying && s.state != DeviceSlotState::kReady) {
    return InvalidArgument("Lease of " + SlotName(slot) + ": the slot is " + DeviceSlotStateName(s.state) +
                           ", not copying or ready");
  }
  if (generation <= last_generation_) {
    return InvalidArgument("Lease of " + SlotName(slot) + ": generation " + std::to_string(generation) +
                           " is not newer than " + std::to_string(last_generation_));
  }
  last_generation_ = generation;
  s.state = DeviceSlotState::kLeased;
  s.generation = generation;
  return Status::Ok();
}

Status DeviceSlotPool::Release(uint32_t slot, uint64_t generation) {
  SPDL_RETURN_IF_ERROR(CheckRange(slot, "Release"));
  std::lock_guard lock(mu_);
  Slot& s = slots_[slot];
  if (s.state != DeviceSlotState::kLeased) {
    return InvalidArgument("Release of " + SlotName(slot) + " generation " + std::to_string(generation) +
                           ": the slot is " + DeviceSlotStateName(s.state) + ", not leased");
  }
  if (s.generation != generation) {
    return InvalidArgument("Release of " + SlotName(slot) + ": stale generation " + std::to_string(generation) +
                           " (the lease is generation " + std::to_string(s.generation) + ")");
  }
  s.state = DeviceSlotState::kReleased;
  s.generation = 0;
  return Status::Ok();
}

uint32_t DeviceSlotPool::ReleaseAll() {
  std::lock_guard lock(mu_);
  uint32_t n = 0;
  for (Slot& s : slots_) {
    if (s.state != DeviceSlotState::kLeased) continue;
    s.state = DeviceSlotState::kReleased;
    s.generation = 0;
    ++n;
  }
  return n;
}

Result<bool> DeviceSlotPool::ConsumerDone(uint32_t slot) {
  SPDL_RETURN_IF_ERROR(CheckRange(slot, "ConsumerDone"));
  std::lock_guard lock(mu_);
  return ConsumerDoneLocked(slot);
}

Result<bool> DeviceSlotPool::ConsumerDoneLocked(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.state != DeviceSlotState::kReleased) return s.state == DeviceSlotState::kFree;
  if (stopped_) return FailedPrecondition(SlotName(slot) + ": the pool is stopped");
  if (consumer_events_.empty()) {
    return FailedPrecondition(SlotName(slot) +
                              " was released but the client's consumer-done events are not imported yet, so "
                              "its reuse cannot be ordered");
  }
  SPDL_ASSIGN_OR_RETURN(bool done, backend_.QueryEvent(consumer_events_[slot].get()));
  if (done) s.state = DeviceSlotState::kFree;
  return done;
}

Result<bool> DeviceSlotPool::HostSlotReusable(uint32_t slot) {
  SPDL_RETURN_IF_ERROR(CheckRange(slot, "HostSlotReusable"));
  std::lock_guard lock(mu_);
  Slot& s = slots_[slot];
  if (!s.copy_pending) return true;
  SPDL_ASSIGN_OR_RETURN(bool done, backend_.QueryEvent(ready_events_[slot].get()));
  if (done) {
    s.copy_pending = false;
    if (s.state == DeviceSlotState::kCopying) s.state = DeviceSlotState::kReady;
  }
  return done;
}

Status DeviceSlotPool::WaitHostSlotReusable(uint32_t slot) {
  SPDL_RETURN_IF_ERROR(CheckRange(slot, "WaitHostSlotReusable"));
  Event ev;
  uint64_t copies = 0;
  {
    std::lock_guard lock(mu_);
    const Slot& s = slots_[slot];
    if (!s.copy_pending) return Status::Ok();
    ev = ready_events_[slot].get();
    copies = s.copies;
  }
  // Blocks without the lock. A Submit of this slot cannot race with us: the host slot is not
  // filled (we are about to refill it), so nobody submits it meanwhile.
  SPDL_RETURN_IF_ERROR(backend_.SynchronizeEvent(ev).WithPrefix("waiting for the copy of " + SlotName(slot) +
                                                                " to finish reading the host slot"));
  std::lock_guard lock(mu_);
  Slot& s = slots_[slot];
  if (s.copies == copies) {
    s.copy_pending = false;
    if (s.state == DeviceSlotState::kCopying) s.state = DeviceSlotState::kReady;
  }
  return Status::Ok();
}

Status DeviceSlotPool::Poll() {
  std::lock_guard lock(mu_);
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.copy_pending) {
      SPDL_ASSIGN_OR_RETURN(bool done, backend_.QueryEvent(ready_events_[i].get()));
      if (done) {
        s.copy_pending = false;
        if (s.state == DeviceSlotState::kCopying) s.state = DeviceSlotState::kReady;
      }
    }
    if (s.state == DeviceSlotState::kReleased && !consumer_events_.empty() && !stopped_) {
      SPDL_ASSIGN_OR_RETURN(bool done, backend_.QueryEvent(consumer_events_[i].get()));
      if (done) s.state = DeviceSlotState::kFree;
    }
  }
  return Status::Ok();
}

void DeviceSlotPool::Stop() {
  std::lock_guard lock(mu_);
  stopped_ = true;
  // The client may destroy its consumer-done events once the job's end is confirmed: close our
  // handles of them now (cudaEventDestroy does not block), never after it destroyed them.
  consumer_events_.clear();
}

DeviceSlotPool::Counts DeviceSlotPool::counts() const {
  std::lock_guard lock(mu_);
  Counts c;
  for (const Slot& s : slots_) {
    switch (s.state) {
      case DeviceSlotState::kFree:
        ++c.free;
        break;
      case DeviceSlotState::kCopying:
        ++c.copying;
        break;
      case DeviceSlotState::kReady:
        ++c.ready;
        break;
      case DeviceSlotState::kLeased:
        ++c.leased;
        break;
      case DeviceSlotState::kReleased:
        ++c.released;
        break;
    }
  }
  return c;
}

DeviceSlotState DeviceSlotPool::state(uint32_t slot) const {
  std::lock_guard lock(mu_);
  return slots_[slot].state;
}

void* DeviceSlotPool::device_slot(uint32_t slot) const {
  return static_cast<uint8_t*>(device_.get().ptr) + uint64_t{slot} * options_.slot_stride;
}

Event DeviceSlotPool::consumer_event(uint32_t slot) const {
  std::lock_guard lock(mu_);
  return consumer_events_.empty() ? Event{} : consumer_events_[slot].get();
}

}  // namespace spdl::cuda
