#include "spdl/cuda/client_copy.h"

#include <chrono>
#include <string>
#include <thread>

namespace spdl::client {
namespace {

std::string SlotName(uint32_t slot) { return "client device slot " + std::to_string(slot); }

}  // namespace

ClientCopyPool::ClientCopyPool(cuda::DeviceBackend& backend, const ClientCopyOptions& options)
    : backend_(backend), options_(options), slots_(options.num_slots) {}

Result<std::unique_ptr<ClientCopyPool>> ClientCopyPool::Create(cuda::DeviceBackend& backend,
                                                               const ClientCopyOptions& o) {
  if (o.region_base == nullptr || o.num_slots == 0 || o.slot_stride == 0 || o.slot_stride % 256 != 0) {
    return InvalidArgument(
        "client copy: no region, no slots, or a slot stride that is not a "
        "positive multiple of 256");
  }
  if (o.slots_offset > o.region_bytes || (o.region_bytes - o.slots_offset) / o.slot_stride < o.num_slots) {
    return InvalidArgument("client copy: " + std::to_string(o.num_slots) + " slots of " +
                           std::to_string(o.slot_stride) + " bytes do not fit the region of " +
                           std::to_string(o.region_bytes) + " bytes");
  }
  const std::string where =
      "client copy on " + std::string(backend.name()) + " device " + std::to_string(backend.device());
  std::unique_ptr<ClientCopyPool> p(new ClientCopyPool(backend, o));
  if (o.register_host) {
    auto reg = cuda::RegisterHost(backend, o.region_base, o.region_bytes);
    if (!reg.ok()) return reg.status().WithPrefix(where + ": page-locking the shared region");
    p->host_registration_ = std::move(reg).value();
  }
  auto buf = cuda::AllocDevice(backend, o.slot_stride * o.num_slots);
  if (!buf.ok()) return buf.status().WithPrefix(where + ": allocating the device slots");
  p->device_ = std::move(buf).value();
  auto stream = cuda::MakeStream(backend);
  if (!stream.ok()) return stream.status().WithPrefix(where + ": creating the copy stream");
  p->stream_ = std::move(stream).value();
  for (uint32_t i = 0; i < o.num_slots; ++i) {
    auto c = cuda::MakeEvent(backend, /*interprocess=*/false);
    if (!c.ok()) return c.status().WithPrefix(where + ": creating events");
    p->copied_.push_back(std::move(c).value());
    auto d = cuda::MakeEvent(backend, /*interprocess=*/false);
    if (!d.ok()) return d.status().WithPrefix(where + ": creating events");
    p->consumer_done_.push_back(std::move(d).value());
  }
  return p;
}

ClientCopyPool::~ClientCopyPool() { (void)Shutdown(); }

Status ClientCopyPool::Shutdown() {
  std::lock_guard lock(mu_);
  if (shut_down_) return leaked_ ? Unavailable("client copy: the device memory was leaked") : Status::Ok();
  shut_down_ = true;
  bool drained = true;
  // Every wait is a polled host query with one deadline: a hung kernel must not hang close().
  const auto deadline = std::chrono::steady_clock::now() + options_.teardown_timeout;
  auto wait = [&](cuda::Event ev, const std::string& what) {
    for (;;) {
      Result<bool> done = backend_.QueryEvent(ev);
      if (!done.ok()) {
        backend_.ReportTeardownError(done.status().WithPrefix(what));
        return false;
      }
      if (*done) return true;
      if (std::chrono::steady_clock::now() >= deadline) {
        backend_.ReportTeardownError(
            Unavailable(what + ": not done within " + std::to_string(options_.teardown_timeout.count()) + " ms"));
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  if (stream_.valid()) {
    auto fence = cuda::MakeEvent(backend_, /*interprocess=*/false);
    Status s = fence.ok() ? backend_.RecordEvent(fence->get(), stream_.get()) : fence.status();
    if (!s.ok()) {
      backend_.ReportTeardownError(s.WithPrefix("client copy: draining the copy stream"));
      drained = false;
    } else if (!wait(fence->get(), "client copy: draining the copy stream")) {
      drained = false;
      (void)fence->release();  // queued work may still record it: never destroyed
    }
  }
  for (uint32_t i = 0; i < slots_.size() && i < consumer_done_.size(); ++i) {
    Slot& sl = slots_[i];
    if (sl.held) {
      Status s = cuda::JoinStreams(backend_, sl.also, sl.stream);
      if (s.ok()) s = backend_.RecordEvent(consumer_done_[i].get(), sl.stream);
      if (s.ok()) sl.used = true;
      sl.held = false;
    }
    if (sl.used && drained && !wait(consumer_done_[i].get(), "waiting for the consumer of " + SlotName(i))) {
      drained = false;
    }
  }
  Status result;
  if (!drained) {
    // Work may still run on the device memory and read the host pages: leak both (and the caller
    // keeps the pages mapped) rather than free or unregister under it.
    leaked_ = true;
    result =
        Unavailable("client copy: queued GPU work never completed; leaking " + std::to_string(device_.get().bytes) +
                    " bytes of device memory and the host registration (the region stays mapped)");
    backend_.ReportTeardownError(result);
    device_.release();
    host_registration_.release();
  }
  // In teardown order: events, stream, device memory, host registration.
  consumer_done_.clear();
  copied_.clear();
  stream_.reset();
  device_.reset();
  host_registration_.reset();
  return result;
}

Result<void*> ClientCopyPool::Acquire(uint32_t slot, uint64_t generation, uint64_t bytes,
                                      std::optional<cuda::Stream> stream) {
  if (slot >= options_.num_slots) {
    return InvalidArgument("Acquire of " + SlotName(slot) + ": out of range");
  }
  if (bytes == 0) bytes = options_.slot_stride;
  if (bytes > options_.slot_stride) {
    return InvalidArgument("Acquire of " + SlotName(slot) + ": " + std::to_string(bytes) + " bytes, the slot holds " +
                           std::to_string(options_.slot_stride));
  }
  const cuda::Stream consumer = stream.value_or(options_.consumer_stream);
  std::lock_guard lock(mu_);
  Slot& s = slots_[slot];
  if (s.held) {
    return FailedPrecondition("Acquire of " + SlotName(slot) + ": still held under generation " +
                              std::to_string(s.generation));
  }
  const std::string what = "Acquire of " + SlotName(slot);
  if (s.used) {
    SPDL_RETURN_IF_ERROR(backend_.StreamWaitEvent(stream_.get(), consumer_done_[slot].get())
                             .WithPrefix(what + ": waiting for the previous consumer"));
  }
  const auto* src =
      static_cast<const uint8_t*>(options_.region_base) + options_.slots_offset + uint64_t{slot} * options_.slot_stride;
  void* dst = slot_data(slot);
  SPDL_RETURN_IF_ERROR(backend_.MemcpyH2DAsync(dst, src, bytes, stream_.get()).WithPrefix(what + ": copying"));
  SPDL_RETURN_IF_ERROR(backend_.RecordEvent(copied_[slot].get(), stream_.get()).WithPrefix(what + ": recording"));
  SPDL_RETURN_IF_ERROR(
      backend_.StreamWaitEvent(consumer, copied_[slot].get()).WithPrefix(what + ": making the consumer wait"));
  s.held = true;
  s.generation = generation;
  s.stream = consumer;
  return dst;
}

Status ClientCopyPool::Release(uint32_t slot, uint64_t generation, std::optional<cuda::Stream> stream) {
  if (slot >= options_.num_slots) {
    return InvalidArgument("Release of " + SlotName(slot) + ": out of range");
  }
  cuda::Event copied;
  {
    std::lock_guard lock(mu_);
    Slot& s = slots_[slot];
    if (!s.held) return InvalidArgument("Release of " + SlotName(slot) + ": not held");
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
    SPDL_RETURN_IF_ERROR(backend_.RecordEvent(consumer_done_[slot].get(), final_stream)
                             .WithPrefix("Release of " + SlotName(slot) + ": recording consumer-done"));
    s.also.clear();
    s.held = false;
    s.used = true;
    copied = copied_[slot].get();
  }
  // The daemon refills the host slot once told; the copy must have finished reading it. Normally
  // it has long since; block (without the lock) only if not.
  SPDL_ASSIGN_OR_RETURN(bool done, backend_.QueryEvent(copied));
  if (!done) {
    SPDL_RETURN_IF_ERROR(backend_.SynchronizeEvent(copied).WithPrefix(
        "Release of " + SlotName(slot) + ": waiting for the copy to finish reading the host slot"));
  }
  return Status::Ok();
}

Status ClientCopyPool::WaitReady(uint32_t slot, cuda::Stream stream) {
  std::lock_guard lock(mu_);
  if (slot >= slots_.size() || !slots_[slot].held)
    return InvalidArgument("WaitReady of " + SlotName(slot) + ": not held");
  return backend_.StreamWaitEvent(stream, copied_[slot].get()).WithPrefix("WaitReady of " + SlotName(slot));
}

Status ClientCopyPool::SetReleaseStream(uint32_t slot, cuda::Stream stream) {
  std::lock_guard lock(mu_);
  if (slot >= slots_.size() || !slots_[slot].held) {
    return InvalidArgument("SetReleaseStream of " + SlotName(slot) + ": not held");
  }
  Slot& s = slots_[slot];
  if (s.stream != stream) s.also.push_back(s.stream);
  s.stream = stream;
  return Status::Ok();
}

void* ClientCopyPool::slot_data(uint32_t slot) const {
  return static_cast<uint8_t*>(device_.get().ptr) + uint64_t{slot} * options_.slot_stride;
}

bool ClientCopyPool::held(uint32_t slot) const {
  std::lock_guard lock(mu_);
  return slot < slots_.size() && slots_[slot].held;
}

}  // namespace spdl::client
