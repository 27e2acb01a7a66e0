#include "jobs/job_region.h"

#include <string>

#include "proto/framing.h"

namespace spdl::jobs {

Result<shm::SharedRegion> CreateJobRegion(uint64_t job_id, const proto::SlotLayout& layout, size_t reserve_bytes) {
  SPDL_ASSIGN_OR_RETURN(shm::SharedRegion region, shm::SharedRegion::Create("spdld-job-" + std::to_string(job_id),
                                                                            layout.region_bytes, reserve_bytes));
  auto* header = reinterpret_cast<proto::RegionHeader*>(region.data());
  header->magic = proto::kRegionMagic;
  header->protocol_version = proto::kProtocolVersion;
  header->num_slots = layout.num_slots;
  header->slots_offset = layout.slots_offset;
  header->slot_stride = layout.slot_stride;
  header->region_bytes = layout.region_bytes;
  return region;
}

void DescribeSlots(const proto::SlotLayout& layout, const std::vector<RowTensor>& tensors, uint32_t batch,
                   proto::JobAccepted* accepted) {
  proto::JobAccepted& a = *accepted;
  a.set_num_slots(layout.num_slots);
  a.set_slots_offset(layout.slots_offset);
  a.set_slot_stride(layout.slot_stride);
  a.set_region_bytes(layout.region_bytes);
  a.set_batch_size(batch);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const RowTensor& t = tensors[i];
    auto* out = a.add_tensors();
    out->set_name(t.name);
    out->set_dtype(t.dtype);
    out->add_shape(batch);
    for (int64_t d : t.row_shape) out->add_shape(d);
    out->set_offset(layout.tensor_offsets[i]);
    out->set_bytes(uint64_t{batch} * t.row_bytes);
  }
}

}  // namespace spdl::jobs
