// The shared-memory layout of a job's slot ring, computed the same way by the daemon and the
// client. Pure functions, safe from any thread.
//
// Region: [ header page (4 KiB) | slot 0 | slot 1 | ... | slot N-1 ]
// Slot:   [ tensor 0 | pad to 4 KiB | tensor 1 | pad to 4 KiB | ... ]
// Every tensor starts on a 4 KiB boundary so a slot can be page-locked and DMA'd as a whole, and a
// row of a tensor is written in place by the worker that decodes that sample.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spdl::proto {

inline constexpr uint64_t kPageBytes = 4096;
inline constexpr uint64_t kRegionMagic = 0x31444c4450535053ull;  // "SPSPDLD1", little-endian

// Written by the daemon at offset 0 of the region before the descriptor is passed on.
struct RegionHeader {
  uint64_t magic;
  uint32_t protocol_version;
  uint32_t num_slots;
  uint64_t slots_offset;
  uint64_t slot_stride;
  uint64_t region_bytes;
};
static_assert(sizeof(RegionHeader) <= kPageBytes);

constexpr uint64_t AlignUp(uint64_t n, uint64_t align = kPageBytes) { return (n + align - 1) / align * align; }

struct SlotLayout {
  std::vector<uint64_t> tensor_offsets;  // from the start of a slot
  uint64_t slots_offset = kPageBytes;
  uint64_t slot_stride = 0;
  uint64_t region_bytes = 0;
  uint32_t num_slots = 0;

  uint64_t SlotOffset(uint32_t slot) const { return slots_offset + uint64_t{slot} * slot_stride; }
};

// REQUIRES: num_slots > 0.
inline SlotLayout ComputeSlotLayout(const std::vector<uint64_t>& tensor_bytes, uint32_t num_slots) {
  SlotLayout l;
  uint64_t off = 0;
  for (uint64_t b : tensor_bytes) {
    l.tensor_offsets.push_back(off);
    off += AlignUp(b == 0 ? 1 : b);
  }
  l.slot_stride = off == 0 ? kPageBytes : off;
  l.num_slots = num_slots;
  l.region_bytes = l.slots_offset + l.slot_stride * num_slots;
  return l;
}

}  // namespace spdl::proto
