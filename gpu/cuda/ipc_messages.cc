#include "cuda/ipc_messages.h"

#include <cstring>
#include <string>

#include "proto/control.pb.h"

namespace spdl::cuda {
namespace {

template <typename H>
std::string ToBytes(const H& h) {
  return std::string(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size());
}

template <typename H>
Status FromBytes(const std::string& s, const std::string& what, H* out) {
  if (s.size() != out->bytes.size()) {
    return InvalidArgument(what + " is " + std::to_string(s.size()) + " bytes, expected " +
                           std::to_string(out->bytes.size()));
  }
  std::memcpy(out->bytes.data(), s.data(), s.size());
  return Status::Ok();
}

Status CountIs(int got, uint32_t want, const char* what) {
  if (got == static_cast<int>(want)) return Status::Ok();
  return InvalidArgument(std::string(what) + ": " + std::to_string(got) + " entries for a job of " +
                         std::to_string(want) + " slots");
}

}  // namespace

void BuildCudaHandles(const CudaJobHandles& h, proto::CudaHandles* out) {
  out->Clear();
  out->set_device_index(static_cast<uint32_t>(h.device_index));
  out->set_device_uuid(std::string(reinterpret_cast<const char*>(h.device_uuid.data()), h.device_uuid.size()));
  for (const auto& m : h.memory) {
    out->add_memory_handles(ToBytes(m.handle));
    out->add_memory_bytes(m.bytes);
  }
  for (const auto& s : h.slots) {
    out->add_slot_memory(s.memory);
    out->add_slot_offsets(s.offset);
  }
  out->set_slot_bytes(h.slot_bytes);
  for (const auto& e : h.ready_events) out->add_ready_events(ToBytes(e));
}

Result<CudaJobHandles> ParseCudaHandles(const proto::CudaHandles& msg, uint32_t num_slots, uint64_t slot_bytes) {
  const std::string prefix = "CudaHandles";
  CudaJobHandles h;
  h.device_index = static_cast<int>(msg.device_index());
  if (msg.device_uuid().size() != h.device_uuid.size()) {
    return InvalidArgument(prefix + ": device_uuid is " + std::to_string(msg.device_uuid().size()) +
                           " bytes, expected 16");
  }
  std::memcpy(h.device_uuid.data(), msg.device_uuid().data(), h.device_uuid.size());

  if (msg.memory_handles_size() == 0) return InvalidArgument(prefix + ": no memory handles");
  if (msg.memory_bytes_size() != msg.memory_handles_size()) {
    return InvalidArgument(prefix + ": " + std::to_string(msg.memory_handles_size()) + " memory handles but " +
                           std::to_string(msg.memory_bytes_size()) + " sizes");
  }
  for (int i = 0; i < msg.memory_handles_size(); ++i) {
    CudaJobHandles::Memory m;
    SPDL_RETURN_IF_ERROR(FromBytes(msg.memory_handles(i), prefix + ": memory handle " + std::to_string(i), &m.handle));
    m.bytes = msg.memory_bytes(i);
    h.memory.push_back(m);
  }

  if (slot_bytes == 0 || msg.slot_bytes() != slot_bytes) {
    return InvalidArgument(prefix + ": slot_bytes " + std::to_string(msg.slot_bytes()) +
                           ", expected the job's slot stride " + std::to_string(slot_bytes));
  }
  h.slot_bytes = slot_bytes;
  SPDL_RETURN_IF_ERROR(CountIs(msg.slot_memory_size(), num_slots, "CudaHandles: slot_memory"));
  SPDL_RETURN_IF_ERROR(CountIs(msg.slot_offsets_size(), num_slots, "CudaHandles: slot_offsets"));
  SPDL_RETURN_IF_ERROR(CountIs(msg.ready_events_size(), num_slots, "CudaHandles: ready_events"));
  for (uint32_t i = 0; i < num_slots; ++i) {
    const std::string slot = prefix + ": slot " + std::to_string(i);
    CudaJobHandles::Slot s{msg.slot_memory(static_cast<int>(i)), msg.slot_offsets(static_cast<int>(i))};
    if (s.memory >= h.memory.size()) {
      return InvalidArgument(slot + " names memory handle " + std::to_string(s.memory) + " of " +
                             std::to_string(h.memory.size()));
    }
    const uint64_t mem_bytes = h.memory[s.memory].bytes;
    if (s.offset % kDeviceSlotAlign != 0) {
      return InvalidArgument(slot + ": offset " + std::to_string(s.offset) + " is not 256-byte aligned");
    }
    if (s.offset > mem_bytes || mem_bytes - s.offset < slot_bytes) {
      return InvalidArgument(slot + ": [" + std::to_string(s.offset) + ", +" + std::to_string(slot_bytes) +
                             ") lies outside its allocation of " + std::to_string(mem_bytes) + " bytes");
    }
    h.slots.push_back(s);
    IpcEventHandle e;
    SPDL_RETURN_IF_ERROR(FromBytes(msg.ready_events(static_cast<int>(i)), slot + ": ready event", &e));
    h.ready_events.push_back(e);
  }
  return h;
}

void BuildCudaConsumerEvents(const std::vector<IpcEventHandle>& done_events, proto::CudaConsumerEvents* out) {
  out->Clear();
  for (const auto& e : done_events) out->add_done_events(ToBytes(e));
}

Result<std::vector<IpcEventHandle>> ParseCudaConsumerEvents(const proto::CudaConsumerEvents& msg, uint32_t num_slots) {
  SPDL_RETURN_IF_ERROR(CountIs(msg.done_events_size(), num_slots, "CudaConsumerEvents: done_events"));
  std::vector<IpcEventHandle> out(num_slots);
  for (uint32_t i = 0; i < num_slots; ++i) {
    SPDL_RETURN_IF_ERROR(FromBytes(msg.done_events(static_cast<int>(i)),
                                   "CudaConsumerEvents: slot " + std::to_string(i) + " event", &out[i]));
  }
  return out;
}

}  // namespace spdl::cuda
