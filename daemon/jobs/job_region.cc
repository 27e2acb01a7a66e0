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

// One stage's totals and window figures as the control channel carries them.
void FillStageStats(const pipeline::StageSnapshot& total, const pipeline::StageSnapshot& window, double seconds,
                    double window_seconds, proto::StageStats* out) {
  out->set_name(total.name);
  out->set_tasks(total.tasks);
  out->set_failures(total.failures);
  out->set_busy_seconds(total.busy_seconds);
  out->set_kind(pipeline::StageKindName(total.kind));
  out->set_concurrency(total.concurrency);
  out->set_queue_capacity(total.queue_capacity);
  out->set_queue_length(total.queue_length);
  out->set_running(total.running);
  out->set_avg_ms(total.AvgSeconds() * 1e3);
  out->set_p50_ms(total.PercentileSeconds(0.5) * 1e3);
  out->set_p90_ms(total.PercentileSeconds(0.9) * 1e3);
  out->set_p99_ms(total.PercentileSeconds(0.99) * 1e3);
  out->set_put_wait_seconds(total.put_wait_seconds);
  out->set_get_wait_seconds(total.get_wait_seconds);
  out->set_items_per_s(seconds > 0 ? static_cast<double>(total.tasks) / seconds : 0);
  out->set_window_seconds(window_seconds);
  out->set_window_tasks(window.tasks);
  out->set_window_failures(window.failures);
  out->set_window_avg_ms(window.AvgSeconds() * 1e3);
  out->set_window_p50_ms(window.PercentileSeconds(0.5) * 1e3);
  out->set_window_p90_ms(window.PercentileSeconds(0.9) * 1e3);
  out->set_window_p99_ms(window.PercentileSeconds(0.99) * 1e3);
  out->set_window_put_wait_seconds(window.put_wait_seconds);
  out->set_window_get_wait_seconds(window.get_wait_seconds);
  out->set_window_items_per_s(window_seconds > 0 ? static_cast<double>(window.tasks) / window_seconds : 0);
  for (uint64_t n : total.histogram) out->add_task_histogram(n);
}

}  // namespace spdl::jobs
