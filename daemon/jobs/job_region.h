// What every job with slots of row tensors shares (MediaJob, StreamJob): the shared region with its
// header written, the JobAccepted fields that describe its slots and tensors, and a stage's figures
// as JobStats carries them. One place, so the two kinds of job cannot drift apart in what the
// client maps or what spdlctl and /metrics show.
//
// Plain functions of their arguments: safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "jobs/sample_decoder.h"
#include "pipeline/stage_stats.h"
#include "proto/control.pb.h"
#include "proto/shm_layout.h"
#include "shm/shared_region.h"

namespace spdl::jobs {

// The job's shared region ("spdld-job-<job_id>", layout.region_bytes), its header written; only
// the first `reserve_bytes` are reserved up front (SharedRegion::Create). Errors: Create's.
Result<shm::SharedRegion> CreateJobRegion(uint64_t job_id, const proto::SlotLayout& layout,
                                          size_t reserve_bytes = SIZE_MAX);

// Sets `accepted`'s slot fields from `layout` (and batch_size) and adds one tensor per `tensors`
// entry, shaped [batch, row_shape...] at the layout's offsets.
// REQUIRES: tensors.size() == layout.tensor_offsets.size(); accepted != nullptr.
void DescribeSlots(const proto::SlotLayout& layout, const std::vector<RowTensor>& tensors, uint32_t batch,
                   proto::JobAccepted* accepted);

// One stage's totals and window figures (`window` over the last `window_seconds`) as JobStats.stages
// carries them. REQUIRES: out != nullptr.
void FillStageStats(const pipeline::StageSnapshot& total, const pipeline::StageSnapshot& window, double seconds,
                    double window_seconds, proto::StageStats* out);

}  // namespace spdl::jobs
