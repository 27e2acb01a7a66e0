// The CUDA handles a GPU job exchanges once, in plain C++, and their control-channel form
// (proto/control.proto: CudaHandles daemon -> client, CudaConsumerEvents client -> daemon).
//
// Both directions live here because they are one contract, used by the daemon (DeviceSlotPool
// exports, reads the consumer events) and by the client (DeviceSlotView reads the handles, exports
// its consumer events). The parsers check everything a peer could get wrong — handle sizes, slot
// counts, indices, offsets inside their allocation — and report the first problem as
// kInvalidArgument, so a bad message closes the session instead of reaching the CUDA runtime.
//
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "cuda/device_backend.h"

namespace spdl::proto {
class CudaHandles;
class CudaConsumerEvents;
}  // namespace spdl::proto

namespace spdl::cuda {

// Device slots must start on this alignment (DLPack and CUDA kernels expect 256-byte alignment).
inline constexpr uint64_t kDeviceSlotAlign = 256;

// What the daemon exports for one job (DeviceSlotPool::Export).
struct CudaJobHandles {
  int device_index = 0;  // the daemon's ordinal (informational)
  DeviceUuid device_uuid{};
  struct Memory {
    IpcMemHandle handle;
    uint64_t bytes = 0;  // the allocation's size
  };
  std::vector<Memory> memory;  // one per device allocation
  struct Slot {
    uint32_t memory = 0;  // index into `memory`
    uint64_t offset = 0;  // of the device slot inside that allocation
  };
  std::vector<Slot> slots;                   // per slot
  uint64_t slot_bytes = 0;                   // bytes of one device slot
  std::vector<IpcEventHandle> ready_events;  // per slot
};

// Fills *out from `h` (clears it first).
void BuildCudaHandles(const CudaJobHandles& h, proto::CudaHandles* out);

// Reads and checks a CudaHandles for a job of `num_slots` slots whose slots hold `slot_bytes`
// (JobAccepted.num_slots and .slot_stride): every handle 64 bytes, the UUID 16, one slot entry and
// one ready event per slot, memory indices in range, each slot 256-byte aligned and inside its
// allocation, slot_bytes as expected.
Result<CudaJobHandles> ParseCudaHandles(const proto::CudaHandles& msg, uint32_t num_slots, uint64_t slot_bytes);

// Fills *out with the client's per-slot consumer-done events (clears it first).
void BuildCudaConsumerEvents(const std::vector<IpcEventHandle>& done_events, proto::CudaConsumerEvents* out);

// Reads and checks a CudaConsumerEvents for a job of `num_slots` slots: exactly one 64-byte handle
// per slot.
Result<std::vector<IpcEventHandle>> ParseCudaConsumerEvents(const proto::CudaConsumerEvents& msg, uint32_t num_slots);

}  // namespace spdl::cuda
