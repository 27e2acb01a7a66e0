#include "spdl/cuda/device_slot_view.h"

#include <chrono>
#include <string>
#include <thread>

namespace spdl::client {
namespace {

std::string SlotName(uint32_t slot) { return "device slot " + std::to_string(slot); }

}  // namespace

DeviceSlotView::DeviceSlotView(cuda::DeviceBackend& backend, cuda::Stream consumer_stream)
    : backend_(backend), consumer_stream_(consumer_stream) {}

Result<std::unique_ptr<DeviceSlotView>> DeviceSlotView::Open(cuda::DeviceBackend& backend,
                                                             const cuda::CudaJobHandles& h,
                                                             cuda::Stream consumer_stream) {
  const std::string where = "opening the job's device slots on " + std::string(backend.name()) + " device " +
                            std::to_string(backend.device());
  SPDL_ASSIGN_OR_RETURN(cuda::DeviceUuid uuid, backend.Uuid());
  if (uuid != h.device_uuid) {
    return FailedPrecondition(where + ": it is " + cuda::FormatUuid(uuid) + ", but the daemon delivers on " +
                              cuda::FormatUuid(h.device_uuid) + " (its cuda:" + std::to_string(h.device_index) +
                              "); send this GPU's UUID with the job (GpuLoader::Open does when it knows the "
                              "device) or name the device whose UUID that is");
  }
  if (h.slots.size() != h.ready_events.size() || h.slots.empty()) {
    return InvalidArgument(where + ": " + std::to_string(h.slots.size()) + " slots but " +
                           std::to_string(h.ready_events.size()) + " ready events");
  }
  std::unique_ptr<DeviceSlotView> v(new DeviceSlotView(backend, consumer_stream));
  v->slot_bytes_ = h.slot_bytes;
  // On any failure `v` is destroyed and undoes what was opened, in teardown order.
  for (size_t i = 0; i < h.memory.size(); ++i) {
    auto m = cuda::OpenIpcMemory(backend, h.memory[i].handle);
    if (!m.ok()) return m.status().WithPrefix(where + ": memory handle " + std::to_string(i));
    v->mappings_.push_back(std::move(m).value());
  }
  const auto n = static_cast<uint32_t>(h.slots.size());
  for (uint32_t i = 0; i < n; ++i) {
    const auto& s = h.slots[i];
    if (s.memory >= v->mappings_.size()) {
      return InvalidArgument(where + ": " + SlotName(i) + " names a missing memory handle");
    }
    v->slot_data_.push_back(static_cast<uint8_t*>(v->mappings_[s.memory].get()) + s.offset);
    auto ready = cuda::OpenIpcEvent(backend, h.ready_events[i]);
    if (!ready.ok()) return ready.status().WithPrefix(where + ": ready event of " + SlotName(i));
    v->ready_events_.push_back(std::move(ready).value());
    auto done = cuda::MakeEvent(backend, /*interprocess=*/true);
    if (!done.ok()) return done.status().WithPrefix(where + ": consumer-done event of " + SlotName(i));
    auto exported = backend.ExportEvent(done->get());
    if (!exported.ok()) {
      return exported.status().WithPrefix(where + ": exporting the consumer-done event of " + SlotName(i));
    }
    v->done_events_.push_back(std::move(done).value());
    v->done_handles_.push_back(*exported);
  }
  v->slots_.resize(n);
  return v;
}

DeviceSlotView::~DeviceSlotView() {
  Detach();
  std::lock_guard lock(mu_);
  done_events_.clear();
}

void DeviceSlotView::Detach() {
  std::lock_guard lock(mu_);
  if (detached_) return;
  detached_ = true;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.held) {
      // The trainer still holds the batch: order the teardown after whatever it queued on it.
      Status st = cuda::JoinStreams(backend_, s.also, s.stream);
      if (st.ok()) st = backend_.RecordEvent(done_events_[i].get(), s.stream);
      if (st.ok())
        s.done_recorded = true;
      else
        backend_.ReportTeardownError(st.WithPrefix("recording consumer-done of " + SlotName(i)));
      s.held = false;
    }
  }
  // Wait for the trainer's queued work on the slots: polled, bounded (a host wait without deadline
  // hangs the trainer's close() when its work waits behind a dead daemon's ready event).
  const auto deadline = std::chrono::steady_clock::now() + detach_timeout_;
  bool drained = true;
  for (uint32_t i = 0; i < slots_.size() && drained; ++i) {
    if (!slots_[i].done_recorded) continue;
    for (;;) {
      Result<bool> done = backend_.QueryEvent(done_events_[i].get());
      if (!done.ok()) {
        backend_.ReportTeardownError(done.status().WithPrefix("waiting for the consumer of " + SlotName(i)));
        drained = false;
        break;
      }
      if (*done) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        drained = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  if (!drained) {
    backend_.ReportTeardownError(
        Unavailable("the trainer's GPU work on the device slots did not complete within " +
                    std::to_string(detach_timeout_.count()) +
                    " ms (spdld died with a copy queued?): leaking the IPC mapping and the ready events rather than "
                    "closing them under queued work"));
    for (auto& m : mappings_) (void)m.release();
    for (auto& e : ready_events_) (void)e.release();
  }
  // Then, by member order: ready events (opened), mappings. The consumer-done events stay.
  ready_events_.clear();
  mappings_.clear();
}

Result<void*> DeviceSlotView::Acquire(uint32_t slot, uint64_t generation, std::optional<cuda::Stream> stream) {
  if (slot >= slot_data_.size()) {
    return InvalidArgument("Acquire of " + SlotName(slot) + ": out of range (" + std::to_string(slot_data_.size()) +
                           " slots)");
  }
  const cuda::Stream st = stream.value_or(consumer_stream_);
  std::lock_guard lock(mu_);
  if (detached_) return FailedPrecondition("Acquire of " + SlotName(slot) + ": the view is detached");
  Slot& s = slots_[slot];
  if (s.held) {
    return FailedPrecondition("Acquire of " + SlotName(slot) + " generation " + std::to_string(generation) +
                              ": still held under generation " + std::to_string(s.generation));
  }
  SPDL_RETURN_IF_ERROR(backend_.StreamWaitEvent(st, ready_events_[slot].get())
                           .WithPrefix("Acquire of " + SlotName(slot) + ": waiting for its copy"));
  s.held = true;
  s.generation = generation;
  s.stream = st;
  return slot_data_[slot];
}

Status DeviceSlotView::Release(uint32_t slot, uint64_t generation, std::optional<cuda::Stream> stream) {
  if (slot >= slot_data_.size()) {
    return InvalidArgument("Release of " + SlotName(slot) + ": out of range (" + std::to_string(slot_data_.size()) +
                           " slots)");
  }
  std::lock_guard lock(mu_);
  Slot& s = slots_[slot];
  if (!s.held) {
    return InvalidArgument("Release of " + SlotName(slot) + " generation " + std::to_string(generation) + ": not held");
  }
  if (s.generation != generation) {
    return InvalidArgument("Release of " + SlotName(slot) + ": stale generation " + std::to_string(generation) +
                           " (held under " + std::to_string(s.generation) + ")");
  }
  const cuda::Stream final_stream = stream.value_or(s.stream);
  std::vector<cuda::Stream> streams = s.also;
  streams.push_back(s.stream);
  // Consumer-done covers the work on every stream the batch was used on, not only the last.
  SPDL_RETURN_IF_ERROR(cuda::JoinStreams(backend_, streams, final_stream)
                           .WithPrefix("Release of " + SlotName(slot) + ": joining its streams"));
  SPDL_RETURN_IF_ERROR(backend_.RecordEvent(done_events_[slot].get(), final_stream)
                           .WithPrefix("Release of " + SlotName(slot) + ": recording consumer-done"));
  s.also.clear();
  s.held = false;
  s.done_recorded = true;
  return Status::Ok();
}

Status DeviceSlotView::WaitReady(uint32_t slot, cuda::Stream stream) {
  std::lock_guard lock(mu_);
  if (slot >= slots_.size() || !slots_[slot].held || detached_) {
    return InvalidArgument("WaitReady of " + SlotName(slot) + ": not held");
  }
  return backend_.StreamWaitEvent(stream, ready_events_[slot].get()).WithPrefix("WaitReady of " + SlotName(slot));
}

Status DeviceSlotView::SetReleaseStream(uint32_t slot, cuda::Stream stream) {
  std::lock_guard lock(mu_);
  if (slot >= slots_.size() || !slots_[slot].held) {
    return InvalidArgument("SetReleaseStream of " + SlotName(slot) + ": not held");
  }
  Slot& s = slots_[slot];
  if (s.stream != stream) s.also.push_back(s.stream);
  s.stream = stream;
  return Status::Ok();
}

void* DeviceSlotView::slot_data(uint32_t slot) const { return slot_data_.at(slot); }

bool DeviceSlotView::held(uint32_t slot) const {
  std::lock_guard lock(mu_);
  return slot < slots_.size() && slots_[slot].held;
}

}  // namespace spdl::client
